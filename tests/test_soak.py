"""Soak: many decode steps in one process (soak/soak.c through
soak/run_soak.py) with flat resident memory, no leak (LeakSanitizer in the
ASan+UBSan build) and the logits of a fixed prompt bit-identical at the end.

The short runs (2 000 steps, the KV cache rewound ~35 times) are part of the
default test run. The full 100 000-step soak is marked `soak` and runs only
when selected: `pytest -m soak tests/test_soak.py`, or print its figures with
`.venv/bin/python soak/run_soak.py`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "soak"))

import run_soak  # noqa: E402

SHORT_STEPS = 2000
FULL_STEPS = 100_000


def _soak_selected(config) -> bool:
    """True when the run asked for soak tests with -m (and not 'not soak')."""
    expr = config.getoption("markexpr") or ""
    return "soak" in expr and "not soak" not in expr


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("soak")
    return {q: run_soak.model(q, d) for q in ("int8", "f32")}


@pytest.mark.parametrize("variant,quant,threads", [
    ("asan", "int8", 1), ("asan", "f32", 1), ("plain", "int8", 1),
    ("asan", "int8", 2), ("plain", "f32", 3)])
def test_short_soak(models, variant, quant, threads):
    r = run_soak.run(run_soak.build(variant), models[quant], SHORT_STEPS, every=100,
                     threads=threads)
    assert not r.problems(), r.problems()
    f = r.figures
    assert f["threads"] == threads
    assert f["steps"] == SHORT_STEPS and f["samples"] == SHORT_STEPS // 100
    # The cache really filled and was rewound many times.
    assert f["rewinds"] == (SHORT_STEPS - 1) // (run_soak.SHAPE.max_seq_len - 8)


def test_soak_reports_failures(tmp_path):
    """The checks can fail: a library error ends the run with its code, and
    problems() flags it (as it flags sanitizer output and changed logits)."""
    r = run_soak.run(run_soak.build("plain"), tmp_path / "missing.colibri", 10, every=1)
    assert r.returncode == 1 and "error -4 init" in r.stdout
    assert r.problems()
    fake = run_soak.Run({"logits_identical": 0, "rss_kb_first": 100, "rss_kb_last": 100,
                         "rss_kb_max": 100 + run_soak.RSS_SLACK_KB + 4}, 0, "", "", 0)
    assert len(fake.problems()) == 2


@pytest.mark.soak
@pytest.mark.parametrize("variant", ["plain", "asan"])
def test_full_soak(request, models, variant):
    if not _soak_selected(request.config):
        pytest.skip("full soak: run with -m soak")
    r = run_soak.run(run_soak.build(variant), models["int8"], FULL_STEPS, every=1000,
                     threads=2)
    print(variant, r.figures)
    assert not r.problems(), r.problems()
    assert r.figures["steps"] == FULL_STEPS
