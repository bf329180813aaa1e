"""The C tokenizer (src/tokenizer.c) judged by Hugging Face `tokenizers`:
ids and decoded text on 10,000 strings per tokenizer on x86_64, a smaller set
under ASan/UBSan and under QEMU (armv7, ppc: big-endian), the model-file path
in both byte orders, buffer-too-small, strict UTF-8, damaged sections.
Driver: tests/c/tokenize_driver.c."""
from __future__ import annotations

import json
import random
import struct
import subprocess
from pathlib import Path

import pytest

from colibri.buildsteps import cbuild
from colibri.text import tokenizer as T
from colibri.model.convert import ColibriExporter

import tokenizer_fixtures as tf
from test_runtime_support import TESTS_C, c_build  # noqa: F401
from test_tokenizer import _checkpoint, strings, trained  # noqa: F401

tokenizers = pytest.importorskip("tokenizers")

E_TOK_BUFFER, E_TOK_UTF8, E_TOK_FORMAT, E_TOKEN = -32, -33, -31, -8
PARSE_SPECIAL, ADD_BOS, STRICT = 2, 1, 4


@pytest.fixture(scope="session")
def driver(c_build, tmp_path_factory):
    cache = {}

    def get(variant):
        if variant not in cache:
            b = c_build(variant)
            out = tmp_path_factory.mktemp(f"tokdrv-{variant}") / "tokenize_driver"
            cbuild.build_program(b.info, [TESTS_C / "tokenize_driver.c"], out)
            cache[variant] = (b, out)
        return cache[variant]
    return get


