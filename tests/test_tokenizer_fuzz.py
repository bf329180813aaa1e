"""fuzz/fuzz_tokenizer.c: the tokenizer's libFuzzer target builds, and a short
run (hostile sections and hostile text/ids for a valid section, seeded with
real sections) finds nothing under ASan/UBSan."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from colibri.text import tokenizer as T
from colibri.buildsteps import sources

import tokenizer_fixtures as tf
from test_tokenizer import trained  # noqa: F401
from test_tokenizer_unigram import unigram  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


_FUZZER: list[Path] = []


def build_fuzzer(tmp_path_factory) -> Path:
    """fuzz/fuzz_tokenizer.c with libFuzzer, ASan and UBSan (ref kernels),
    built once per process: the runs differ in their section and seeds,
    not in the binary (each test built its own: 10-14 s, seven times)."""
    if not _FUZZER:
        exe = tmp_path_factory.mktemp("fuzz-tokenizer") / "fuzz_tokenizer"
        subprocess.run(["clang", "-std=c11", "-g", "-O1", "-ffp-contract=off",
                        "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all",
                        "-Isrc/include", "-Isrc", "-Isrc/kernels", "-DCOLIBRI_KERNELS_REF_ONLY",
                        "-DCOLIBRI_ENABLE_MMAP=1", "fuzz/fuzz_tokenizer.c", *sources.LIBRARY,
                        "-lm", "-o", str(exe)], cwd=ROOT, check=True, timeout=600)
        _FUZZER.append(exe)
    return _FUZZER[0]


def run_fuzzer(exe: Path, seeds: Path, section: Path, max_len: int) -> None:
    """4,000 runs from seeds, with section as the valid one text runs use:
    clean (no sanitizer report, no crash). In seeds' parent directory (a
    crash's artifacts go there, the test's own)."""
    proc = subprocess.run([str(exe), "-runs=4000", f"-max_len={max_len}", "-seed=1", str(seeds)],
                          env={"COLIBRI_FUZZ_SECTION": str(section), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=900, cwd=seeds.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Done 4000 runs" in proc.stderr


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")
@pytest.mark.parametrize("kind", ["bl-gpt2-300", "sp-300", "bl-deepseek-coder", "t5-300",
                                  "bl-mixed", "bl-falcon"])
def test_fuzz_tokenizer_short_run_is_clean(trained, unigram, tmp_path, tmp_path_factory, kind):
    """bl-deepseek-coder (300 pieces): a version 2 section with five stored
    regex programs, so hostile sections mutate programs and hostile text
    runs through the matcher. t5-300: a version 3 Unigram section (scores,
    the Viterbi, WhitespaceSplit + Metaspace, the eos template). bl-mixed:
    a normaliser program (Strip, Replace with regexes, Lowercase and its
    map, Prepend) over hostile text, and mutated programs. bl-falcon: steps
    over ByteLevel's byte alphabet (and invalid UTF-8 through them)."""
    exe = build_fuzzer(tmp_path_factory)
    hf = (tf.train_program_kind(kind, tf.corpus_text(1_000_000), vocab=300)
          if kind in tf.PROGRAM_KINDS else unigram(kind) if kind in tf.UNIGRAM_KINDS
          else tf.train_norm_kind(kind, tf.corpus_text(1_000_000), vocab=300)
          if kind in tf.NORM_KINDS else trained(kind))
    sec = T.pack_section(T.spec_from_json(json.loads(hf.to_str())),
                         "big" if kind.startswith("sp") else "little")
    (tmp_path / "good.bin").write_bytes(sec)
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for i, b in enumerate(tf.test_strings(40, seed=2)):
        (seeds / f"t{i}").write_bytes(b"\x01" + b)
    if len(sec) < 65536:
        (seeds / "sec").write_bytes(b"\x00" + struct.pack("<H", len(sec)) + sec + b"Hi there")
    run_fuzzer(exe, seeds, tmp_path / "good.bin", 8192)
