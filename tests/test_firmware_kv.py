"""Firmware with an 8-bit KV cache (`scons kv=i8`) on Cortex-M bare metal
(qemu-system-arm) and 32-bit ARMv7 Linux (qemu-arm), built by SCons as
users build it:

- the firmware initialises with colibri_options.kv_dtype = COLIBRI_KV_I8
  (it says kv=i8) and passes `check` (colibri.buildsteps.check, the same
  code as `scons check`) against the numpy reference with the same i8
  cache, colibri-cli --kv i8 bit-identical to it on Linux;
- the cache really is 8-bit: the logits are far closer to the i8-cache
  reference than to the float32-cache one;
- the static arena the build reserves (memory.py's formula with the
  target compiler's struct sizes, firmware/arena_tables.c) is exactly what
  the runtime's colibri_arena_size_ex asks for on the target, for the
  tiny int8 model and a 4-bit (q4: Q4_K/Q6_K/Q5_0) model, and the i8 arena
  is smaller than the f32 one by the caches' difference;
- kv= misuse stops the build with one line.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import targets  # noqa: E402
from colibri.file import format as cformat
from colibri.model import memory  # noqa: E402
from colibri.buildsteps import check, emulate, golden, toolchain  # noqa: E402

TARGETS = targets.load_all()
SCONS = str(ROOT / ".venv" / "bin" / "scons")
KV_TARGETS = ("cortex-m", "armv7")


def scons(*args, check_rc=True):
    p = subprocess.run([SCONS, "-Q", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    if check_rc and p.returncode != 0:
        raise AssertionError(f"scons {' '.join(args)} failed ({p.returncode}):\n"
                             f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def _need(t):
    missing = toolchain.missing_tools(t) or [toolchain.missing_emulator(t)]
    if missing[0]:
        pytest.skip(missing[0])


@pytest.fixture(scope="module")
def models(tmp_path_factory, hf_checkpoint):
    """The tiny int8 firmware model and the k256 golden model (hidden 256,
    so the 4-bit mix uses Q4_K and Q6_K) converted with --quant q4 and a
    16-position cache, small enough for the Cortex-M's 4 MB."""
    from colibri.buildsteps import testmodel
    from colibri.model.convert import ColibriExporter
    d = tmp_path_factory.mktemp("kv-models")
    q4 = ColibriExporter(hf_checkpoint("k256"), quant="q4", max_seq_len=16).export(
        d / "k256-q4.colibri")
    return {"int8": testmodel.make_model(d / "tiny-int8.colibri", "int8"), "q4": q4}


@pytest.fixture(scope="module")
def build(tmp_path_factory, models, shared_builds):
    """(model, kv) -> build directory with every target of KV_TARGETS (the
    libraries compiled once: tests/shared_builds.py)."""
    root = tmp_path_factory.mktemp("kv-build")
    done = {}

    def get(model, kv):
        key = (model, kv)
        if key not in done:
            out = root / f"{model}-{kv}"
            for name in KV_TARGETS:
                if not toolchain.missing_tools(TARGETS[name]):
                    shared_builds.build(out, f"target={name}", f"model={models[model]}",
                                        f"kv={kv}", timeout=900)
            done[key] = out
        return done[key]
    return get


def _header(t, elf):
    r = emulate.run(t, elf)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    return emulate.parse_firmware_output(r.stdout)


@pytest.mark.parametrize("model", ["int8", "q4"])
@pytest.mark.parametrize("name", KV_TARGETS)
def test_i8_firmware_matches_the_i8_reference_and_its_arena_is_exact(name, model, build,
                                                                      models):
    t = TARGETS[name]
    _need(t)
    bdir = build(model, "i8") / name
    cli = bdir / "colibri-cli" if t.is_linux else None
    result = check.check_target(t, bdir / "firmware.elf", models[model], cli=cli)
    assert result.ok, result.summary()
    fw = result.firmware
    assert fw.header["kv"] == "i8"
    # The build reserved exactly what this runtime asks for on this target.
    assert int(fw.header["arena_needed"]) == int(fw.header["arena_bytes"])
    if model == "q4":
        dts = {cformat.DType(e.dtype) for e in cformat.read_file(models[model]).entries}
        assert {cformat.DType.Q4_K, cformat.DType.Q6_K, cformat.DType.Q5_0} <= dts
    # Really an 8-bit cache: the rows are at float rounding from the i8
    # reference and an order of magnitude further from the f32 one.
    for p in fw.prompts:
        fed = p.tokens[:-1]
        want8 = golden.reference_rows(models[model], p.prompt, fed, kv="i8")
        want32 = golden.reference_rows(models[model], p.prompt, fed, kv="f32")
        scale = np.maximum(1.0, np.abs(want8).max(axis=1, keepdims=True))
        e8 = np.median(np.abs(p.rows - want8) / scale)
        e32 = np.median(np.abs(p.rows - want32) / scale)
        print(f"{name} {model} prompt {p.prompt}: median vs i8 ref {e8:.2g}, vs f32 {e32:.2g}")
        assert e32 >= 10 * max(e8, 1e-7), (e8, e32)


