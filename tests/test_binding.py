"""colibri.runtime, the ctypes binding of libcolibri.so: logits equal the C
runtime's (colibri-cli --logits-out, infer_driver) bit for bit from the same
build; every C code becomes its exception; a closed model raises; the
library search order; hostile files (the fuzz corpus) and a 1,000-cycle
open/infer/close loop in a child process (a crash would be a signal, RSS
stays flat); the armv7 .so under qemu-arm through a C driver that dlopens it
as ctypes does."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from colibri.buildsteps import cbuild
from colibri import errors, runtime
from colibri.file import format as cformat
from colibri.buildsteps import testmodel
from test_runtime_support import c_build, golden_calls, run_driver  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
CHILD = TESTS / "binding_child.py"


@pytest.fixture(scope="module")
def so(c_build):
    return c_build("host").so


@pytest.fixture(scope="module")
def fw_tiny(tmp_path_factory):
    """The firmware's tiny int8 model (numpy-made, no torch)."""
    return testmodel.make_model(tmp_path_factory.mktemp("bind") / "tiny-int8.colibri", "int8")


def greedy_through_binding(m: runtime.Model, prompt: list[int], generate: int) -> tuple:
    """What colibri-cli --tokens --generate --logits-out does, through the
    binding: prompt rows, then the rows of the N - 1 tokens fed back."""
    rows = [m.infer(np.array(prompt))[0]]
    out = np.empty((1, 1, m.vocab), np.float32)
    nxt, gen = int(np.argmax(rows[0][-1])), []
    for g in range(generate):
        gen.append(nxt)
        if g == generate - 1:
            break
        m.infer([[nxt]], n_past=len(prompt) + g, out=out)
        rows.append(out[0].copy())
        nxt = int(np.argmax(out[0, 0]))
    return gen, np.concatenate(rows).astype("<f4")


