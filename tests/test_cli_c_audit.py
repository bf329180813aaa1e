"""colibri-cli and the C library on an audit's findings: each test runs the
real command (or the binding over the same libcolibri.so) and holds what a
user reads to a figure from elsewhere: the header as colibri/file/format.py
reads it, the instance measured with the other option, the printf rules.

1. --slots with --ram: slots that need more than the budget are refused
   (COLIBRI_E_NO_MEMORY naming the slots, the bytes and the budget).
2. --info's resident total for the other KV cache type is the total a run
   with that type measures (an encoder-decoder's cross-attention cache
   changes with the type too).
3. --verify names a damaged tokenizer section "tokenizer".
4. colibri_set_threads' detail writes its flags as 0x0, not 0x0x0.
5. a prompt longer than max_seq_len is refused with its numbers, and
   without naming a --generate that was not given.
6. streaming an encoder-decoder says no build does (not "by this build").
7. a GGUF file is named as one, with the command that converts it.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from colibri import errors, runtime
from colibri.file import format as F
from colibri.model import memory
from test_runtime_support import c_build  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"
KIND_TOKENIZER = 256  # docs/FORMAT.md: the tokenizer section's kind


@pytest.fixture(scope="module")
def cli(c_build):
    return c_build("host").cli


@pytest.fixture(scope="module")
def so(c_build):
    return c_build("host").so


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """The demo checkpoint converted (int8, with its tokenizer): 32 routed
    experts, max_seq_len 256."""
    out = tmp_path_factory.mktemp("audit") / "demo-int8.colibri"
    p = subprocess.run([str(VENV_BIN / "colibri"), "convert", str(ROOT / "models/demo/checkpoint"),
                        "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return out


@pytest.fixture(scope="module")
def switch(tmp_path_factory) -> Path:
    """tests/golden_switch.py's tiny Switch Transformers, converted (int8,
    as `colibri convert` does by default)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from colibri.model.convert import ColibriExporter
    from golden_switch import make_switch
    out = tmp_path_factory.mktemp("audit-switch") / "switch.colibri"
    return ColibriExporter(model=make_switch(seed=0), quant="int8").export(out)


def run(cli, *args, ok=True):
    p = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def one_line(p: subprocess.CompletedProcess, status: int = 1) -> str:
    lines = p.stderr.splitlines()
    assert p.returncode == status and len(lines) == 1, (p.returncode, p.stderr)
    assert lines[0].startswith("colibri-cli: "), p.stderr
    return lines[0]


def field(text: str, name: str) -> int:
    return int(re.search(rf"^{name}: (\d+)", text, re.M).group(1))


# 1 ------------------------------------------------------------------------

def test_slots_that_need_more_than_the_budget_are_refused(cli, so, demo):
    """What the instance of N slots holds (its --info resident_total,
    measured without a budget) is the least --ram that N slots may be given:
    that budget runs (and holds them), a byte less is COLIBRI_E_NO_MEMORY
    naming N, the bytes and the budget, from colibri-cli and the binding
    alike; the auditor's --slots 30 --ram 1M (3.4 times the budget) too."""
    for n in (2, 30):
        total = field(run(cli, "--model", demo, "--slots", n, "--info").stdout,
                      "resident_total")
        fits = run(cli, "--model", demo, "--slots", n, "--ram", total, "--info").stdout
        assert field(fits, "resident_total") == total
        assert re.search(rf"^expert_slots: {n} of", fits, re.M), fits
        line = one_line(run(cli, "--model", demo, "--slots", n, "--ram", total - 1,
                            "--info", ok=False))
        assert "out of memory" in line, line
        assert (f"{n} expert slots need {total} bytes, more than the {total - 1}-byte "
                f"budget: fewer slots, or leave the slot count to the budget") in line, line
        with pytest.raises(errors.OutOfMemoryError, match=f"{n} expert slots need {total} "):
            runtime.Model(demo, slots=n, ram=total - 1, library=so)
    line = one_line(run(cli, "--model", demo, "--slots", 30, "--ram", "1M", "--info",
                        ok=False))
    assert "more than the 1048576-byte budget" in line, line


