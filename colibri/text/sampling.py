"""Next-token choice: greedy, or sampled with temperature, top-k, top-p,
min-p and a repetition penalty from a counter-based generator: the numpy
reference of src/sample.c (colibri_sample.h), operation for operation.

Why the C runtime and this module give the same tokens for a seed:
- the draw of step s is splitmix64(seed + (s+1) * 0x9E3779B97F4A7C15), pure
  64-bit integer arithmetic; its top 53 bits make r, an exact dyadic number
  in [0, 1): no float rounding is involved in the draw at all;
- probabilities are exp(logit/T - max) in double, ordered most probable first
  (ties to the lower id, a total order), filtered and summed sequentially in
  that order (numpy's cumsum, not its pairwise sum), as the C loop does;
- so C and numpy differ only by exp()'s last-ulp rounding, which changes a
  choice only when r * total lies within ~1e-15 of a bucket boundary or a
  probability sits on a top-p / min-p threshold. `sample(..., margin=True)`
  returns that distance, and the tests compare only choices whose margin is
  clear (and count the others: zero in practice).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


@dataclass
class SampleParams:
    temperature: float = 0.0       # <= 0: greedy
    top_k: int = 0                 # 0: off
    top_p: float = 1.0             # >= 1: off
    min_p: float = 0.0             # <= 0: off
    repetition_penalty: float = 1.0
    seed: int = 0

    def check(self) -> None:
        import math
        for name in ("temperature", "top_p", "min_p"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} = {v}: must be finite and >= 0")
        if not math.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty = {self.repetition_penalty}: must be > 0")
        if self.top_k < 0:
            raise ValueError(f"top_k = {self.top_k}: must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def draw(seed: int, step: int) -> int:
    """colibri_sample_draw: the 64-bit counter-based value of (seed, step)."""
    z = (seed + (step + 1) * GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _penalised(logits: np.ndarray, p: SampleParams, history) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float32).copy()
    if p.repetition_penalty != 1.0 and history is not None:
        ids = np.unique([h for h in history if 0 <= h < x.size]).astype(np.int64)
        if ids.size:
            v = x[ids]
            pen = np.float32(p.repetition_penalty)
            x[ids] = np.where(v > 0, v / pen, v * pen).astype(np.float32)
    return x


def _gap(d: np.ndarray) -> float:
    """Smallest distance from a boundary, exact ties left out: an exact tie
    (e.g. equal logits, whose exp() is the same number in C and numpy, summed
    exactly) is decided the same way on both sides."""
    d = np.abs(d[d != 0])
    return float(d.min()) if d.size else np.inf


def sample(logits, p: SampleParams, history=(), step: int = 0, margin: bool = False):
    """The token colibri_sample chooses; with margin=True, (token, margin)
    where margin is the smallest relative distance of a decision from its
    boundary (inf for greedy: ties go to the lower id, exactly)."""
    p.check()
    x = _penalised(logits, p, history)
    if p.greedy:
        y = np.where(np.isnan(x), -np.inf, x)
        if np.all(np.isnan(x)):
            return (0, np.inf) if margin else 0
        tok = int(np.argmax(y))
        if not margin:
            return tok
        # The argmax is exact on the same logits; across engines whose logits
        # differ slightly, the gap to the runner-up is what keeps it.
        top2 = np.sort(y[np.isfinite(y)])[-2:] if np.isfinite(y).sum() >= 2 else None
        gap = np.inf if top2 is None else float(top2[1] - top2[0]) / max(1.0, abs(float(top2[1])))
        return tok, gap
    z = np.where(np.isnan(x), -np.inf, x.astype(np.float64) / np.float64(np.float32(p.temperature)))
    mx = z.max()
    if mx == -np.inf:
        return (0, np.inf) if margin else 0
    pr = np.where(z == -np.inf, 0.0, np.exp(z - mx))
    order = np.lexsort((np.arange(pr.size), -pr))   # p desc, then id asc
    ps = pr[order]
    keep = pr.size
    m = np.inf
    if p.top_k and p.top_k < keep:
        keep = p.top_k
    if p.top_p < 1.0:
        cum = np.cumsum(ps[:keep])
        thr = np.float64(np.float32(p.top_p)) * cum[-1]
        j = int(np.argmax(cum >= thr)) if np.any(cum >= thr) else keep - 1
        m = min(m, _gap(cum - thr) / cum[-1])
        keep = j + 1
    if p.min_p > 0.0:
        floor_p = np.float64(np.float32(p.min_p)) * ps[0]
        j = 1
        while j < keep and ps[j] >= floor_p:
            j += 1
        m = min(m, _gap(ps[:keep] - floor_p) / ps[0])
        keep = j
    cum = np.cumsum(ps[:keep])
    total = cum[-1]
    r = float(draw(p.seed, step) >> 11) * 2.0 ** -53 * total
    j = int(np.searchsorted(cum, r, side="right"))
    j = min(j, keep - 1)
    m = min(m, _gap(cum - r) / total)
    tok = int(order[j])
    return (tok, m) if margin else tok