@pytest.mark.parametrize("name,quant", [("tiny", "f32"), ("awkward", "int8")])
def test_logits_equal_colibri_cli_bit_for_bit(c_build, so, colibri_file, tmp_path, name, quant):
    """Same build (the .so's PIC objects and the CLI's static objects share
    sources, flags and kernels): identical bytes, from a path (colibri_init,
    like the CLI) and from bytes (colibri_init_from_memory)."""
    path = colibri_file(name, quant)
    prompt = [5, 17, 3, 9, 1, 22, 40, 7, 11, 2, 30, 8]
    out = tmp_path / "cli.f32"
    proc = subprocess.run([str(c_build("host").cli), "--model", str(path), "--tokens",
                           ",".join(map(str, prompt)), "--generate", "6", "--logits-out",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    cli_gen = [int(t) for t in re.search(r"^generated: (.*)$", proc.stdout, re.M)[1].split()]
    cli_bytes = out.read_bytes()
    for source in (path, path.read_bytes()):
        with runtime.Model(source, library=so) as m:
            gen, logits = greedy_through_binding(m, prompt, 6)
        assert gen == cli_gen
        assert logits.tobytes() == cli_bytes


def test_batched_masked_calls_equal_infer_driver(c_build, so, colibri_file, tmp_path):
    """Batch 3 with right and left padding, prefill then decode steps with
    the KV cache: the same bits as the C driver of the golden tests."""
    path = colibri_file("awkward", "int8")
    calls = golden_calls(cformat.read_file(path).shape.vocab, batch=3, seed=7, prefill=20,
                         decode=4)
    want = run_driver(c_build("host"), path, calls, tmp_path)
    with runtime.Model(path, library=so) as m:
        got = [m.infer(c.tokens, c.mask, c.n_past) for c in calls]
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and g.shape == w.shape
        assert g.tobytes() == w.astype(np.float32).tobytes()


def test_logits_are_written_in_place(so, fw_tiny):
    with runtime.Model(fw_tiny, library=so) as m:
        a = m.infer([1, 2, 3])
        assert a.shape == (1, 3, m.vocab) and a.flags.owndata and a.flags.c_contiguous
        out = np.full((1, 3, m.vocab), np.nan, np.float32)
        b = m.infer(np.array([[1, 2, 3]], np.int32), out=out)
        assert b is out and np.array_equal(a, out)
        for bad in (np.empty((1, 2, m.vocab), np.float32), np.empty((1, 3, m.vocab)),
                    np.empty((1, m.vocab, 3), np.float32).transpose(0, 2, 1)):
            with pytest.raises(errors.ArgumentError):
                m.infer([[1, 2, 3]], out=bad)


def test_info_and_verify(so, fw_tiny, tmp_path):
    cf = cformat.read_file(fw_tiny)
    with runtime.Model(fw_tiny, library=so) as m:
        info = m.info
        assert info.shape.vocab == cf.shape.vocab and info.shape.n_layers == cf.shape.n_layers
        assert info.shape.max_seq_len == cf.shape.max_seq_len
        assert info.n_tensors == len(cf.entries) and info.file_size == fw_tiny.stat().st_size
        assert info.dtypes["expert"] == cformat.DType.I8_GROUP
        assert info.kernels in ("ref", "avx2", "avx2-vnni", "avx512-vnni") and info.arena_bytes > 0
        assert m.verify() == []
    data = bytearray(fw_tiny.read_bytes())
    e = cf.entry(cformat.Kind.EXPERT_W1, 1, 2)
    data[e.offset + 3] ^= 1
    bad = runtime.verify(bytes(data), so)
    assert [i for i, _ in bad] == [cf.entries.index(e)]
    assert "EXPERT_W1 layer 1 expert 2" in bad[0][1]
    assert runtime.arena_size(fw_tiny, so) <= runtime.Model(fw_tiny, library=so).info.arena_bytes


def _codes_of_colibri_h() -> dict[str, int]:
    text = (ROOT / "src" / "include" / "colibri.h").read_text()
    return {n: int(v) for n, v in re.findall(r"(COLIBRI_E_\w+) = (-\d+)", text)}


def test_every_c_code_has_its_exception_class():
    codes = _codes_of_colibri_h()
    assert len(codes) == 14
    for name, code in codes.items():
        calls = ["infer"] if name == "COLIBRI_E_INPUT_TOO_LARGE" else \
            ["init"] if name == "COLIBRI_E_BAD_FORMAT" else ["init", "infer"]
        for call in calls:
            cls = errors.runtime_error_class(code, call)
            assert cls is not errors.RuntimeCallError and cls.code == code, name
            assert issubclass(cls, errors.ColibriError)
    assert issubclass(errors.BadFormatError, errors.FormatError)
    assert issubclass(errors.RuntimeCRCError, errors.CRCError)


def _raises(cls, code, fn, detail=None, strerror=None):
    with pytest.raises(cls) as ei:
        fn()
    e = ei.value
    assert type(e) is cls and e.code == code and e.strerror
    if detail:
        assert re.search(detail, e.detail), e.detail
    if strerror:
        assert strerror in e.strerror
    return e


def test_errors_carry_code_strerror_and_detail(so, fw_tiny, tmp_path):
    data = fw_tiny.read_bytes()
    M = lambda src, **kw: runtime.Model(src, library=so, **kw)  # noqa: E731
    _raises(errors.BadFormatError, -1, lambda: M(data[:1000]), "truncated",
            strerror="bad .colibri file")
    _raises(errors.RuntimeIOError, -4, lambda: M(tmp_path / "missing.colibri"))
    crc = bytearray(data)
    crc[cformat.read_file(fw_tiny).entry(cformat.Kind.LM_HEAD).offset + 1] ^= 0x10
    _raises(errors.RuntimeCRCError, -3, lambda: M(bytes(crc)), "crc")
    newer = bytearray(data)
    newer[4] = 9                       # format version 9, header CRC fixed
    import zlib
    newer[60:64] = zlib.crc32(bytes(newer[:60])).to_bytes(4, "little")
    _raises(errors.RuntimeVersionError, -5, lambda: M(bytes(newer)))
    be = testmodel.make_model(tmp_path / "be.colibri", "int8", byte_order="big")
    _raises(errors.ByteOrderError, -6, lambda: M(be.read_bytes()))
    with M(be) as m:                   # colibri_init swaps a file
        assert m.info.byte_swapped
    _raises(errors.ArenaTooSmallError, -9, lambda: M(data, arena=1024))
    with M(data, arena=runtime.arena_size(data, so)) as m:
        m.infer([1, 2])
    with M(fw_tiny) as m:
        _raises(errors.TokenError, -8, lambda: m.infer([[1, m.vocab]]), "out of range")
        _raises(errors.TokenError, -8, lambda: m.infer([[-1]]))
        _raises(errors.TokenError, -8, lambda: m.infer([[2**40]]), "int32")
        _raises(errors.InputTooLargeError, -1, lambda: m.infer(np.ones((1, 17), int)),
                strerror="max_seq_len")
        _raises(errors.InputTooLargeError, -1, lambda: m.infer(np.ones((2, 1), int)))
        _raises(errors.ArgumentError, -7, lambda: m.infer([[1, 2]], mask=[[1, 2]]))
        _raises(errors.ArgumentError, -7, lambda: m.infer([[1, 2]], mask=[[1, 256]]))
        _raises(errors.ArgumentError, -7, lambda: m.infer(np.zeros((1, 0), int)))
        _raises(errors.ArgumentError, -7, lambda: m.infer(np.ones((1, 1, 1), int)))
        _raises(errors.ArgumentError, -7, lambda: m.infer([[1.5]]))
        _raises(errors.ArgumentError, -7, lambda: m.infer([[1]], n_past=-1))
        m.infer([1, 2, 3])
        _raises(errors.KVStateError, -11, lambda: m.infer([[1]], n_past=4))
        # An error leaves the KV cache as it was: the decode step still works.
        m.infer([[4]], n_past=3)


def test_closed_model_raises_never_crashes(so, fw_tiny):
    m = runtime.Model(fw_tiny, library=so)
    with m:
        pass
    assert m.closed
    m.close()                                            # idempotent
    for fn in (lambda: m.infer([1]), m.verify):
        _raises(errors.NotInitializedError, -13, fn, "closed")
    assert "closed" in repr(m)
    # close() waits for an infer in another thread; the loser raises.
    m = runtime.Model(fw_tiny, library=so)
    seen = []

    def loop():
        try:
            for _ in range(2000):
                m.infer([1, 2, 3, 4])
        except errors.NotInitializedError:
            seen.append("closed")
    t = threading.Thread(target=loop)
    t.start()
    m.close()
    t.join()
    assert m.closed and seen in ([], ["closed"])


def test_library_search_order(so, fw_tiny, tmp_path, monkeypatch):
    monkeypatch.delenv("COLIBRI_LIBRARY", raising=False)
    fake_root = tmp_path / "checkout"
    monkeypatch.setattr(runtime, "ROOT", fake_root)
    with pytest.raises(errors.LibraryNotFoundError, match="python -m colibri.buildsteps.cbuild"):
        runtime.find_library()
    default = runtime.default_library_path()
    assert default.parent.parent == fake_root / "build"
    default.parent.mkdir(parents=True)
    shutil.copy(so, default)
    assert runtime.find_library() == default.resolve()           # 3. the package's build
    monkeypatch.setenv("COLIBRI_LIBRARY", str(so))
    assert runtime.find_library() == Path(so).resolve()          # 2. the environment
    other = tmp_path / "elsewhere.so"
    shutil.copy(so, other)
    assert runtime.find_library(other) == other.resolve()       # 1. an explicit path
    with runtime.Model(fw_tiny) as m:                            # no library=: COLIBRI_LIBRARY
        m.infer([1])
    monkeypatch.setenv("COLIBRI_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(errors.LibraryNotFoundError, match="COLIBRI_LIBRARY"):
        runtime.Model(fw_tiny)
    not_ours = tmp_path / "libm-copy.so"
    libm = Path("/lib/x86_64-linux-gnu/libm.so.6")
    if libm.exists():
        shutil.copy(libm, not_ours)
        with pytest.raises(errors.LibraryNotFoundError, match="colibri_abi"):
            runtime.load_library(not_ours)


def test_fuzz_corpus_through_the_binding_raises_never_crashes(c_build, so, tmp_path):
    """Every committed fuzz input, driven as fuzz_init_infer.c drives the
    library, through the binding in a child process: it must exit 0 (no
    signal, no exception other than a ColibriError subclass), and every step
    must end with the code the C harness gets from the same build."""
    files = sorted(p for p in (ROOT / "fuzz" / "corpus").iterdir() if p.is_file())
    proc = subprocess.run([sys.executable, str(CHILD), "fuzz", str(so), *map(str, files)],
                          capture_output=True, text=True, timeout=600)
    lines = proc.stdout.splitlines()
    culprit = files[len(lines)].name if proc.returncode and len(lines) < len(files) else ""
    assert proc.returncode == 0, (f"exit {proc.returncode} after {len(lines)} inputs "
                                  f"{culprit}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    assert len(lines) == len(files)
    ours = {}
    for ln in lines:
        name, rest = ln.split(" ", 1)
        ours[name] = tuple(int(v) for v in re.findall(r"(?:arena|init|infer|decode|verify)="
                                                      r"(-?\d+)", rest))
    inits = {v[1] for v in ours.values()}
    assert {0, -1, -3} <= inits                          # loads, bad formats, CRCs
    assert any(v[2] == 0 for v in ours.values())          # the forward pass ran
    # The C harness (fuzz/replay_main.c) over the same files, same build.
    sys.path.insert(0, str(ROOT / "fuzz"))
    import replay
    exe = cbuild.build_program(c_build("host").info, [ROOT / "fuzz" / "fuzz_init_infer.c",
                                                      ROOT / "fuzz" / "replay_main.c"],
                               tmp_path / "replay")
    theirs = {Path(r.path).name: (r.arena, r.init, r.infer, r.decode, r.verify)
              for r in replay.replay(exe, files)}
    differ = {n: (ours[n], theirs[n]) for n in theirs if ours[n] != theirs[n]}
    assert differ == {}, f"binding vs C harness (arena, init, infer, decode, verify): {differ}"


def test_open_infer_close_1000_cycles_rss_flat(so, fw_tiny):
    proc = subprocess.run([sys.executable, str(CHILD), "leak", str(so), str(fw_tiny), "1000"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.splitlines()[-1])
    # One leaked arena (37 KiB) or file copy (81 KiB) per cycle would add
    # tens of MiB; allow 1 MiB of interpreter noise.
    assert r["rss_after_kib"] - r["rss_before_kib"] <= 1024, r


@pytest.mark.parametrize("variant", ["host", "armv7-neon"])
def test_dlopen_driver_equals_colibri_cli(c_build, fw_tiny, tmp_path, variant):
    """The .so used as ctypes uses it (dlopen, dlsym, the instance sized by
    colibri_abi_sizeof_model), natively and the armv7 .so under qemu-arm
    (Python does not run there): bit-identical to that build's colibri-cli."""
    build = c_build(variant)
    info = build.info
    driver = tmp_path / "dlopen_driver"
    # Dynamically linked (dlopen in a static executable is unsupported):
    # the build's flags without its -static; the emulator's -L finds ld.so.
    cbuild._run([info["cc"], *info["cflags"], str(TESTS / "c" / "dlopen_driver.c"),
                 "-ldl", "-o", str(driver)])
    ids = "5,17,3,9,1,22,40,7"
    a, b = tmp_path / "so.f32", tmp_path / "cli.f32"
    p1 = subprocess.run(build.cmd(str(driver), build.so, fw_tiny, ids, 5, a),
                        capture_output=True, text=True, timeout=120)
    assert p1.returncode == 0, p1.stdout + p1.stderr
    p2 = subprocess.run(build.cmd(str(build.cli), "--model", fw_tiny, "--tokens", ids,
                                  "--generate", 5, "--logits-out", b),
                        capture_output=True, text=True, timeout=120)
    assert p2.returncode == 0, p2.stdout + p2.stderr
    gen = re.search(r"^generated:(.*)$", p1.stdout, re.M)[1].split()
    assert gen == re.search(r"^generated:(.*)$", p2.stdout, re.M)[1].split()
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size == (8 + 4) * 96 * 4


def _colibri_run(*args, env=None):
    import os
    return subprocess.run([sys.executable, "-m", "colibri.cli", "run", *map(str, args)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_colibri_run_engine_c_equals_colibri_cli(c_build, so, fw_tiny, tmp_path):
    """`colibri run --engine c` is the C runtime: colibri-cli's very bytes,
    and it says which engine ran; the reference stays within tolerance."""
    ids = "5,17,3,9,1,22"
    cli_out, c_out, ref_out = tmp_path / "cli.f32", tmp_path / "c.f32", tmp_path / "r.f32"
    proc = subprocess.run([str(c_build("host").cli), "--model", str(fw_tiny), "--tokens", ids,
                           "--generate", "4", "--logits-out", str(cli_out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    env = {"COLIBRI_LIBRARY": str(so)}
    c = _colibri_run(fw_tiny, "--engine", "c", "--tokens", ids, "--generate", 4,
                     "--logits-out", c_out, env=env)
    assert c.returncode == 0, c.stderr
    assert c.stdout.startswith(f"engine: c (libcolibri through colibri.runtime: {so}")
    assert c_out.read_bytes() == cli_out.read_bytes()
    cli_gen = re.search(r"^generated: (.*)$", proc.stdout, re.M)[1].split()
    assert re.search(r"generated: (.*)$", c.stdout, re.M)[1].split(",") == cli_gen
    # Several sequences: one at a time, each its own rows (max_batch is 1).
    two = tmp_path / "two.f32"
    t = _colibri_run(fw_tiny, "--engine", "c", "--tokens", ids, "--tokens", "7,8",
                     "--logits-out", two, env=env)
    assert t.returncode == 0, t.stderr
    rows = np.fromfile(two, "<f4").reshape(-1, 96)
    assert rows.shape[0] == 6 + 2
    assert rows[:6].tobytes() == cli_out.read_bytes()[:6 * 96 * 4]
    # Default with the library found: c. Without: reference, and it says why.
    assert _colibri_run(fw_tiny, "--tokens", ids, env=env).stdout.startswith("engine: c ")
    missing = {"COLIBRI_LIBRARY": str(tmp_path / "none.so")}
    r = _colibri_run(fw_tiny, "--tokens", ids, "--generate", 4, "--logits-out", ref_out,
                     env=missing)
    assert r.returncode == 0 and r.stdout.startswith("engine: reference (numpy"), r.stdout
    assert "libcolibri.so not found" in r.stdout.splitlines()[0]
    rows_c, rows_r = np.fromfile(c_out, "<f4"), np.fromfile(ref_out, "<f4")
    assert np.abs(rows_c - rows_r).max() <= 3e-2     # int8 file: C vs numpy arithmetic
    e = _colibri_run(fw_tiny, "--engine", "c", "--tokens", ids, env=missing)
    assert e.returncode == 2 and e.stderr.startswith("colibri: error: libcolibri.so not found")
    # A C error is one line, the C code's meaning, the detail and the fix.
    e = _colibri_run(fw_tiny, "--engine", "c", "--tokens", "1,96", env=env)
    assert e.returncode == 2
    assert re.match(r"colibri: error: .*tiny-int8\.colibri: token id out of range \(.+\): "
                    r"use token ids below the model's vocab\n$", e.stderr), e.stderr


def test_demo_eval_c_path_is_the_binding(c_build, so, fw_tiny, tmp_path):
    """models/demo/eval.py's C runtime logits (one batch-1 prefill per
    window through colibri.runtime) equal colibri-cli --logits-out."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("demo_eval_b", ROOT / "models/demo/eval.py")
    demo_eval = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_eval)
    windows = np.array([[5, 17, 3, 9, 1, 22], [40, 7, 11, 2, 30, 8]])
    got = demo_eval.c_logits(fw_tiny, windows, library=so)
    assert got.shape == (2, 6, 96)
    for row, seq in zip(got, windows):
        out = tmp_path / "cli.f32"
        subprocess.run([str(c_build("host").cli), "--model", str(fw_tiny), "--tokens",
                        ",".join(map(str, seq)), "--logits-out", str(out)], check=True,
                       capture_output=True, timeout=120)
        assert row.astype("<f4").tobytes() == out.read_bytes()


def test_bench_binding_overhead_runs(fw_tiny, tmp_path, capsys):
    """bench/binding_overhead.py measures and prints (a smoke run, a few
    calls; nothing about the times is asserted)."""
    sys.path.insert(0, str(ROOT))
    from bench import binding_overhead
    out = tmp_path / "o.json"
    assert binding_overhead.main(["--model", str(fw_tiny), "--steps", "20", "--rounds", "1",
                                  "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"][0]
    assert set(res["median_s"]) == {"direct C", "array+out", "list"}
    assert all(v["wall"] > 0 for v in res["median_s"].values())
    assert "| array+out |" in capsys.readouterr().out
