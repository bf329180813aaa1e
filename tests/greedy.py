"""Greedy-token comparisons that hold on every CPU.

Two computations of the same logits (numpy on OpenBLAS, transformers on
torch, the C runtime) round differently by about 1e-6, and how they round
depends on the CPU (AVX-512 or AVX2 kernels) and on the matrix sizes. An
argmax comparison is therefore machine-independent only where the winner
leads the runner-up by much more than that rounding. These helpers make the
margin explicit instead of hoping for it:

- `assert_margins(rows, min_margin)`: every row's top-1 leads its top-2 by at
  least min_margin (relative to the row's largest magnitude). Call it on the
  rows that chose a generated sequence before asserting that two sequences
  are equal: with the margins checked, equality cannot depend on rounding,
  and a seed that lands on a near tie fails here, by name, on every machine.
- `assert_argmax_agrees(got, want, tol)`: per row, the argmax of got equals
  the argmax of want, except where want's top two are within tol (a tie the
  arithmetic may break either way). For teacher-forced rows (no feedback).
"""
from __future__ import annotations

import numpy as np

# Rounding differences between our numpy, torch and C paths are ~1e-6
# relative on unit-scale logits; 1e-4 is two orders above that.
DEFAULT_MARGIN = 1e-4


def top2_margins(rows: np.ndarray) -> np.ndarray:
    """rows [..., vocab] -> [...]: (top1 - top2) / max(1, max |row|)."""
    rows = np.asarray(rows, dtype=np.float64)
    part = np.partition(rows, -2, axis=-1)
    scale = np.maximum(1.0, np.max(np.abs(rows), axis=-1))
    return (part[..., -1] - part[..., -2]) / scale


def assert_margins(rows: np.ndarray, min_margin: float = DEFAULT_MARGIN,
                   what: str = "") -> None:
    """Every row's greedy choice wins by at least min_margin (relative)."""
    m = top2_margins(rows).reshape(-1)
    bad = np.flatnonzero(m < min_margin)
    assert bad.size == 0, (
        f"{what}: near tie at row {int(bad[0])} (top-2 margin {m[bad[0]]:.2e} < "
        f"{min_margin:.0e}): a greedy comparison there would depend on the CPU's "
        f"rounding; choose another seed or prompt")


def assert_argmax_agrees(got: np.ndarray, want: np.ndarray, tol: float = DEFAULT_MARGIN,
                         what: str = "") -> None:
    """got, want [..., vocab]: argmax equal wherever want has no near tie."""
    got = np.asarray(got).reshape(-1, np.shape(got)[-1])
    want = np.asarray(want).reshape(-1, np.shape(want)[-1])
    differ = np.flatnonzero(got.argmax(-1) != want.argmax(-1))
    if differ.size:
        margins = top2_margins(want[differ])
        worst = int(np.argmax(margins))
        assert margins[worst] <= tol, (
            f"{what}: row {int(differ[worst])} chooses {int(got[differ[worst]].argmax())}, "
            f"the reference {int(want[differ[worst]].argmax())} with a margin of "
            f"{margins[worst]:.2e} > {tol:.0e}")