# 2 ------------------------------------------------------------------------

def _totals(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^resident_total_kv_(f32|i8): (\d+) bytes",
                                             text, re.M)}


@pytest.mark.parametrize("which", ["demo", "switch"])
def test_info_predicts_the_total_the_other_kv_type_measures(cli, which, request):
    """--info prints resident_total_kv_f32 and _i8; the one of the other
    type must be what a run with that --kv measures (its own arena_bytes,
    file_size + arena). An encoder-decoder keeps its cross-attention cache
    in the KV type too, so 'this arena minus this cache plus the other
    cache' is wrong for it (the auditor's finding). Both agree with
    colibri/model/memory.py's model of the arena (what `colibri info`
    prints), buffer by buffer in Python."""
    path = request.getfixturevalue(which)
    cf = F.read_file(path, check_crc=False)
    shape, desc = cf.shape, cf.desc
    cf.close()
    seen = {}
    for kv in ("f32", "i8"):
        out = run(cli, "--model", path, "--kv", kv, "--info").stdout
        measured = field(out, "file_size") + field(out, "arena_bytes")
        assert re.search(rf"^resident_total_kv_{kv}: {measured} bytes .*\(this run\)$",
                         out, re.M), out
        assert measured == path.stat().st_size + memory.arena_bytes(
            shape, desc, kv, memory.CHUNK_TOKENS_OWNED), (which, kv)
        seen[kv] = (measured, _totals(out))
    for kv, other in (("f32", "i8"), ("i8", "f32")):
        assert seen[kv][1][other] == seen[other][0], (which, kv, seen)


# 3 ------------------------------------------------------------------------