def run(driver_pair, mode, path, requests, tmp: Path, timeout=600):
    """requests: [(op, flags, cap, payload bytes)] -> per request a tuple."""
    build, prog = driver_pair
    tmp.mkdir(parents=True, exist_ok=True)
    inp, out = tmp / "in.bin", tmp / "out.bin"
    with open(inp, "wb") as f:
        for op, flags, cap, payload in requests:
            f.write(op.encode() + struct.pack("<III", flags, cap, len(payload)) + payload)
    proc = subprocess.run([*build.runner, str(prog), mode, str(path), str(inp), str(out)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data, at, res = out.read_bytes(), 0, []
    for op, *_ in requests:
        rc, n = struct.unpack_from("<iI", data, at)
        at += 8
        if op == "T":
            ids = list(struct.unpack_from(f"<{n}i", data, at)) if rc == 0 else []
            at += 4 * len(ids)
            res.append((rc, n, ids))
        else:
            text = data[at:at + (n if rc == 0 else 0)]
            at += len(text)
            src, m = struct.unpack_from("<iI", data, at)
            at += 8
            stream = data[at:at + m]
            at += m
            res.append((rc, text, src, stream))
    assert at == len(data)
    return res


def section_file(hf, tmp: Path, byte_order="little") -> Path:
    p = tmp / f"section-{byte_order}.bin"
    p.write_bytes(T.pack_section(T.spec_from_json(json.loads(hf.to_str())), byte_order))
    return p


def ids_req(b: bytes, flags=PARSE_SPECIAL, cap=None):
    return ("T", flags, 4 * len(b) + 8 if cap is None else cap, b)


def dec_req(ids, flags=0, cap=None):
    return ("D", flags, 16 * len(ids) + 64 if cap is None else cap,
            struct.pack(f"<{len(ids)}I", *ids))


def check_kind(drv, hf, strs, tmp, byte_order="little", n_random=1000):
    sec = section_file(hf, tmp, byte_order)
    want = [hf.encode(tf.hf_text(b), add_special_tokens=False).ids for b in strs]
    got = run(drv, "section", sec, [ids_req(b) for b in strs], tmp / "t")
    bad = [(b, w, g) for b, w, (rc, _, g) in zip(strs, want, got) if rc != 0 or g != w]
    assert not bad, f"{len(bad)} of {len(strs)} differ, first {bad[:2]!r}"
    rng = random.Random(5)
    n = hf.get_vocab_size(with_added_tokens=True)
    seqs = want[:len(strs) // 3] + [[rng.randrange(n) for _ in range(rng.randint(1, 12))]
                                    for _ in range(n_random)]
    for skip in (0, 1):
        res = run(drv, "section", sec, [dec_req(s, skip) for s in seqs], tmp / f"d{skip}")
        for s, (rc, text, src, stream) in zip(seqs, res):
            w = hf.decode(s, skip_special_tokens=bool(skip)).encode()
            assert rc == 0 and text == w, (s, text, w)
            assert src == 0 and stream == w, (s, stream, w)


@pytest.mark.parametrize("kind", tf.KINDS)
def test_c_ids_and_text_equal_tokenizers_on_10000_strings(driver, trained, strings, kind,
                                                          tmp_path):
    check_kind(driver("host"), trained(kind), strings, tmp_path, n_random=2000)


@pytest.mark.parametrize("kind", tf.KINDS)
def test_c_under_asan_ubsan(driver, trained, strings, kind, tmp_path):
    check_kind(driver("asan"), trained(kind), strings[:1500], tmp_path, "big", n_random=300)


@pytest.mark.parametrize("variant", ["armv7", "ppc"])
@pytest.mark.parametrize("kind", tf.KINDS)
def test_c_under_qemu(driver, trained, strings, kind, variant, tmp_path):
    check_kind(driver(variant), trained(kind), strings[:300], tmp_path, "big" if variant == "ppc"
               else "little", n_random=100)


def hostile_words() -> list[bytes]:
    """Single pre-tokenizer words of 64 KiB (and a few shorter): the BPE
    merge loop's worst inputs. Random letters apply many distinct merges;
    repeats apply few merges many times; CJK is 3 bytes a character."""
    rng = random.Random(11)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [
        "".join(rng.choice(letters) for _ in range(65536)).encode(),
        b"a" * 65536,
        b"ab" * 32768,
        "".join(rng.choice("thequickbrownfox") for _ in range(65536)).encode(),
        "".join(rng.choice("日本語中文字") for _ in range(21845)).encode(),
        "".join(rng.choice(letters) for _ in range(4097)).encode(),
    ]


@pytest.mark.parametrize("variant", ["host", "asan"])
@pytest.mark.parametrize("kind", tf.KINDS)
def test_c_long_hostile_words_equal_tokenizers(driver, trained, kind, variant, tmp_path):
    """64 KiB words: the ids are tokenizers' (the merge loop sweeps every
    occurrence of the lowest-rank pair at once; src/tokenizer.c merge_all).
    Measured on one x86_64 core, 64 KiB of random letters, 300-piece
    byte-level tokenizer: 7.4 s before the sweep, 0.15 s after. Also under
    ASan/UBSan (the sweep compacts the word in place)."""
    check_kind(driver(variant), trained(kind), hostile_words(), tmp_path, n_random=10)


def test_c_merge_order_of_a_hand_made_merge_list(driver, tmp_path):
    """A merge list whose result is used by an EARLIER merge ("a"+"ab" before
    "a"+"b"): after a merge creates a pair that outranks the one being
    swept, the sweep must stop and rescan, as tokenizers' priority queue
    does. Judged by tokenizers on words that hit that case."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {c: i for i, c in enumerate("abc")}
    vocab.update({"ab": 3, "aab": 4, "abab": 5, "ba": 6, "bab": 7})
    merges = [("a", "ab"), ("ab", "ab"), ("b", "ab"), ("a", "b"), ("b", "a")]
    hf = Tokenizer(models.BPE(vocab, merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True,
                                                 trim_offsets=False)
    hf.decoder = decoders.ByteLevel()
    # the byte alphabet pieces for anything else: only a, b, c appear below
    words = [w.encode() for w in ("aab", "abab", "aabab", "babab", "ababab", "aaabbb",
                                  "abababab", "baab", "abba", "cabab", "aababaab")]
    rng = random.Random(3)
    words += ["".join(rng.choice("ab") for _ in range(rng.randint(2, 40))).encode()
              for _ in range(300)]
    sec = section_file(hf, tmp_path)
    want = [hf.encode(w.decode(), add_special_tokens=False).ids for w in words]
    got = run(driver("host"), "section", sec, [ids_req(w) for w in words], tmp_path / "t")
    bad = [(w, x, g) for w, x, (rc, _, g) in zip(words, want, got) if rc != 0 or g != x]
    assert not bad, f"{len(bad)} of {len(words)} differ, first {bad[:3]!r}"


@pytest.mark.parametrize("byte_order", ["little", "big"])
def test_c_from_the_model_file(driver, trained, strings, tmp_path, byte_order):
    """colibri_tokenizer_init finds the section in a converted file (a
    big-endian file is byte-swapped by colibri_init; the section is read
    through its own byte-order mark); bos is the template's <s>."""
    hf = trained("sp-300")
    ck = _checkpoint(tmp_path / "ck", hf)
    path = ColibriExporter(ck, quant="f32", byte_order=byte_order).export(tmp_path / "m.colibri")
    strs = strings[:500]
    res = run(driver("host"), "model", path, [ids_req(b, PARSE_SPECIAL | ADD_BOS) for b in strs],
              tmp_path / "t")
    for b, (rc, _, ids) in zip(strs, res):
        assert rc == 0 and ids == hf.encode(tf.hf_text(b)).ids, b


def test_c_model_without_tokenizer(driver, tmp_path, trained):
    ck = _checkpoint(tmp_path / "ck", None)
    path = ColibriExporter(ck, quant="f32").export(tmp_path / "m.colibri")
    build, prog = driver("host")
    (tmp_path / "in.bin").write_bytes(b"")
    proc = subprocess.run([str(prog), "model", str(path), str(tmp_path / "in.bin"),
                           str(tmp_path / "out.bin")], capture_output=True, text=True)
    assert proc.returncode == 11 and proc.stdout.startswith("error -30 the model file holds "
                                                            "no tokenizer"), proc.stdout


def test_c_buffer_too_small_reports_what_is_needed(driver, trained, strings, tmp_path):
    """Every cap below the count: -32 with a capacity with which the call
    succeeds: exact when every word fits the stack scratch (byte-level words
    here), else an upper bound (a SentencePiece text run is one word)."""
    for kind in ("bl-qwen2-32k", "sp-300"):
        hf = trained(kind)
        sec = section_file(hf, tmp_path)
        strs = [b for b in strings[:400] if b]
        want = [hf.encode(tf.hf_text(b), add_special_tokens=False).ids for b in strs]
        reqs = [ids_req(b, cap=len(w) - 1 - (i % 3)) for i, (b, w) in enumerate(zip(strs, want))
                if len(w) > 3]
        res = run(driver("host"), "section", sec, reqs, tmp_path / kind)
        retry = []
        for (_, _, cap, b), (rc, n, _) in zip(reqs, res):
            w = hf.encode(tf.hf_text(b), add_special_tokens=False).ids
            assert rc == E_TOK_BUFFER and n >= len(w), (b, cap, rc, n, len(w))
            if kind.startswith("bl") or len(b) < 100:
                assert n == len(w), (b, n, len(w))
            retry.append(ids_req(b, cap=n))
        res = run(driver("host"), "section", sec, retry, tmp_path / (kind + "-retry"))
        for (_, _, _, b), (rc, n, ids) in zip(retry, res):
            assert rc == 0 and ids == hf.encode(tf.hf_text(b), add_special_tokens=False).ids
        # a word longer than the scratch (128) that does not fit: an upper bound
        long = b"a" * 5000
        (rc, n, _), = run(driver("host"), "section", sec, [ids_req(long, cap=3)], tmp_path / "l")
        (rc2, n2, ids), = run(driver("host"), "section", sec, [ids_req(long, cap=n)],
                              tmp_path / "l2")
        w = hf.encode("a" * 5000, add_special_tokens=False).ids
        assert rc == E_TOK_BUFFER and n >= len(w) and rc2 == 0 and ids == w
        # decoding into a buffer too small
        (rc, text, _, _), = run(driver("host"), "section", sec, [dec_req(w, cap=10)],
                                tmp_path / "d")
        assert rc == E_TOK_BUFFER


def test_c_strict_utf8_and_bad_ids(driver, trained, tmp_path):
    sec = section_file(trained("bl-gpt2-300"), tmp_path)
    res = run(driver("host"), "section", sec,
              [ids_req(b"ok \xe2\x82 x", PARSE_SPECIAL | STRICT), ids_req(b"ok \xe2\x82 x"),
               dec_req([5, 10 ** 6]), dec_req([5, 0xFFFFFFFF])], tmp_path / "r")
    assert res[0][:2] == (E_TOK_UTF8, 3)
    hf = trained("bl-gpt2-300")
    assert res[1][0] == 0 and res[1][2] == hf.encode("ok \ufffd x").ids
    assert res[2][0] == E_TOKEN and res[2][2] == E_TOKEN
    assert res[3][0] == E_TOKEN


# A tokenize and a decode request, as run_raw takes them.
HOSTILE_REQUESTS = (b"T" + struct.pack("<III", PARSE_SPECIAL, 64, 23)
                    + "Hello ünïcödé 日本 😀 1".encode()[:23]
                    + b"D" + struct.pack("<III", 0, 256, 12) + struct.pack("<3I", 1, 5, 300))


def run_raw(driver_pair, section: Path, requests: bytes, tmp: Path) -> subprocess.CompletedProcess:
    """The driver over a section file that may be refused (exit 11 and the
    error on stdout): the process, for its exit status and sanitizer output."""
    _, prog = driver_pair
    (tmp / "in.bin").write_bytes(requests)
    return subprocess.run([str(prog), "section", str(section), str(tmp / "in.bin"),
                           str(tmp / "out.bin")], capture_output=True, text=True, timeout=60)


HOSTILE_TEXT = "Hello ünïcödé 日本 😀 1".encode()


def assert_both_readers_refuse(driver_pair, sections, tmp: Path, code: int = -31) -> None:
    """Each section: parse_section raises, and the C library (under the
    driver, ASan/UBSan) refuses it with `code` (COLIBRI_E_TOK_FORMAT)."""
    for k, b in enumerate(sections):
        with pytest.raises(T.TokenizerError):
            T.parse_section(b)
        p = tmp / f"h{k}.bin"
        p.write_bytes(b)
        proc = run_raw(driver_pair, p, HOSTILE_REQUESTS, tmp)
        assert proc.returncode == 11 and proc.stdout.startswith(f"error {code}"), \
            (k, proc.stdout + proc.stderr)


def both_readers_verdict(driver_pair, section: bytes, tmp: Path) -> int:
    """0 when the C library (under ASan/UBSan, never a sanitizer report)
    and parse_section both take the section and tokenize HOSTILE_TEXT, 11
    when both refuse it; fails when they disagree."""
    p = tmp / "damaged.bin"
    p.write_bytes(section)
    proc = run_raw(driver_pair, p, HOSTILE_REQUESTS, tmp)
    assert proc.returncode in (0, 11), proc.stdout + proc.stderr
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, proc.stderr
    try:
        T.Tokenizer(T.parse_section(section)).encode(HOSTILE_TEXT)
        py = 0
    except T.TokenizerError:
        py = 11
    assert py == proc.returncode, proc.stdout
    return py


def test_c_damaged_sections_never_crash(driver, trained, tmp_path):
    """Bit flips, truncations, overwritten header words, under ASan/UBSan:
    init returns COLIBRI_E_TOK_FORMAT or the tokenizer works."""
    base = T.pack_section(T.spec_from_json(json.loads(trained("sp-300").to_str())))
    rng = random.Random(7)
    drv = driver("asan")
    verdicts = {}
    for trial in range(120):
        b = tf.damage_section(base, rng, trial)
        p = tmp_path / f"s{trial}.bin"
        p.write_bytes(bytes(b))
        proc = run_raw(drv, p, HOSTILE_REQUESTS, tmp_path)
        assert proc.returncode in (0, 11), proc.stdout + proc.stderr
        assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, proc.stderr
        if proc.returncode == 11:
            assert proc.stdout.startswith("error -31 the tokenizer section is malformed")
        verdicts[proc.returncode] = verdicts.get(proc.returncode, 0) + 1
    assert verdicts.get(11, 0) > 60, verdicts


def test_build_without_the_tokenizer(tmp_path):
    """-DCOLIBRI_NO_TOKENIZER (scons tokenizer=0): the API is there and says
    COLIBRI_E_UNSUPPORTED; the Cortex-M library is the documentation's figure
    (the README's headline, docs/C_API.md)."""
    import re
    import shutil
    import sys
    info = cbuild.build(tmp_path / "b", kernels=("ref",), defines=("COLIBRI_NO_TOKENIZER",),
                        cli=False)
    prog = cbuild.build_program(info, [TESTS_C / "tokenize_driver.c"], tmp_path / "drv")
    (tmp_path / "s.bin").write_bytes(b"CTOK" + bytes(200))
    proc = subprocess.run([str(prog), "section", str(tmp_path / "s.bin"), "x", "y"],
                          capture_output=True, text=True)
    assert proc.returncode == 11 and proc.stdout.startswith("error -12 built without the "
                                                            "tokenizer"), proc.stdout
    from colibri.buildsteps.size import measure_runtime
    import targets
    t = targets.load_all()["cortex-m"]
    if shutil.which(t.tool("gcc")) is None:
        pytest.skip("arm-none-eabi-gcc not installed")
    root = Path(__file__).resolve().parent.parent
    lib = tmp_path / "cortex-m" / "libcolibri.a"
    p = subprocess.run([str(Path(sys.executable).parent / "scons"), "-Q", "-j2",
                        "target=cortex-m", "tokenizer=0", f"build_dir={tmp_path}", str(lib)],
                       cwd=root, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    kinds, _ = measure_runtime(lib)
    kib = f"{sum(kinds.values()) / 1024:.1f}"
    from docs_text import doc_text
    docs = doc_text()
    assert f"is then {kib} KiB instead of" in docs and f"({kib} and " in docs, kib


def _c_bytes(b: bytes) -> str:
    return "{" + ",".join(str(x) for x in b) + ("" if b else "0") + "}"


@pytest.mark.parametrize("kind", ["bl-gpt2-300", "sp-300"])
def test_c_on_cortex_m_under_qemu(trained, strings, kind, tmp_path):
    """Bare metal: section and cases compiled into a Cortex-M program with
    the library scons builds for the target, run under qemu-system-arm."""
    check_on_cortex_m(trained(kind), strings, tmp_path)


def check_on_cortex_m(hf, strings, tmp_path, scons_vars=()):
    """The first 200 strings under 400 bytes: tokenizers' ids and decoded
    text, by the Cortex-M library (built with scons_vars) under
    qemu-system-arm."""
    import shutil
    import targets
    t = targets.load_all()["cortex-m"]
    if shutil.which(t.tool("gcc")) is None or shutil.which(t.emulator[0]) is None:
        pytest.skip("Cortex-M toolchain or qemu-system-arm not installed")
    sec = T.pack_section(T.spec_from_json(json.loads(hf.to_str())))
    cases = [b for b in strings[:200] if len(b) < 400]
    lines = [f"static const unsigned char section[{len(sec)}] = {_c_bytes(sec)};",
             f"#define N_CASES {len(cases)}u"]
    texts, lens, idss, ns, decs, dlens = [], [], [], [], [], []
    for i, b in enumerate(cases):
        ids = hf.encode(tf.hf_text(b), add_special_tokens=False).ids
        dec = hf.decode(ids, skip_special_tokens=False).encode()
        lines.append(f"static const unsigned char t{i}[] = {_c_bytes(b)};")
        lines.append(f"static const int32_t i{i}[] = {{{','.join(map(str, ids)) or '0'}}};")
        lines.append(f"static const unsigned char d{i}[] = {_c_bytes(dec)};")
        texts.append(f"t{i}"); lens.append(str(len(b))); idss.append(f"i{i}")
        ns.append(str(len(ids))); decs.append(f"d{i}"); dlens.append(str(len(dec)))
    lines += [f"static const unsigned char *const case_text[] = {{{','.join(texts)}}};",
              f"static const size_t case_len[] = {{{','.join(lens)}}};",
              f"static const int32_t *const case_ids[] = {{{','.join(idss)}}};",
              f"static const size_t case_n[] = {{{','.join(ns)}}};",
              f"static const unsigned char *const case_dec[] = {{{','.join(decs)}}};",
              f"static const size_t case_dec_len[] = {{{','.join(dlens)}}};"]
    (tmp_path / "tok_cases.h").write_text("\n".join(lines) + "\n")
    from baremetal import build_and_run
    proc = build_and_run(t, "tests/c/tokenize_baremetal.c", tmp_path, "tok",
                         scons_vars=scons_vars)
    assert proc.returncode == 0 and f"tokenizer: {len(cases)} cases ok" in proc.stdout, \
        proc.stdout + proc.stderr


@pytest.mark.parametrize("kind", ["bl-qwen2-32k", "sp-300"])
def test_tokenize_detokenize_and_sample_allocate_nothing(c_build, trained, kind, tmp_path):
    """tests/c/test_tok_noalloc.c: wrapped allocators count 0 calls, then
    seccomp strict mode (no system call allowed) survives the same workload;
    the canary shows the counter fires."""
    b = c_build("host")
    wrap = "-Wl," + ",".join(f"--wrap={n}" for n in ("malloc", "calloc", "realloc", "free"))
    prog = cbuild.build_program(b.info, [TESTS_C / "test_tok_noalloc.c"], tmp_path / "na",
                                extra_ldflags=[wrap])
    hf = trained(kind)
    ck = _checkpoint(tmp_path / "ck", hf, vocab=32100 if "32k" in kind else 512)
    path = ColibriExporter(ck, quant="int8").export(tmp_path / "m.colibri")
    proc = subprocess.run([str(prog), str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wrap: 200 rounds, 0 intercepted" in proc.stdout
    assert "seccomp: rounds survived" in proc.stdout
    canary = subprocess.run([str(prog), str(path), "--canary-malloc"], capture_output=True,
                            text=True, timeout=300)
    assert canary.returncode == 1 and "1 intercepted" in canary.stdout
