"""`colibri plan FILE --ram SIZE`: what a streamed instance of a model holds
and reads (docs/STREAMING.md), computed by the C runtime itself (the
binding opens the model streamed: only the resident sections are read).

It prints what stays resident (by part), the arena (KV cache included), the
expert slots the budget gives and their share of the file's experts, the
bytes a token would read with uniform random routing, and, with --tokens,
what a greedy run of those tokens actually reads under each slot policy
(the same logits either way: only the reads differ), and with --trace, what
the routing of a recorded run (colibri-cli --route-trace) reads under each
policy, replayed without running the model (route_trace.py).
"""
from __future__ import annotations

import numpy as np

from .. import errors, runtime
from . import route_trace

PART_LABELS = {"embed": "embedding", "attn": "attention", "router": "router",
               "ffn": "shared/dense FFN", "norms": "norms", "lm_head": "LM head",
               "other": "other sections (desc, tokenizer)"}


def plan(path, ram=None, slots=None, kv="f32", library=None) -> dict:
    """The plan of `path` under a budget (or a slot count), as a dict."""
    with runtime.Model(path, ram=ram, slots=slots, kv=kv, library=library) as m:
        info, st, wb = m.info, m.stream_stats(), m.weight_bytes()
    s = info.shape
    out = {"file_bytes": info.file_size, "load": info.load_mode,
           "arena_bytes": info.arena_bytes, "kv_bytes": info.kv_bytes,
           "resident": {k: wb[k][0] for k in PART_LABELS}, **st}
    # (bytes, dtypes, tensors) per part; a streamed file's experts are SwiGLU
    # (W1, W3, W2: encoder-decoders do not stream)
    n_experts = wb["experts"][2] // 3
    moe_layers = n_experts // s.n_experts if s.n_experts else 0
    out.update(n_experts=n_experts, moe_layers=moe_layers, top_k=s.top_k,
               n_layers=s.n_layers, experts_per_layer=s.n_experts,
               expert_bytes=wb["experts"][0] / max(n_experts, 1))
    held = min(1.0, st["slots"] / n_experts) if st["slots"] and n_experts else 1.0
    # Uniform random routing: a use hits with the share of experts held.
    out["uniform_bytes_per_token"] = moe_layers * s.top_k * (1 - held) * out["expert_bytes"]
    out["held"] = held
    return out


def measure(path, tokens: list[int], steps: int, expert_bytes: float, ram=None, slots=None,
            library=None) -> dict:
    """A greedy run of `tokens` then `steps` decode steps under each policy:
    hits, reads and bytes per token (the logits are the same bits). Without
    the prefetch, so that the counts are the policy's alone (the replay's).
    bytes_per_token counts every expert a slot took in, at the file's mean
    expert size (expert_bytes, plan()'s) as the replay does: on a warm page cache a mapped file's
    experts are used where they are (`mapped` of the reads) and read no
    byte, so the bytes actually read (storage_bytes_per_token) depend on
    what the page cache held, not on the policy."""
    res = {}
    for policy in runtime.SLOT_POLICIES:
        with runtime.Model(path, ram=ram, slots=slots, policy=policy, library=library,
                           prefetch=0) as m:
            logits = m.infer([tokens])
            nxt = int(np.argmax(logits[0, -1]))
            for i in range(steps):
                logits = m.infer([[nxt]], n_past=len(tokens) + i)
                nxt = int(np.argmax(logits[0, -1]))
            st = m.stream_stats()
        uses = st["hits"] + st["misses"]
        n = len(tokens) + steps
        res[policy] = {"hit_rate": st["hits"] / uses if uses else 1.0,
                       "bytes_per_token": st["misses"] * expert_bytes / n,
                       "storage_bytes_per_token": st["bytes_read"] / n,
                       "reads": st["misses"], "mapped": st["mapped"]}
    return res


def replayed(trace_path, p: dict) -> dict:
    """The reads of a recorded routing under each policy with the slots of
    plan p (a trace of the same model's shape)."""
    tr = route_trace.read_trace(trace_path)
    if (tr.n_layers, tr.n_experts) != (p["n_layers"], p["experts_per_layer"]):
        raise errors.ConversionError(
            f"{trace_path}: a trace of {tr.n_layers} layers x {tr.n_experts} experts, the "
            f"model has {p['n_layers']} x {p['experts_per_layer']}: record it with this model")
    slots, expert_bytes = p["slots"], p["expert_bytes"]
    tokens = tr.tokens()
    res = {}
    for policy in route_trace.POLICIES:
        r = route_trace.replay(tr, slots, policy)
        res[policy] = {"hit_rate": r["hits"] / r["uses"] if r["uses"] else 1.0,
                       "reads": r["misses"], "tokens": tokens,
                       "bytes_per_token": r["misses"] * expert_bytes / max(tokens, 1)}
    return res


