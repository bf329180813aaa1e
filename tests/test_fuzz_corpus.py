"""The fuzz harness (fuzz/fuzz_init_infer.c) replayed without libFuzzer over
the committed regression corpus fuzz/corpus/ and the seeds of
fuzz/gen_seeds.py, the library built with AddressSanitizer +
UndefinedBehaviorSanitizer (-fno-sanitize-recover=all): any report fails.
Plus the corpus's own hygiene (small files, size budget) and that fuzz/run.sh
builds the same sources as colibri/buildsteps/sources.py."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))

import gen_seeds  # noqa: E402
import replay  # noqa: E402

CORPUS = ROOT / "fuzz" / "corpus"
CORPUS_BUDGET = 2 * 1024 * 1024   # bytes, the whole committed corpus
FILE_BUDGET = 64 * 1024           # bytes, one input


@pytest.fixture(scope="module")
def replay_exe():
    return replay.build_replay()


def test_seeds_of_every_quantisation_load_and_infer(replay_exe, tmp_path):
    """Every seed is a valid file: init, infer, the decode step and verify
    succeed with finite logits (raw-id seed: its out-of-range ids are refused
    with COLIBRI_E_TOKEN). Big-endian seeds go through colibri_init's swap."""
    for name, data in gen_seeds.seeds().items():
        (tmp_path / name).write_bytes(data)
    results = {Path(r.path).name: r for r in
               replay.replay(replay_exe, sorted(tmp_path.iterdir()))}
    for name, r in results.items():
        assert (r.arena, r.init, r.verify) == (0, 0, 0), r
        if name == "seed-int8-raw-ids":
            assert r.infer == -8 and "out of range" in r.detail, r
            continue
        assert (r.infer, r.decode, r.nonfinite) == (0, 0, 0), r
    # Every quantisation is represented (f32, int8, mixed, big-endian, the
    # block types in both byte orders).
    kinds = {"f32", "int8", "mixed-a", "mixed-b", "be-f32", "be-int8", "v2-qwen2", "v2-qwen3",
             "v2-olmoe", "v2-granite", "v2-encdec-int8", "v2-encdec-be-f32", "q4-mix",
             "q4-blocks", "q4-blocks-be"}
    assert all(any(k in n for n in results) for k in kinds)


def test_committed_corpus_replays_clean_under_asan_ubsan(replay_exe):
    files = sorted(p for p in CORPUS.iterdir() if p.is_file())
    assert files, "fuzz/corpus/ is empty"
    results = replay.replay(replay_exe, files)   # raises on any sanitizer report
    # The corpus exercises the forward pass, not only the checks.
    assert sum(r.infer == 0 for r in results) >= 3, [r.init for r in results]
    assert len({r.init for r in results}) >= 3   # several distinct init outcomes


def test_committed_corpus_holds_every_block_type_in_both_byte_orders():
    """The committed corpus (replayed above under the sanitizers) carries
    valid files holding Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K, little- and big-endian, so the
    replay reaches the block kernels and the blocks' swap without the seeds."""
    from colibri.file import format as F
    from colibri.errors import FormatError
    seen = set()
    for path in CORPUS.iterdir():
        try:
            cf = F.parse(path.read_bytes()[:-gen_seeds.TAIL])
        except FormatError:
            continue
        seen |= {(cf.byte_order, F.DType(e.dtype)) for e in cf.entries}
    for order in ("little", "big"):
        for dt in (F.DType.Q4_0, F.DType.Q5_0, F.DType.Q8_0, F.DType.Q4_K, F.DType.Q5_K,
                   F.DType.Q6_K):
            assert (order, dt) in seen, (order, dt.name)


def test_committed_seeds_are_todays_seeds():
    """fuzz/run.sh merge keeps the corpus's seed-* inputs whatever its size
    budget (the block-type files, 16 KB each, were the first it dropped) and
    refreshes them from gen_seeds.py: each must be what gen_seeds.py makes
    today, so a format change that stales them shows here, not as a corpus
    that silently stops reaching the block kernels."""
    committed = sorted(CORPUS.glob("seed-*"))
    assert {p.name for p in committed} >= {"seed-q4-blocks", "seed-q4-blocks-be"}
    today = gen_seeds.seeds()
    for p in committed:
        assert p.name in today, f"{p.name}: gen_seeds.py no longer makes it; remove it"
        assert p.read_bytes() == today[p.name], (
            f"fuzz/corpus/{p.name} is not gen_seeds.py's today: fuzz/run.sh merge refreshes it")


def test_regression_inputs_are_handled(replay_exe):
    """regress-* inputs once crashed the library (UB under UBSan). The NaN
    one (NaN int8 scales with valid CRCs) reached the activation quantiser;
    init now refuses non-finite weights outright, naming the tensor, and the
    quantiser maps NaN to 0 besides (tests/c/test_kernels.c)."""
    regress = sorted(CORPUS.glob("regress-*"))
    assert regress
    for r in replay.replay(replay_exe, regress):
        if "nan" in Path(r.path).name:
            assert r.init == -1 and "non-finite" in r.detail, r
        else:
            assert r.init == 0 and r.infer == 0, r


def test_corpus_stays_small():
    files = [p for p in CORPUS.iterdir() if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    assert total <= CORPUS_BUDGET, f"fuzz/corpus is {total} bytes; minimise: fuzz/run.sh merge"
    big = [p.name for p in files if p.stat().st_size > FILE_BUDGET]
    assert not big, big


def test_run_sh_builds_the_library_sources():
    from colibri.buildsteps import sources
    text = (ROOT / "fuzz" / "run.sh").read_text()
    listed = re.search(r'^SOURCES="([^"]*)"', text, re.M).group(1).split()
    assert set(listed) == set(sources.LIBRARY)
    avx2 = sources.KERNELS["avx2"]
    assert all(src in text for src in avx2.sources) and avx2.define in text


def test_harness_reports_a_broken_file(replay_exe, tmp_path):
    """The replay output tells failures apart (not a constant 'ok'): a flipped
    section byte without CRC repair is a CRC error, the same flip with the
    harness's CRC repair loads."""
    raw = bytearray(gen_seeds.model_bytes(gen_seeds.TINY, gen_seeds.F.PRESET_F32))
    raw[-100] ^= 0x01
    (tmp_path / "crc").write_bytes(replay.with_tail(bytes(raw), replay.VERIFY))
    (tmp_path / "fixed").write_bytes(replay.with_tail(bytes(raw),
                                                      replay.VERIFY | replay.FIX_CRCS))
    crc, fixed = replay.replay(replay_exe, [tmp_path / "crc", tmp_path / "fixed"])
    assert crc.init == -3 and crc.verify == -3 and "LM_HEAD" in crc.detail
    assert fixed.init == 0 and fixed.verify == 0
