"""colibri_infer's inputs at and beyond their edges (fuzz/infer_edges.c,
library under ASan+UBSan): token ids below 0 and at/above the vocabulary,
batch above max_batch, seq above max_seq_len, n_past overflowing 32 bits,
NULL pointers, bad mask values, uninitialised and freed models. Each gives
its documented code (colibri.h), writes no logit, and leaves the KV cache as
it was. An all-zero attention mask is defined (FORMAT.md 6: a query that
sees no key gets a zero attention output, no NaN reaches the logits): its
logits are finite and equal the numpy reference's."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))

import replay  # noqa: E402
from colibri.buildsteps import testmodel  # noqa: E402
from colibri.model.reference import Reference  # noqa: E402

SHAPE = dataclasses.replace(testmodel.FW_TINY, max_batch=2)
E_INPUT_TOO_LARGE, E_ARG, E_TOKEN, E_KV_STATE, E_NOT_INIT = -1, -7, -8, -11, -13

EXPECTED = {
    "prefill 4": 0,
    "token -1": E_TOKEN, "token INT32_MIN": E_TOKEN, "token INT32_MAX": E_TOKEN,
    "token == vocab": E_TOKEN,
    "batch max_batch + 1": E_INPUT_TOO_LARGE, "batch UINT32_MAX": E_INPUT_TOO_LARGE,
    "seq max_seq_len + 1": E_INPUT_TOO_LARGE, "seq UINT32_MAX": E_INPUT_TOO_LARGE,
    "n_past + seq = max_seq_len + 1": E_INPUT_TOO_LARGE,
    "n_past UINT32_MAX": E_INPUT_TOO_LARGE, "n_past + seq wraps 32 bits": E_INPUT_TOO_LARGE,
    "n_past beyond the cache": E_KV_STATE, "batch differs from the cache": E_KV_STATE,
    "NULL input_ids": E_ARG, "NULL logits": E_ARG, "NULL model": E_ARG,
    "batch 0": E_ARG, "seq 0": E_ARG, "mask value 2": E_ARG, "mask value 255": E_ARG,
    "decode after the failed calls": 0,
    "tokens 0 and vocab-1": 0, "all-ones mask": 0,
    "all-zero mask prefill": 0, "real token after an all-padding prefill": 0,
    "left-padded prefill": 0, "batch 2, second sequence all padding": 0,
    "decode both after it": 0,
    "never initialised": E_NOT_INIT, "after colibri_free": E_NOT_INIT,
}
# Details that must name the offending value.
DETAILS = {
    "token -1": r"token id at \[0, 1\] is out of range \[0, 96\)",
    "token == vocab": r"token id at \[0, 1\] is out of range \[0, 96\)",
    "n_past + seq wraps 32 bits": r"n_past 4294967295 \+ seq 2 exceed",
    "batch UINT32_MAX": r"batch 4294967295",
    "mask value 255": r"attention_mask\[0, 0\] is 255",
    "n_past beyond the cache": r"n_past 5 with batch 1, but the KV cache holds 4 tokens",
}
LINE = re.compile(r"^case (.*) rc=(-?\d+) untouched=(\d) finite=(\d) \| (.*)$")
COMPARE = re.compile(r"^compare (.*) maxdiff=(\S+)$")


@pytest.fixture(scope="module")
def edges_exe():
    return replay.build_tool("infer_edges")


@pytest.fixture(scope="module", params=["f32", "int8"])
def run(request, edges_exe, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"edges-{request.param}")
    model = testmodel.make_model(d / "m.colibri", request.param, seed=3, shape=SHAPE)
    proc = subprocess.run([str(edges_exe), str(model), str(d / "out.f32")],
                          capture_output=True, text=True, timeout=300,
                          env={**replay.SAN_ENV})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any(m in proc.stderr for m in replay.SANITIZER_MARKS), proc.stderr
    cases = {m[1]: (int(m[2]), m[3] == "1", m[4] == "1", m[5])
             for m in map(LINE.match, proc.stdout.splitlines()) if m}
    compares = {m[1]: float(m[2]) for m in map(COMPARE.match, proc.stdout.splitlines()) if m}
    return dict(quant=request.param, model=model, cases=cases, compares=compares,
                out=np.fromfile(d / "out.f32", dtype=np.float32))


def test_each_input_gets_its_code(run):
    got = {name: c[0] for name, c in run["cases"].items()}
    assert got == EXPECTED


def test_failed_calls_write_no_logits_and_succeeding_ones_are_finite(run):
    for name, (rc, untouched, finite, _) in run["cases"].items():
        if rc == 0:
            assert not untouched and finite, name
        else:
            assert untouched, f"{name}: failed with {rc} but wrote logits"


def test_successful_calls_leave_no_stale_error_detail(run):
    """colibri_error_detail describes the last call's failure only: a call
    that succeeds after a failed one reports no detail."""
    succeeded = [(name, d) for name, (rc, _, _, d) in run["cases"].items() if rc == 0]
    assert succeeded
    for name, detail in succeeded:
        assert detail.strip() == "", (name, detail)


def test_errors_name_the_value(run):
    for name, pattern in DETAILS.items():
        assert re.search(pattern, run["cases"][name][3]), (name, run["cases"][name][3])


def test_cache_and_mask_properties(run):
    c = run["compares"]
    assert c["cache unchanged by failed calls"] == 0.0          # bit-identical
    assert c["NULL mask vs all-ones mask"] == 0.0
    assert c["sequence beside an all-padding one"] < 1e-5       # relative


def test_all_zero_mask_matches_the_reference(run):
    """All-padding prefill, then one real token: finite logits equal to the
    numpy reference (FORMAT.md 6: zero attention output for a query that
    sees no key; the real token then sees only itself)."""
    V = SHAPE.vocab
    ref = Reference(run["model"])
    tokens = np.array([[1, 2, 3, 4]])
    want_pad = ref.forward(tokens, np.zeros((1, 4), np.int64))[0]          # [4, V]
    want_next = ref.forward(np.array([[5]]), np.ones((1, 1), np.int64), n_past=4)[0]
    got = run["out"].reshape(5, V)
    assert np.isfinite(got).all() and np.isfinite(want_pad).all()
    tol = 1e-5 if run["quant"] == "f32" else 1e-3
    for g, w in ((got[:4], want_pad), (got[4:], want_next)):
        rel = np.abs(g - w).max() / np.abs(w).max()
        assert rel < tol, rel


def test_format_md_defines_the_all_zero_mask():
    text = (ROOT / "docs" / "FORMAT.md").read_text()
    assert "sees no key at all" in text and "no NaN ever reaches the logits" in text
