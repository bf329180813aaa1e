"""The 8-bit KV cache (colibri_options.kv_dtype = COLIBRI_KV_I8).

- C with an i8 cache agrees with the numpy reference with the same i8 cache
  (colibri.model.reference.Reference(kv="i8")) on every golden config, f32 and
  int8 files, batch 1 and 3 (padding both sides), prefill then decode steps
  -- and is measurably closer to it than to the f32-cache reference, so the
  two really quantise the same way.
- The logits are bit-identical for every thread count (our own C path).
- The arena and KV sizes equal figures computed here from the shape alone.
- Options misuse is a code with a detail, never a crash.
- An encoder-decoder (Switch) runs with the i8 cache too: its encoder's,
  decoder's and cross-attention's keys and values, against the reference
  with the same cache.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from conftest import GOLDEN_NAMES
from colibri import errors, runtime
from test_runtime_support import (assert_quantised_rows, c_build, golden_calls, reference_logits,  # noqa: F401
                                  relative_row_error, run_driver, valid_rows)


def _calls(ref, batch, name):
    return golden_calls(ref.shape.vocab, batch, seed=batch * 100 + len(name) + 7)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("quant", ["f32", "int8"])
@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_i8_cache_matches_reference_with_i8_cache(c_build, colibri_file, tmp_path,
                                                  name, quant, batch):
    from colibri.model.reference import Reference
    model = colibri_file(name, quant)
    ref8, ref32 = Reference(model, kv="i8"), Reference(model)
    calls = _calls(ref8, batch, name)
    want8 = valid_rows(calls, reference_logits(ref8, calls))
    want32 = valid_rows(calls, reference_logits(ref32, calls))
    for variant in ("ref", "host"):
        got = valid_rows(calls, run_driver(c_build(variant), model, calls,
                                           tmp_path / variant, kv="i8",
                                           vocab=ref8.shape.vocab))
        rel8 = relative_row_error(got, want8)
        rel32 = relative_row_error(got, want32)
        # As the int8 activations (test_runtime_golden): a value within an
        # ulp of a rounding boundary may round the other way in C and numpy,
        # moving that row and the later rows of its sequence by ~1e-2.
        assert_quantised_rows(got, want8, f"{name} {quant} b{batch} {variant} vs ref i8")
        # The cache is really 8-bit, as the reference quantises it: the f32
        # reference is an order of magnitude further away.
        assert np.median(rel32) >= 10 * max(np.median(rel8), 1e-7), (
            f"{variant}: i8 cache as close to f32 ({np.median(rel32):.3g}) as to "
            f"i8 ({np.median(rel8):.3g})")


def test_i8_cache_bit_identical_for_every_thread_count(c_build, colibri_file):
    so = c_build("host").so
    model = colibri_file("wide", "int8")
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 128, size=(2, 40))
    out = {}
    for threads in (1, 2, 3):
        with runtime.Model(model, library=so, threads=threads, kv="i8") as m:
            a = m.infer(ids[:, :30])
            b = m.infer(ids[:, 30:], n_past=30)
            out[threads] = np.concatenate([a, b], axis=1)
    assert np.array_equal(out[1], out[2]) and np.array_equal(out[1], out[3])


def _kv_expected(s, kv):
    """KV bytes from the shape alone: per token over all layers, and the
    arena's pieces (keys, values; i8: their scales too), each rounded up
    to 64 bytes."""
    def up(n):
        return -(-n // 64) * 64
    slots = s.n_layers * s.max_batch * s.max_seq_len
    kvdim = s.n_kv_heads * s.head_dim
    if kv == "f32":
        return 2 * s.n_layers * kvdim * 4, 2 * up(slots * kvdim * 4)
    return (2 * s.n_layers * s.n_kv_heads * (s.head_dim + 4),
            2 * (up(slots * kvdim) + up(slots * s.n_kv_heads * 4)))


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_kv_and_arena_sizes_follow_the_shape(c_build, colibri_file, name):
    so = c_build("host").so
    path = colibri_file(name, "f32")
    a32 = runtime.arena_size(path, so)
    a8 = runtime.arena_size(path, so, kv="i8")
    got = {}
    for kv in ("f32", "i8"):
        with runtime.Model(path, library=so, kv=kv, arena=a8 if kv == "i8" else a32) as m:
            i = m.info
            assert i.kv == kv
            per_token, total = _kv_expected(i.shape, kv)
            assert (i.kv_bytes_per_token, i.kv_bytes) == (per_token, total)
            got[kv] = total
    # Only the KV cache changes with the type.
    assert a32 - a8 == got["f32"] - got["i8"] > 0


def test_options_misuse_is_a_code_with_a_detail(c_build, colibri_file, tmp_path):
    so = c_build("host").so
    lib = runtime.load_library(so)
    path = colibri_file("tiny", "f32")
    with pytest.raises(errors.ArgumentError):
        runtime.Model(path, library=so, kv="i4")
    blob = np.frombuffer(path.read_bytes(), np.uint8).copy()
    out = ctypes.c_size_t(0)

    class Bigger(ctypes.Structure):   # a newer header's struct: one more field
        _fields_ = [("size", ctypes.c_uint32), ("kv_dtype", ctypes.c_uint32),
                    ("expert_slots", ctypes.c_uint32), ("slot_policy", ctypes.c_uint32),
                    ("ram_bytes", ctypes.c_uint64), ("prefetch", ctypes.c_uint32),
                    ("padding", ctypes.c_uint32), ("future", ctypes.c_uint32)]
    now = ctypes.sizeof(runtime._Options)   # this library's colibri_options
    assert now == Bigger.future.offset
    f = lib.lib.colibri_arena_size_ex
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                  ctypes.POINTER(ctypes.c_size_t)]
    for (size, kv, policy, future), code in (
            ((4, 0, 0, 0), -7), ((8, 2, 0, 0), -7),   # too short; no such kv type
            ((8, 1, 0, 0), 0),                       # an older header's struct
            ((now, 0, 3, 0), -7),                    # no such slot policy
            ((now + 4, 1, 1, 0), 0),                 # a newer one, its extra at 0
            ((now + 4, 0, 0, 5), -12)):              # ... set: not in this library
        opt = Bigger(size, kv, 0, policy, 0, 0, 0, future)
        rc = f(blob.ctypes.data, blob.size, ctypes.byref(opt), ctypes.byref(out))
        assert rc == code, (size, kv, policy, future, rc)
    rc = f(blob.ctypes.data, blob.size, None, ctypes.byref(out))
    assert rc == 0 and out.value == runtime.arena_size(path, so)


@pytest.mark.parametrize("quant", ["f32", "int8"])
def test_encoder_decoder_i8_cache_matches_reference_with_i8_cache(c_build, tmp_path, quant,
                                                                  monkeypatch):
    """A Switch Transformers file with the 8-bit cache: the encoder's keys
    and values, the decoder's and the cross-attention's all 8-bit in C
    (ref kernels, then the CPU's) as in the numpy reference with kv="i8" (a padded
    batch, a decoder prefill and 8 cached steps), an order of magnitude
    closer to it than to the float32-cache reference; the arena is
    memory.arena_bytes' for both cache types, smaller with i8."""
    pytest.importorskip("transformers")
    from golden_switch import make_switch, scenario
    from colibri.model import memory
    from colibri.model.convert import ColibriExporter
    from colibri.model.reference_encdec import from_file
    from colibri.file import format as fmt
    model = make_switch(seed=0)
    path = ColibriExporter(model=model, quant=quant, max_seq_len=24,
                           max_batch=4).export(tmp_path / "switch.colibri")
    ids, mask, calls, _, _ = scenario(model, (11, 7), 4, 8, seed=5)

    def rows(enc, logits):
        # the encoder output's rows of real tokens; every decoder row
        return enc[mask.astype(bool)], np.concatenate([x.reshape(-1, x.shape[-1])
                                                       for x in logits])

    def reference(kv):
        ref = from_file(path, kv=kv)
        enc = ref.encode(ids, mask)
        return rows(enc, [ref.decode(c) for c in calls])
    want8, want32 = reference("i8"), reference("f32")
    cf = fmt.read_file(path, check_crc=False)
    so = c_build("host").so
    for variant in ("ref", "host"):
        # COLIBRI_KERNELS (read at init) forces the ref table in the same library
        monkeypatch.setenv("COLIBRI_KERNELS", "ref" if variant == "ref" else "")
        with runtime.Model(path, library=so, kv="i8") as m:
            assert m.info.kv == "i8" and (variant != "ref" or m.info.kernels == "ref")
            enc, out, past = m.encode(ids, mask), [], 0
            for c in calls:
                out.append(m.infer(c, n_past=past))
                past += c.shape[1]
        for part, g, w8, w32 in zip(("encoder", "logits"), rows(enc, out), want8, want32):
            what = f"switch {quant} {variant} {part}"
            assert_quantised_rows(g, w8, f"{what} vs ref i8")
            rel8, rel32 = relative_row_error(g, w8), relative_row_error(g, w32)
            assert np.median(rel32) >= 10 * max(np.median(rel8), 1e-7), (
                f"{what}: i8 cache as close to f32 ({np.median(rel32):.3g}) as to "
                f"i8 ({np.median(rel8):.3g})")
        sizes = {kv: runtime.arena_size(path, so, kv=kv) for kv in ("f32", "i8")}
        assert sizes == {kv: memory.arena_bytes(cf.shape, cf.desc, kv, memory.CHUNK_TOKENS)
                         for kv in sizes} and sizes["i8"] < sizes["f32"], sizes

