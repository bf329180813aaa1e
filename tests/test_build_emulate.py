"""colibri.buildsteps.emulate and golden without an emulator: the firmware output
parser, timeouts, and the comparison messages."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import targets  # noqa: E402
from colibri.buildsteps import emulate, golden  # noqa: E402
from colibri.errors import ColibriError  # noqa: E402


def _output(rows, tokens=(3, 1), checksum=None):
    bits = np.asarray(rows, dtype=np.float32).view(np.uint32)
    lines = ["colibri-fw target=t model_bytes=10 arena_bytes=20 arena_needed=5",
             "kernels neon-dotprod", "prompt 0 4,5"]
    for i, r in enumerate(bits):
        lines.append(f"row 0 {i} " + " ".join(f"{v:08x}" for v in r))
    lines.append("tokens 0 " + ",".join(map(str, tokens)))
    cs = emulate.fnv1a(np.asarray(rows, np.float32)) if checksum is None else checksum
    lines += [f"checksum 0 0x{cs:08x}", "done"]
    return "\n".join(lines) + "\n"


def test_parse_round_trips_float_bits():
    rows = np.array([[1.5, -0.0, np.float32(1e-30)], [3.25, 2.0, -7.0]], np.float32)
    run = emulate.parse_firmware_output(_output(rows))
    assert run.done and run.header["arena_needed"] == "5"
    assert run.kernels == "neon-dotprod"
    p = run.prompts[0]
    assert p.prompt == [4, 5] and p.tokens == [3, 1]
    assert np.array_equal(p.rows.view(np.uint32), rows.view(np.uint32))


def test_checksum_mismatch_and_malformed_lines_are_errors():
    rows = np.ones((2, 3), np.float32)
    with pytest.raises(ColibriError, match="checksum .* does not match the printed rows"):
        emulate.parse_firmware_output(_output(rows, checksum=123))
    with pytest.raises(ColibriError, match="line 4 is malformed"):
        emulate.parse_firmware_output(_output(rows).replace("row 0 0 ", "row 0 0 zz", 1))
    with pytest.raises(ColibriError, match="line 2 is malformed"):
        emulate.parse_firmware_output(_output(rows).replace("kernels neon-dotprod", "kernels"))


def test_fnv1a_known_value():
    # FNV-1a 32 of the bytes 00 00 80 3f (1.0f little-endian).
    h = 2166136261
    for b in (0x00, 0x00, 0x80, 0x3F):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    assert emulate.fnv1a(np.array([1.0], np.float32)) == h


def test_run_kills_after_timeout():
    slow = dataclasses.replace(targets.get("x86_64"), name="slow", emulator=("sleep",))
    with pytest.raises(ColibriError, match=r"target slow: sleep 5 did not finish within 0 s"):
        emulate.run(slow, "5", timeout=0.3)


def test_missing_emulator_is_an_error_naming_the_package():
    t = dataclasses.replace(targets.get("ppc"), emulator=("qemu-nope",), emulator_package="qemu-x")
    with pytest.raises(ColibriError, match="apt-get install qemu-x"):
        emulate.run(t, "prog")


def test_compare_names_worst_position_and_phase():
    want = np.zeros((5, 4), np.float32)
    want[:, 0] = 10.0
    got = want.copy()
    got[4, 2] += 0.05  # decode step 2 of a 3-token prompt
    c = golden.compare(got, want, 1e-3, "target x, prompt 0 [1, 2, 3]", 3)
    assert not c.ok and (c.worst_position, c.worst_token) == (4, 2)
    assert "worst position 4 (decode step 2), token 2" in c.message
    assert "relative error 5.00e-03 > tolerance 1e-03" in c.message
    got[4, 2] = want[4, 2] + 0.005
    assert golden.compare(got, want, 1e-3, "x", 3).ok
    got[1, 1] = np.nan
    assert "non-finite" in golden.compare(got, want, 1e-3, "x", 3).message


def test_greedy_check_allows_only_near_ties():
    want = np.array([[1.0, 3.0, 2.9995]], np.float32)
    assert golden.check_greedy([2], want, want, 1, 1e-3, "x") is None      # a tie: fine
    assert "greedy token 0 is 0, the reference chooses 1" in golden.check_greedy(
        [0], want, want, 1, 1e-3, "x")