@pytest.mark.parametrize("name", KV_TARGETS)
def test_f32_firmware_arena_is_exact_and_larger_by_the_cache(name, build, models):
    """The default kv=f32 build: exact too, and the two arenas differ by
    the two caches' sizes as memory.kv_bytes gives them from the shape."""
    t = TARGETS[name]
    _need(t)
    h32 = _header(t, build("q4", "f32") / name / "firmware.elf").header
    h8 = _header(t, build("q4", "i8") / name / "firmware.elf").header
    assert h32["kv"] == "f32" and int(h32["arena_needed"]) == int(h32["arena_bytes"])
    shape = cformat.read_file(models["q4"]).shape
    diff = memory.kv_bytes(shape, "f32")[1] - memory.kv_bytes(shape, "i8")[1]
    assert int(h32["arena_bytes"]) - int(h8["arena_bytes"]) == diff > 0


def test_kv_misuse_stops_the_build_with_one_line(tmp_path):
    p = scons("kv=i4", f"build_dir={tmp_path}", check_rc=False)
    assert p.returncode != 0 and "kv=i4: give f32" in p.stderr
    assert "Traceback" not in p.stderr


def _size_figures(text: str) -> dict:
    """The model's figures `scons size` printed (size.txt)."""
    import re
    got = {"blob": int(re.search(r"flash: model blob (\d+) B", text).group(1))}
    m = re.search(r"ram: arena (\d+) B \(.*\), KV cache (\w+)", text)
    got["arena"], got["kv"] = int(m.group(1)), m.group(2)
    m = re.search(r"KV cache +(\d+)  \((\d+) B per token x max_seq_len (\d+) x batch (\d+)", text)
    got["kv_bytes"], got["kv_per_token"], got["seq"], got["batch"] = map(int, m.groups())
    got["rest"] = int(re.search(r"rest of the arena +(\d+)", text).group(1))
    for title in ("embedding", "attention", "router", "routed experts", "shared/dense FFN",
                  "norms", "LM head"):
        m = re.search(rf"^    {re.escape(title)} +(\d+) +(\d+)  ", text, re.M)
        got[title] = (int(m.group(1)), int(m.group(2)))
    got["pad"] = int(re.search(r"header\+table\+pad +(\d+)", text).group(1))
    return got


@pytest.mark.parametrize("kv", ["i8", "f32"])
@pytest.mark.parametrize("name", KV_TARGETS)
def test_size_report_figures_are_the_targets(name, kv, build):
    """`scons size`'s model section against figures measured elsewhere: the
    blob is the ELF's .colibri_model section and the arena its `arena`
    symbol (pyelftools) and the runtime's colibri_arena_size_ex on the
    target (the firmware's arena_needed); on Linux every weight part, the
    KV cache per token and at max_seq_len and the padding are colibri-cli
    --info's (colibri_get_weight_bytes, colibri_kv_size: C, on the target)."""
    import re
    from elftools.elf.elffile import ELFFile
    t = TARGETS[name]
    _need(t)
    bdir = build("q4", kv) / name
    got = _size_figures((bdir / "size.txt").read_text())
    assert got["kv"] == kv
    with open(bdir / "firmware.elf", "rb") as fh:
        elf = ELFFile(fh)
        assert got["blob"] == elf.get_section_by_name(".colibri_model")["sh_size"]
        assert got["arena"] == elf.get_section_by_name(".symtab").get_symbol_by_name(
            "arena")[0]["st_size"]
    assert got["arena"] == int(_header(t, bdir / "firmware.elf").header["arena_needed"])
    assert got["arena"] == got["kv_bytes"] + got["rest"]
    if not t.is_linux:
        return
    r = emulate.run(t, bdir / "colibri-cli",
                    ("--model", str(bdir / "firmware" / "model.bin"), "--info", "--kv", kv))
    assert r.returncode == 0, r.stderr
    info = r.stdout
    titles = {"embedding": "embedding", "attention": "attention", "router": "router",
              "routed experts": "routed_experts", "shared/dense FFN": "shared_dense_ffn",
              "norms": "norms", "LM head": "lm_head"}
    for title, key in titles.items():
        m = re.search(rf"^weights_{key}: (\d+) bytes \((\d+) tensors", info, re.M)
        assert got[title] == (int(m.group(1)), int(m.group(2))), title
    m = re.search(rf"^kv_{kv}: (\d+) bytes per token, (\d+) at max_seq_len (\d+) x "
                  rf"max_batch (\d+)", info, re.M)
    assert (got["kv_per_token"], got["kv_bytes"], got["seq"], got["batch"]) == tuple(
        map(int, m.groups()))
    assert got["pad"] == int(re.search(r"^file_header_table_padding: (\d+)", info, re.M)[1])
    assert got["rest"] == int(re.search(r"^arena_without_kv: (\d+)", info, re.M)[1])