def test_verify_names_a_damaged_tokenizer_section(cli, demo, tmp_path):
    cf = F.read_file(demo)
    index, entry = next((i, e) for i, e in enumerate(cf.entries)
                        if int(e.kind) == KIND_TOKENIZER)
    cf.close()
    raw = bytearray(demo.read_bytes())
    raw[entry.offset + entry.size // 2] ^= 0x10
    bad = tmp_path / "bad-tokenizer.colibri"
    bad.write_bytes(bytes(raw))
    p = run(cli, "--model", bad, "--verify", ok=False)
    assert p.returncode == 1, p.stderr
    assert f"tensor {index} (tokenizer)" in p.stdout, p.stdout
    assert "unknown" not in p.stdout, p.stdout


# 4 ------------------------------------------------------------------------

def test_thread_count_error_writes_hex_once(so, demo):
    """clb_detail's %x writes the 0x itself (src/detail.c)."""
    with pytest.raises(errors.ArgumentError) as e:
        runtime.Model(demo, threads=0, library=so)
    assert "flags 0x0)" in str(e.value) and "0x0x" not in str(e.value), str(e.value)


# 5 ------------------------------------------------------------------------

def test_a_prompt_longer_than_max_seq_len_says_its_numbers(cli, demo):
    cf = F.read_file(demo)
    s = cf.shape.max_seq_len
    cf.close()
    ids = lambda n: ",".join(["1"] * n)  # noqa: E731
    line = one_line(run(cli, "--model", demo, "--tokens", ids(s + 6), ok=False))
    assert f"({s + 6} prompt tokens exceed the model's max_seq_len {s})" in line, line
    assert "generate" not in line and "--max-seq-len" in line, line
    # one past the end, without --generate: refused the same way
    line = one_line(run(cli, "--model", demo, "--tokens", ids(s + 1), ok=False))
    assert f"{s + 1} prompt tokens exceed" in line, line
    line = one_line(run(cli, "--model", demo, "--tokens", ids(s - 2), "--generate", 4,
                        ok=False))
    assert f"({s - 2} prompt tokens + 4 to generate exceed the model's max_seq_len {s})" \
        in line, line
    assert "--generate" in line and "--max-seq-len" in line, line
    # the last generated token is printed, not fed back: s - 2 + 3 positions fit
    out = run(cli, "--model", demo, "--tokens", ids(s - 2), "--generate", 3).stdout
    assert len(re.search(r"^generated: (.*)$", out, re.M).group(1).split()) == 3


# 6 ------------------------------------------------------------------------

@pytest.mark.parametrize("opts", [("--slots", "2"), ("--ram", "64K")])
def test_streaming_an_encoder_decoder_says_no_build_does(cli, so, switch, opts):
    line = one_line(run(cli, "--model", switch, *opts, "--info", ok=False))
    assert "by this build" not in line, line
    assert "streaming is for decoder-only files" in line and "all-resident" in line, line
    assert "--ram/--slots" in line, line
    with pytest.raises(errors.ArgumentError, match="decoder-only"):
        runtime.Model(switch, slots=2, library=so)
    # a budget that holds it all loads it all-resident, as documented
    out = run(cli, "--model", switch, "--ram", "1G", "--info").stdout
    assert re.search(r"^load: mmap", out, re.M), out


# 7 ------------------------------------------------------------------------

def test_a_gguf_file_is_named_with_the_command_that_converts_it(cli, so, tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(252))  # the magic, then anything
    convert = "convert it with `colibri convert FILE.gguf -o FILE.colibri`"
    line = one_line(run(cli, "--model", gguf, "--info", ok=False))
    assert f"a GGUF file, not a .colibri file: {convert}" in line, line
    assert line.count("colibri convert") == 1 and "copy it again" not in line, line
    p = run(cli, "--model", gguf, "--verify", ok=False)
    assert p.returncode == 1 and "FAIL structure: a GGUF file" in p.stdout, p.stdout
    assert convert in one_line(p), p.stderr
    with pytest.raises(errors.RuntimeCallError, match="a GGUF file, not a .colibri file"):
        runtime.Model(gguf, library=so)
    # any other magic keeps its own words
    other = tmp_path / "other.bin"
    other.write_bytes(b"GGUG" + bytes(252))
    line = one_line(run(cli, "--model", other, "--info", ok=False))
    assert "not \"CLBR\"" in line and "GGUF" not in line, line


def test_ram_takes_the_units_the_binding_takes(cli, demo):
    """--ram 3MiB, 3MB and 3M are the same budget (powers of 1024), as
    Model(ram=...) reads them (colibri.runtime.parse_size)."""
    want = runtime.parse_size("3M")
    assert runtime.parse_size("3MiB") == runtime.parse_size("3MB") == want
    # the slots the budget gives (the other lines may say whether the page
    # cache held the file, which is not the budget's doing)
    slots = {size: [line for line in run(cli, "--model", str(demo), "--ram", size,
                                         "--info").stdout.splitlines()
                    if line.startswith("expert_slots:")]
             for size in ("3M", "3MiB", "3MB", f"{want}B")}
    assert len({tuple(v) for v in slots.values()}) == 1 and slots["3M"], slots
    assert run(cli, "--model", str(demo), "--ram", "3Mb2", "--info", ok=False).returncode == 2


# (string, bytes) both readers take, and strings both refuse: under a byte
# ("0.5" was 0, no budget at all, in colibri-cli), past 64 bits, not a
# number, "i" without a unit
RAM_GOOD = [("0.5K", 512), ("2g", 2 << 30), ("1.5M", 3 << 19), ("3mib", 3 << 20),
            ("4096B", 4096), ("+1e3", 1000), (".5G", 1 << 29)]
RAM_BAD = ["0.5", "0", "-1M", "inf", "nan", "1e400", "1e30G", "3iB", "2Gx", "M", "0x10M"]


def test_ram_sizes_both_readers_agree_on(cli, demo):
    """colibri-cli --ram and Model(ram=) take the same strings to the same
    bytes and refuse the same ones: the CLI with its usage error (exit 2),
    the binding with ArgumentError, never a traceback of another kind."""
    for text, want in RAM_GOOD:
        assert runtime.parse_size(text) == want, text
        assert run(cli, "--model", str(demo), "--ram", text, "--info", ok=False).returncode != 2, text
    for text in RAM_BAD:
        with pytest.raises(errors.ArgumentError, match="ram="):
            runtime.parse_size(text)
        p = run(cli, "--model", str(demo), "--ram", text, "--info", ok=False)
        assert "--ram takes a size" in one_line(p, status=2), (text, p.stderr)
