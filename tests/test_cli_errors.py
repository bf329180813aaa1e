"""Every error one line that says what is wrong and what to do (issue 12 §2).

One table, one row per mistake a new user made: the real command is run as a
subprocess (`colibri`, `colibri-cli`, `scons`), and what the user sees is
checked: no Python traceback anywhere, exactly one error line (for scons: one
`scons: *** ...` line, whatever progress lines scons prints on stdout), the
documented exit status, the file named, and a fix named.

Damaged files are copies of a generated tiny model (colibri.buildsteps.
testmodel) with a byte flipped or the tail cut. Each scons row builds into its
own temporary build_dir and shares nothing with other tests; they fail while
SConstruct reads the model, before anything compiles, except the one row that
checks an error raised inside a build step.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from colibri.file import format as cformat
from colibri.buildsteps import testmodel
from colibri.file.format import Kind
import gguf_fixtures
from docs_text import doc_lines
from test_runtime_support import c_build  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
SCONS = str(ROOT / ".venv" / "bin" / "scons")

# The fixes the messages name (one of them per row).
CONVERT = "colibri convert HF_DIR -o FILE.colibri"
COPY_OR_CONVERT = "copy or convert the file again"
COPY_AGAIN = "copy it again or re-convert"
CHECKPOINT = "Hugging Face checkpoint directory (config.json and *.safetensors"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The inputs the rows name, by placeholder."""
    d = tmp_path_factory.mktemp("cli-errors")
    good = testmodel.make_model(d / "good.colibri", "int8")
    data = good.read_bytes()
    cf = cformat.read_file(good)
    last = cf.entry(Kind.LM_HEAD)
    cf.close()
    out = {"good": good}

    def damaged(name: str, raw: bytes) -> None:
        out[name] = d / name
        out[name].write_bytes(raw)

    text = b"this is not a model file\n"
    assert len(text) == 25
    damaged("text.txt", text)
    damaged("trunc.colibri", data[:-100])                    # inside LM_HEAD
    crc = bytearray(data)
    crc[last.offset + last.size // 2] ^= 0x40                 # one bit of LM_HEAD
    damaged("crc.colibri", bytes(crc))
    hdr = bytearray(data)
    hdr[9] ^= 1                                               # vocab: header CRC
    damaged("hdr.colibri", bytes(hdr))
    out["missing.colibri"] = d / "missing.colibri"
    out["dir"] = d / "a-directory"
    out["dir"].mkdir()
    out["no-config"] = d / "no-config"                        # a dir, no config.json
    out["no-config"].mkdir()
    (out["no-config"] / "model.safetensors").write_bytes(b"")
    out["no-such-dir"] = d / "no-such-checkpoint"
    out["out"] = d / "out.colibri"
    out["model.gguf"] = gguf_fixtures.write_gguf(d / "model.gguf")
    # a KV cache of 100000 positions: about 25 MB of arena, Cortex-M has 4 MiB
    out["long.colibri"] = testmodel.make_model(
        d / "long.colibri", "int8", shape=dataclasses.replace(testmodel.FW_TINY,
                                                             max_seq_len=100000))
    return out


@dataclass(frozen=True)
class Row:
    id: str
    tool: str                 # "colibri", "cli" (colibri-cli) or "scons"
    args: tuple[str, ...]     # "{name}" is a path from `files`, "{build}" a fresh dir
    status: int
    file: str | None          # the placeholder whose path the message names
    fix: str                  # a fix the message names
    says: tuple[str, ...] = ()
    not_says: tuple[str, ...] = ()


ARMV7 = ("target=armv7", "build_dir={build}")

ROWS = [
    # 1. scons with a bad model=: the reader's message, no traceback, before
    #    anything compiles.
    Row("scons-truncated", "scons", (*ARMV7, "model={trunc.colibri}"), 2, "trunc.colibri",
        COPY_AGAIN, says=("the file is truncated (",)),
    Row("scons-text-file", "scons", (*ARMV7, "model={text.txt}"), 2, "text.txt",
        CONVERT, says=("file is 25 bytes, shorter than the 64-byte header",)),
    Row("scons-crc", "scons", (*ARMV7, "model={crc.colibri}"), 2, "crc.colibri",
        "copy or convert it again", says=("CRC mismatch in LM_HEAD",)),
    # 2. model= that does not exist: how to make one, and the default.
    Row("scons-missing", "scons", (*ARMV7, "model={missing.colibri}"), 2, "missing.colibri",
        CONVERT, says=("no such file", "leave out model=", "generated tiny model")),
    # An error inside a build step (the firmware prompt outside the model's
    # vocabulary) is one line too, not a traceback.
    Row("scons-build-step", "scons", (*ARMV7, "model={good}", "prompt=héllo"), 2, None,
        "leave out prompt=", says=("outside the model's vocabulary",)),
    # A bare-metal arena larger than the device's RAM: said before the link
    # (the linker's "region `RAM' overflowed" was four lines and a stop).
    Row("scons-arena-beyond-ram", "scons", ("target=cortex-m", "build_dir={build}",
                                            "model={long.colibri}"), 2, "long.colibri",
        "re-convert with a smaller --max-seq-len", says=("bytes of RAM", "kv=i8")),
    # 3. -1 means a bad file from init, too much input from infer: colibri-cli
    #    prints the one meaning of the call that failed.
    Row("cli-info-text-file", "cli", ("--model", "{text.txt}", "--info"), 1, "text.txt",
        "colibri convert", says=("bad .colibri file", "shorter than the 64-byte header"),
        not_says=("max_seq_len", "(infer)")),
    Row("cli-infer-too-long", "cli", ("--model", "{good}", "--tokens", ",".join(["1"] * 17)),
        1, "good", "--max-seq-len",
        says=("input larger than the model's max_batch/max_seq_len",),
        not_says=("bad .colibri", "(init)")),
    # 4. a CRC error says "corrupted" once (the row's `once` check below).
    Row("cli-info-crc", "cli", ("--model", "{crc.colibri}", "--info"), 1, "crc.colibri",
        COPY_OR_CONVERT, says=("CRC mismatch", "LM_HEAD")),
    Row("cli-info-header-crc", "cli", ("--model", "{hdr.colibri}", "--info"), 1,
        "hdr.colibri", COPY_OR_CONVERT, says=("header_crc",)),
    Row("colibri-info-header-crc", "colibri", ("info", "{hdr.colibri}"), 2, "hdr.colibri",
        "copy or convert it again", says=("header CRC mismatch",)),
    # 5. no --model: no stray "-" for a file that was never given.
    Row("cli-no-model", "cli", ("--info",), 2, None, "colibri-cli --help",
        says=("--model FILE is required",), not_says=("colibri-cli: -:",)),
    # 7. colibri info/verify on a 25-byte text file; truncation and CRC name a fix.
    Row("colibri-info-text-file", "colibri", ("info", "{text.txt}"), 2, "text.txt", CONVERT,
        says=("file is 25 bytes, shorter than the 64-byte header",),
        not_says=("not a .colibri file",)),
    Row("colibri-info-truncated", "colibri", ("info", "{trunc.colibri}"), 2, "trunc.colibri",
        COPY_AGAIN, says=(f"the file is truncated ({{size:trunc.colibri}} of "
                          f"{{size:good}} bytes)",)),
    # 8. `colibri verify`: 1 damaged (header, section, length, content), 2
    #    cannot check (missing, a directory).
    Row("verify-text-file", "colibri", ("verify", "{text.txt}"), 1, "text.txt", CONVERT,
        says=("file is 25 bytes, shorter than the 64-byte header",),
        not_says=("not a .colibri file",)),
    Row("verify-header-crc", "colibri", ("verify", "{hdr.colibri}"), 1, "hdr.colibri",
        "copy or convert it again", says=("header CRC mismatch",)),
    Row("verify-section-crc", "colibri", ("verify", "{crc.colibri}"), 1, "crc.colibri",
        COPY_OR_CONVERT, says=("1 of 41 sections damaged (listed above)",)),
    Row("verify-truncated", "colibri", ("verify", "{trunc.colibri}"), 1, "trunc.colibri",
        COPY_AGAIN, says=("the file is truncated (",)),
    Row("verify-missing", "colibri", ("verify", "{missing.colibri}"), 2, "missing.colibri",
        "check the path", says=("No such file or directory",)),
    Row("verify-directory", "colibri", ("verify", "{dir}"), 2, "dir",
        "give the path of a .colibri file", says=("Is a directory",)),
    # ... and `colibri-cli --verify` the same statuses.
    Row("cli-verify-text-file", "cli", ("--model", "{text.txt}", "--verify"), 1, "text.txt",
        "colibri convert", says=("bad .colibri file",)),
    Row("cli-verify-header-crc", "cli", ("--model", "{hdr.colibri}", "--verify"), 1,
        "hdr.colibri", "colibri convert"),
    Row("cli-verify-section-crc", "cli", ("--model", "{crc.colibri}", "--verify"), 1,
        "crc.colibri", COPY_OR_CONVERT, says=("1 part listed above",)),
    Row("cli-verify-truncated", "cli", ("--model", "{trunc.colibri}", "--verify"), 1,
        "trunc.colibri", "copy it again"),
    Row("cli-verify-missing", "cli", ("--model", "{missing.colibri}", "--verify"), 2,
        "missing.colibri", "check the path", says=("No such file or directory",)),
    Row("cli-verify-directory", "cli", ("--model", "{dir}", "--verify"), 2, "dir",
        "check the path", says=("Is a directory",)),
    # 9. `colibri convert` wants a checkpoint directory.
    Row("convert-file", "colibri", ("convert", "{text.txt}", "-o", "{out}"), 2, "text.txt",
        CHECKPOINT, says=("is not a directory",), not_says=("Errno", "config.json:")),
    Row("convert-missing-dir", "colibri", ("convert", "{no-such-dir}", "-o", "{out}"), 2,
        "no-such-dir", CHECKPOINT, says=("does not exist",)),
    Row("convert-no-config", "colibri", ("convert", "{no-config}", "-o", "{out}"), 2,
        "no-config", CHECKPOINT, says=("no config.json in",)),
    # 10. The output is checked before any work: never the model being
    #     converted (or any file colibri did not write), never a directory.
    Row("convert-onto-its-input", "colibri", ("convert", "{model.gguf}", "-o", "{model.gguf}"),
        2, "model.gguf", "choose another name", says=("is not a .colibri file",)),
    Row("convert-into-a-directory", "colibri", ("convert", "{model.gguf}", "-o", "{dir}"), 2,
        "dir", "give a file name", says=("is a directory",)),
    # 11. A GGUF where a .colibri file is wanted: how to convert it.
    Row("verify-gguf", "colibri", ("verify", "{model.gguf}"), 1, "model.gguf",
        "colibri convert FILE.gguf", says=("a GGUF file",)),
    Row("run-gguf", "colibri", ("run", "--engine", "c", "{model.gguf}", "--tokens", "1,2"), 2,
        "model.gguf",
        "colibri convert FILE.gguf", says=("a GGUF file",), not_says=("copy it again",)),
    # Streaming options without streaming; a trace file that cannot be made.
    Row("cli-policy-without-slots", "cli", ("--model", "{good}", "--policy", "lru", "--info"),
        2, "good", "colibri-cli --help", says=("go with --ram or --slots",)),
    Row("cli-route-trace-path", "cli", ("--model", "{good}", "--tokens", "1,2", "--route-trace",
                                        "{no-such-dir}/trace.txt"), 1, "no-such-dir",
        "check the path", says=("cannot create the --route-trace file",
                                "No such file or directory")),
    Row("cli-info-gguf", "cli", ("--model", "{model.gguf}", "--info"), 1, "model.gguf",
        "colibri convert FILE.gguf", says=("a GGUF file",), not_says=("copy it again",)),
    # 12. The C runtime's errors through `colibri run` name a fix, as
    #     colibri-cli's do (the same advice per code).
    Row("run-crc", "colibri", ("run", "--engine", "c", "{crc.colibri}", "--tokens", "1,2"), 2,
        "crc.colibri",
        COPY_OR_CONVERT, says=("CRC mismatch",)),
    Row("run-truncated", "colibri", ("run", "--engine", "c", "{trunc.colibri}", "--tokens",
                                     "1,2"), 2,
        "trunc.colibri", "copy it again", says=("beyond the file size",)),
    Row("run-too-long", "colibri", ("run", "--engine", "c", "{good}", "--tokens",
                                    ",".join(["1"] * 17)), 2,
        "good", "--max-seq-len", says=("input larger than",)),
    Row("run-reference-token-id", "colibri", ("run", "--engine", "reference", "{good}",
                                              "--tokens", "1,99999"), 2, "good",
        "below the model's vocab"),
    Row("run-reference-too-long", "colibri", ("run", "--engine", "reference", "{good}",
                                              "--tokens", ",".join(["1"] * 17)), 2, "good",
        "--max-seq-len"),
    Row("run-token-id", "colibri", ("run", "--engine", "c", "{good}", "--tokens", "1,99999"), 2,
        "good",
        "below the model's vocab"),
    # 13. Usage errors: one line too (argparse's own print the usage first),
    #     checked before the model is opened.
    Row("convert-bad-choice", "colibri", ("convert", "{no-config}", "-o", "{out}", "--quant",
                                          "q3"), 2, None, "see colibri convert --help",
        says=("invalid choice: 'q3'",)),
    Row("plan-token-text", "colibri", ("plan", "{good}", "--slots", "2", "--tokens", "a,b"), 2,
        None, "comma-separated token ids"),
    Row("plan-negative-steps", "colibri", ("plan", "{good}", "--slots", "2", "--tokens", "1",
                                           "--steps", "-1"), 2, None, "0 or more"),
    Row("info-file-quant", "colibri", ("info", "{good}", "--quant", "q4"), 2, "good",
        "--config"),
]


def _fill(text: str, files: dict[str, Path], build: Path) -> str:
    def one(m: re.Match) -> str:
        key = m.group(1)
        if key == "build":
            return str(build)
        if key.startswith("size:"):
            return str(files[key[5:]].stat().st_size)
        return str(files[key])
    return re.sub(r"\{([^{}]+)\}", one, text)


def run(row: Row, files, build: Path, c_build) -> subprocess.CompletedProcess:
    args = [_fill(a, files, build) for a in row.args]
    env = None
    if row.tool == "colibri":
        cmd, cwd = [sys.executable, "-m", "colibri.cli", *args], None
        # `run --engine c`: the suite's build of the library, wherever the
        # default would look
        env = {**os.environ, "COLIBRI_LIBRARY": str(c_build("host").so)}
    elif row.tool == "cli":
        cmd, cwd = [str(c_build("host").cli), *args], None
    else:
        cmd, cwd = [SCONS, *args], ROOT
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_error_is_one_line_naming_the_file_and_the_fix(row, files, tmp_path, c_build):
    build = tmp_path / "build"              # scons rows: their own build_dir
    proc = run(row, files, build, c_build)
    seen = proc.stdout + proc.stderr
    assert "Traceback" not in seen, seen
    assert proc.returncode == row.status, seen
    lines = proc.stderr.splitlines()
    if row.tool == "scons":
        assert len(lines) == 1 and lines[0].startswith("scons: *** "), seen
        if row.id not in ("scons-build-step", "scons-arena-beyond-ram"):
            # StopError while reading SConstruct: nothing was compiled.
            assert lines[0].endswith("Stop."), seen
            assert not list(build.rglob("*.o")), "the model is checked before compiling"
    else:
        prefix = "colibri-cli: " if row.tool == "cli" else "colibri: error: "
        assert len(lines) == 1 and lines[0].startswith(prefix), seen
    msg = lines[0]
    if row.file is not None:
        assert files[row.file].name in msg, msg
    assert row.fix in msg, msg
    for text in row.says:
        assert _fill(text, files, build) in msg, msg
    for text in row.not_says:
        assert text not in msg, msg
    # One statement that the file is corrupted, not two (issue 12 §2.4).
    assert len(re.findall(r"corrupt|damaged", msg)) <= 1, msg


@pytest.mark.parametrize("tool", ["cli", "colibri"])
def test_verify_report_precedes_its_verdict_on_one_pipe(tool, files, c_build):
    """stdout and stderr on the same pipe (2>&1): the FAIL lines come before
    the one error line that sums them up."""
    path = str(files["crc.colibri"])
    cmd = ([str(c_build("host").cli), "--model", path, "--verify"] if tool == "cli"
           else [sys.executable, "-m", "colibri.cli", "verify", path])
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1, proc.stdout
    fail = [i for i, line in enumerate(lines) if "FAIL" in line]
    verdict = [i for i, line in enumerate(lines) if "listed above" in line]
    assert fail and len(verdict) == 1, proc.stdout
    assert max(fail) < verdict[0], proc.stdout


def test_an_intact_file_verifies_with_status_0(files, c_build):
    good = str(files["good"])
    proc = subprocess.run([sys.executable, "-m", "colibri.cli", "verify", good],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    proc = subprocess.run([str(c_build("host").cli), "--model", good, "--verify"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_verify_statuses_agree_in_code_help_and_readme(c_build):
    """`colibri verify --help`, `colibri-cli --help` and the docs (the command
    tables of docs/CLI.md) state the statuses the rows above check."""
    help_text = subprocess.run([sys.executable, "-m", "colibri.cli", "verify", "--help"],
                               capture_output=True, text=True).stdout
    help_text = " ".join(help_text.split())
    assert "Exit status 0: intact; 1: damaged" in help_text
    assert "2: cannot check (the file cannot be read" in help_text
    cli_help = subprocess.run([str(c_build("host").cli), "--help"], capture_output=True,
                              text=True).stdout
    assert "exit status 0 intact, 1 damaged, 2 cannot read" in cli_help
    lines = doc_lines()
    row = next((line for line in lines if line.startswith("| `colibri verify")), None)
    assert row, "no `| colibri verify` row in README.md / docs/ (docs/CLI.md)"
    assert "exit 1" in row and "exit 2" in row and "damaged" in row, row
    cli_row = next((line for line in lines if line.startswith("| `--verify`")), None)
    assert cli_row, "no `| --verify` row in README.md / docs/ (docs/CLI.md)"
    assert "exit 1" in cli_row and "exit 2" in cli_row, cli_row


def test_a_reader_that_leaves_ends_the_command_quietly():
    """`colibri info ... | head -1`: the reader closes the pipe before the
    report is written; the command stops as a C tool would on SIGPIPE
    (status 141), with nothing on stderr (it was a traceback)."""
    cmd = [sys.executable, "-m", "colibri.cli", "info", "--config",
           str(ROOT / "models" / "demo" / "checkpoint")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()              # before the child has printed a line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert err == b"", err


def test_the_tokenizer_section_has_its_name():
    """The tokenizer section (kind 0x100) is named in `colibri verify`'s
    and `colibri info`'s lines, as the tokenizer module numbers it."""
    from colibri.text.tokenizer import KIND_TOKENIZER
    assert cformat.OPTIONAL_SECTIONS[KIND_TOKENIZER] == "TOKENIZER"
    e = cformat.Entry(KIND_TOKENIZER, 0, 0, cformat.NO_INDEX, cformat.NO_INDEX, 1, 64, 0, 64, 0)
    assert e.label() == "TOKENIZER"
