"""Routing traces (`colibri-cli --route-trace OUT`) and their replay under a
slot cache, so that slot counts and policies can be compared on the routing
a real prompt gives without running the model again (docs/STREAMING.md).

A trace is text: a first line `# colibri route trace: n_layers L n_experts E
top_k K`, then one line per MoE layer pass of colibri_infer (a layer and a
chunk of tokens, colibri_set_route_observer): the layer, then `expert:tokens`
for each expert the chunk routes to, in expert order.

`replay` runs the C runtime's slot cache over it step for step: moe.c's
run_streamed (a pass over the routed experts, which uses those already in a
slot, then the others fetched in expert order, the next one's slot chosen
while the read of this one is in flight: clb_plan.read_ahead) and
stream.c's stream_held, stream_fetch and victim (the clock, the use counts halved at 2^16, an empty slot first,
then COLIBRI_SLOTS_REUSE's least expected reuse per layer pass until its
layer comes again, COLIBRI_SLOTS_FREQ's least often chosen or
COLIBRI_SLOTS_LRU's least recently used). Its hits and reads are the runtime's own figures for the
same run (tests/test_stream.py holds them equal), so a change to either side
must change both.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .. import errors

POLICIES = ("reuse", "freq", "lru")   # the default first
_HEADER = re.compile(r"# colibri route trace: n_layers (\d+) n_experts (\d+) top_k (\d+)$")
_HALVE_AT = 65536   # stream.c count_use: every count halves when one reaches it
# COLIBRI_SLOTS_REUSE (stream.c clb_stream_route and reuse_value), in Q16:
_ONE = 1 << 16
_RECENT_ADD = 3 << 14        # 0.75: the recency register r = r/4 + 0.75 at a pick
_VISITS_HALVE_AT = 1 << 31   # a layer's visits and picks halve together there


@dataclasses.dataclass(frozen=True)
class Trace:
    n_layers: int
    n_experts: int
    top_k: int
    passes: tuple   # ((layer, ((expert, tokens), ...)), ...) in run order

    def tokens(self) -> int:
        """Tokens the traced run processed: those routed in the first MoE
        layer's passes, each routed to top_k experts."""
        if not self.passes:
            return 0
        first = min(layer for layer, _ in self.passes)
        routed = sum(c for layer, ex in self.passes if layer == first for _, c in ex)
        return routed // max(self.top_k, 1)


def read_trace(path) -> Trace:
    """Parse a trace file; a malformed line is a ConversionError naming it."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise errors.ConversionError(f"{path}: cannot read the route trace ({e})") from None
    m = _HEADER.match(lines[0]) if lines else None
    if not m:
        raise errors.ConversionError(f"{path}: not a route trace (colibri-cli --route-trace "
                                     "writes one): the first line is not its header")
    n_layers, n_experts, top_k = map(int, m.groups())
    passes = []
    for no, line in enumerate(lines[1:], start=2):
        fields = line.split()
        try:
            layer = int(fields[0])
            ex = tuple((int(e), int(c)) for e, c in (f.split(":") for f in fields[1:]))
        except (ValueError, IndexError):
            raise errors.ConversionError(f"{path}:{no}: expected 'layer expert:tokens ...', "
                                         f"got {line[:60]!r}") from None
        if not 0 <= layer < n_layers or any(not 0 <= e < n_experts or c < 1 for e, c in ex):
            raise errors.ConversionError(f"{path}:{no}: layer or expert out of range "
                                         f"(n_layers {n_layers}, n_experts {n_experts})")
        passes.append((layer, ex))
    return Trace(n_layers, n_experts, top_k, tuple(passes))


def replay(trace: Trace, slots: int, policy: str = "reuse") -> dict:
    """The slot cache of `slots` slots under `policy` over the trace, from
    empty: uses, hits, misses (reads) and evictions."""
    if policy not in POLICIES:
        raise errors.ConversionError(f"policy {policy!r}: choose from {', '.join(POLICIES)}")
    if slots < 1:
        raise errors.ConversionError("replay needs at least one slot")
    n_exp = trace.n_layers * trace.n_experts
    uses = [0] * n_exp
    where = [-1] * n_exp            # expert -> its slot
    held = [-1] * slots             # slot -> expert
    last = [0] * slots
    tick = hits = misses = evictions = 0
    L, E = trace.n_layers, trace.n_experts
    visits = [0] * L                # REUSE: passes of each layer
    picked = [0] * n_exp            # REUSE: passes that routed to the expert
    recent = [0] * n_exp            # REUSE: recency register, Q16

    def route(layer, routed):
        """stream.c clb_stream_route: the layer's pass, before any expert runs."""
        visits[layer] += 1
        chosen = {e for e, _ in routed}
        for e in range(E):
            i = layer * E + e
            recent[i] = (recent[i] >> 2) + (_RECENT_ADD if e in chosen else 0)
            picked[i] += e in chosen
        if visits[layer] >= _VISITS_HALVE_AT:
            visits[layer] //= 2
            for e in range(E):
                picked[layer * E + e] //= 2

    def reuse_value(i, layer):
        """(value, distance): expected reuse recent + picked/visits (Q16)
        over the layer passes until the expert's layer runs again."""
        m = i // E
        d = (m - layer) % L or L
        return recent[i] + picked[i] * _ONE // visits[m], d

    def count_use(i):
        uses[i] += 1
        if uses[i] >= _HALVE_AT:
            for j in range(n_exp):
                uses[j] //= 2

    def victim(layer, pending):
        best = None
        for s in range(slots):
            if s in pending:
                continue
            if held[s] < 0:
                return s
            if best is None:
                best = s
                continue
            if policy == "reuse":
                (va, da), (vb, db) = reuse_value(held[s], layer), reuse_value(held[best], layer)
                if va * db != vb * da:
                    if va * db < vb * da:
                        best = s
                    continue
            if policy == "freq":
                ua, ub = uses[held[s]], uses[held[best]]
                if ua != ub:
                    if ua < ub:
                        best = s
                    continue
            if last[s] < last[best]:
                best = s
        return best

    ahead = 2 if slots > 2 * trace.top_k else 1   # stream.c: clb_plan.read_ahead
    for layer, routed in trace.passes:
        if policy == "reuse":
            route(layer, routed)
        missing = []
        for e, _ in routed:             # moe.c run_streamed: the held ones
            i = layer * E + e
            tick += 1
            if where[i] >= 0:
                last[where[i]] = tick
                count_use(i)
                hits += 1
            else:
                missing.append(i)
        pending = []                    # slots of reads in flight, oldest first
        for k, i in enumerate(missing):  # fetched `ahead` before their take
            while len(pending) < ahead and k + len(pending) < len(missing):
                j = missing[k + len(pending)]
                tick += 1
                misses += 1
                count_use(j)
                s = victim(layer, pending)
                if held[s] >= 0:
                    where[held[s]] = -1
                    evictions += 1
                held[s], last[s], where[j] = j, tick, s
                pending.append(s)
            pending.pop(0)              # taken (and run)
    return {"uses": hits + misses, "hits": hits, "misses": misses, "evictions": evictions}
