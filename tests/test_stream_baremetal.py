"""Streamed experts on bare metal (issue: bigger than the board): a Cortex-M
program under qemu-system-arm opens a model through a caller's
colibri_reader, as it would read external QSPI flash, with a static arena
smaller than a third of the file, and gives the bits of the all-resident
instance of the same file on the device (used in place from flash) for a
prefill and decode steps, with one and with two slots for the whole model;
both agree with the host's run (ref kernels) within float rounding.
Program: tests/c/stream_baremetal.c."""
from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

from feature_models import SHAPE, write_model
from test_runtime_support import c_build, golden_calls, run_driver  # noqa: F401

# Experts dominate the file, as in the models a budget is for (1.0 of 1.1 MB).
STREAM_SHAPE = dataclasses.replace(SHAPE, intermediate=128, max_seq_len=32)


def _c_array(data: bytes, per_line: int = 40) -> str:
    return ",\n".join(",".join(str(b) for b in data[i:i + per_line])
                      for i in range(0, len(data), per_line))


@pytest.mark.parametrize("slots", [1, 2])
def test_a_model_three_times_the_arena_streams_through_a_callers_reader(c_build, slots,
                                                                        tmp_path):
    import targets
    t = targets.load_all()["cortex-m"]
    if shutil.which(t.tool("gcc")) is None or shutil.which(t.emulator[0]) is None:
        pytest.skip("Cortex-M toolchain or qemu-system-arm not installed")
    path = write_model(tmp_path / "m.colibri", None, shape=STREAM_SHAPE, seed=5)
    data = path.read_bytes()
    calls = golden_calls(STREAM_SHAPE.vocab, 1, seed=2, prefill=8, decode=4)
    want = run_driver(c_build("ref"), path, calls, tmp_path / "host")
    host = np.concatenate([w.reshape(-1) for w in want]).astype(np.float32)
    tokens = np.concatenate([c.tokens.reshape(-1) for c in calls])
    at = np.cumsum([0] + [c.tokens.size for c in calls[:-1]])
    cap = len(data) // 3
    head = [f"#define ARENA_CAP {cap}u", f"#define STREAM_SLOTS {slots}u",
            "#define RESIDENT_CAP (256u << 10)", f"#define N_ROWS {host.size // STREAM_SHAPE.vocab}u",
            f"#define VOCAB {STREAM_SHAPE.vocab}u", f"#define N_CALLS {len(calls)}u",
            f"#define MAX_ROWS {max(c.tokens.size for c in calls)}u",
            f"static const unsigned char model_file[{len(data)}] = {{{_c_array(data)}}};",
            f"static const int32_t call_tokens[] = {{{','.join(map(str, tokens))}}};",
            f"static const uint32_t call_at[] = {{{','.join(map(str, at))}}};",
            "static const uint32_t call_len[] = {"
            + ",".join(str(c.tokens.size) for c in calls) + "};",
            "static const uint32_t call_past[] = {"
            + ",".join(str(c.n_past) for c in calls) + "};",
            "static const float host_logits[] = {"
            + ",".join(f"{float(v)!r}f" for v in host) + "};"]
    (tmp_path / "stream_cases.h").write_text("\n".join(head) + "\n")
    from baremetal import build_and_run
    proc = build_and_run(t, "tests/c/stream_baremetal.c", tmp_path, "stream", timeout=600)
    assert proc.returncode == 0 and "stream: ok" in proc.stdout, proc.stdout + proc.stderr
    m = re.search(r"ok (\d+) logits bit-identical to all-resident; host within (\d+) ppb of "
                  r"the largest logit; model (\d+) bytes, arena (\d+) bytes, (\d+) slots of "
                  r"(\d+) bytes; (\d+) misses, (\d+) hits, (\d+) bytes read", proc.stdout)
    rows, ppb, size, arena, n_slots, slot_bytes, misses, hits, read = map(int, m.groups())
    assert rows == host.size and size == len(data) and n_slots == slots
    assert ppb <= 10_000, ppb                 # 1e-5 of the largest logit
    assert arena <= cap                       # the whole instance in a third of the file
    assert misses > 0 and 0 < read <= misses * slot_bytes   # one read of an expert a miss