def _mb(n: float) -> str:
    """Bytes in the unit that shows them: 12.3 MB, 45.6 KB, 789 B."""
    return (f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB" if n >= 1e6
            else f"{n / 1e3:,.1f} KB" if n >= 1e3 else f"{n:.0f} B")


def cmd_plan(args) -> int:
    if args.ram is None and args.slots is None:
        raise errors.ConversionError("colibri plan: give --ram SIZE or --slots N")
    # the arguments are checked before the model is opened
    args.tokens = _token_ids(args.tokens) if args.tokens else None
    if args.steps < 0:
        raise errors.ConversionError(f"--steps {args.steps}: give 0 or more greedy steps")
    p = plan(args.model, ram=args.ram, slots=args.slots, kv=args.kv)
    # the trace is read (and refused) before anything is printed
    replay = replayed(args.trace, p) if args.trace and p["load"] == "stream" else {}
    print(f"{args.model}: {_mb(p['file_bytes'])}, {p['n_experts']} routed experts of "
          f"{_mb(p['expert_bytes'])} in {p['moe_layers']} layers, top-{p['top_k']}")
    if p["load"] != "stream":
        print(f"the budget holds the whole model: loaded all-resident ({p['load']}), "
              f"arena {_mb(p['arena_bytes'])}, nothing read during infer")
        return 0
    res = p["resident"]
    print(f"resident weights: {_mb(p['resident_bytes'])}")
    for key, label in PART_LABELS.items():
        if res[key]:
            print(f"  {label}: {_mb(res[key])}")
    print(f"arena (all the instance holds): {_mb(p['arena_bytes'])}, of which KV cache "
          f"{_mb(p['kv_bytes'])}")
    print(f"expert slots: {p['slots']} of {_mb(p['slot_bytes'])} (about "
          f"{p['slots'] / max(p['moe_layers'], 1):.1f} per MoE layer; {p['held']:.0%} of the "
          f"experts), policy {p['policy']}")
    print(f"reads per token, uniform random routing: {_mb(p['uniform_bytes_per_token'])} "
          f"({p['moe_layers'] * p['top_k'] * (1 - p['held']):.1f} experts)")
    print(f"prefetch: {p['prefetch']} experts a layer, predicted before its attention"
          if p["prefetch"] else "prefetch: none (it needs 2 x top_k + its count + 2 slots "
          "and the library's reader thread)")
    for policy, r in replay.items():
        print(f"replayed {args.trace} ({r['tokens']} tokens), policy {policy}: hit rate "
              f"{r['hit_rate']:.1%}, {_mb(r['bytes_per_token'])} read per token "
              f"({r['reads']} reads)")
    if args.tokens:
        for policy, r in measure(args.model, args.tokens, args.steps, p["expert_bytes"],
                                 ram=args.ram, slots=args.slots).items():
            warm = (f"; {r['mapped']} of them from the page cache, "
                    f"{_mb(r['storage_bytes_per_token'])} a token read from storage"
                    if r["mapped"] else "")
            print(f"measured, {len(args.tokens)} tokens + {args.steps} greedy steps, policy "
                  f"{policy}: hit rate {r['hit_rate']:.1%}, {_mb(r['bytes_per_token'])} "
                  f"read per token ({r['reads']} reads{warm})")
    return 0


def _token_ids(text: str) -> list[int]:
    """--tokens: comma-separated ids (the model checks their range)."""
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        raise errors.ConversionError(
            f"--tokens {text!r}: give comma-separated token ids, e.g. 1,2,3") from None
    return ids


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="what a streamed model holds resident and reads "
                       "within a memory budget (docs/STREAMING.md)")
    p.add_argument("model", help="a .colibri file")
    p.add_argument("--ram", help="the budget: bytes, or 512M, 2G")
    p.add_argument("--slots", type=int, help="expert slots instead of a budget")
    p.add_argument("--kv", default="f32", choices=sorted(runtime.KV_DTYPES))
    p.add_argument("--tokens", help="comma-separated ids: also run them greedily and "
                   "measure the reads under each policy")
    p.add_argument("--steps", type=int, default=16, help="greedy steps after --tokens")
    p.add_argument("--trace", help="a routing trace (colibri-cli --route-trace OUT): replay "
                   "it under each policy with the budget's slots")
    p.set_defaults(func=cmd_plan)
