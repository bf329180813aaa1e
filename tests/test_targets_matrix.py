"""The target matrix: every target of targets/ built by SCons (the command
users run) with a model embedded, run under its emulator (natively,
qemu-arm, qemu-aarch64, qemu-ppc, qemu-riscv64, qemu-system-arm) on every
CPU the target lists (aarch64: a Cortex-A72 without and a Cortex-A76 with
the dot-product extension) and compared with the numpy reference
(colibri/model/reference.py), through the same colibri.buildsteps.check functions that
`scons target=X check` uses; the firmware must report the kernel table the
target expects on each CPU.

Builds (each `scons target=all`, shared by the tests below; the builds of one
kernel configuration share their compiled libraries: tests/shared_builds.py):
  int8        fw-tiny int8 model (colibri.buildsteps.testmodel), default kernels
  f32         fw-tiny f32 model, default kernels
  awkward     the converter's "awkward" golden model (hidden 60, 5 heads,
              6 experts top-3: SIMD tails), int8, default kernels
  ref         fw-tiny f32 with the reference kernels only: every Linux target
              (x86_64, armv7, ppc, aarch64, riscv64) must give bit-identical
              logits
  qwen2_moe   tests/golden_families.py's Qwen2-MoE (gated shared expert,
              biases, a dense layer, top-k not renormalised), int8 with
              its experts (routed, shared, dense) in Q8_0 (`--experts q8_0`)
  granitemoe_shared  its GraniteMoeShared (multipliers, ungated shared
              expert, fused experts), f32
  ref-qwen3_moe  its Qwen3-MoE (per-head q/k norm, free head_dim, biases),
              f32, reference kernels: bit-identical on every Linux target
  switch      tests/golden_switch.py's Switch Transformers (encoder-decoder:
              the firmware encodes each prompt, then decodes from the start
              token; capacity overflow, cross-attention), int8
  q4          the golden "k256" Mixtral (tests/golden_configs.py: hidden 256,
              intermediate 320) converted with `--quant q4 --attention q5_k
              --embedding q6_k --lm-head q4_0`: Q4_K (experts' W1/W3), Q5_K
              (attention), Q6_K (embedding), Q5_0 (experts' W2, 320 columns),
              Q4_0 (LM head), int16 router; default kernels
  ref-q4      the same file with the reference kernels only: the block
              kernels bit-identical on every Linux target
Each family model is a version 2 file: on ppc the firmware embeds it
big-endian and uses it in place, on cortex-m from flash with a static arena.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import targets  # noqa: E402
from colibri.buildsteps import check, golden, testmodel, toolchain  # noqa: E402
from colibri.file import storage  # noqa: E402

TARGETS = targets.load_all()
LINUX_REF_TARGETS = [n for n, t in TARGETS.items() if t.is_linux]
# (target, CPU) for the CPUs a target lists besides the one its emulator pins.
OTHER_CPUS = [(n, cpu) for n, t in TARGETS.items() for cpu in list(t.cpu_kernels)[1:]]

# The block types the q4 matrix model must hold; Q8_0 is the qwen2_moe
# build's (the q4 model's three free kinds hold Q5_K, Q6_K and Q4_0).
Q4_DTYPES = set(storage.BLOCK_TYPES) - {storage.DType.Q8_0}

FAMILY_BUILDS = {"qwen2_moe": ("qwen2_moe", "int8+q8_0"),
                 "granitemoe_shared": ("granitemoe_shared", "f32"),
                 "ref-qwen3_moe": ("qwen3_moe", "f32")}


def _family_model(d: Path, family: str, quant: str) -> Path:
    """A golden family checkpoint converted by the real converter; a short
    cache (max_seq_len 16, batch 1) keeps the emulated runs quick. quant
    "int8+q8_0": --quant int8 --experts q8_0 (the file must hold Q8_0)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from colibri.model.convert import ColibriExporter
    from golden_families import make_family, save_family
    from colibri.file import format as cformat
    ck = save_family(make_family(family, seed=0), d / f"hf-{family}")
    preset, _, experts = quant.partition("+")
    out = ColibriExporter(ck, quant=preset, quantize_experts=experts or None,
                          max_seq_len=16).export(d / f"{family}-{quant}.colibri")
    if experts:
        f = cformat.read_file(out)
        held = {cformat.DType(e.dtype) for e in f.entries}
        f.close()
        assert cformat.DType[experts.upper()] in held, f"{out.name} holds {sorted(held)}"
    return out


def _q4_model(d: Path) -> Path:
    """The golden "k256" Mixtral converted by the real converter with the
    4-bit mix (`colibri convert --quant q4`: Q4_K, Q5_0 on the experts'
    320-wide W2) with the attention in Q5_K, the embedding in Q6_K and the
    LM head in Q4_0 (overrides: the mix itself never picks Q4_0 or Q5_K), a
    16-position cache; it must hold all five block types (else the matrix
    would not test them)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from colibri.file import format as cformat
    from colibri.model.convert import ColibriExporter
    from golden_configs import save_mixtral
    ck = save_mixtral("k256", d / "hf-k256", seed=0)
    out = ColibriExporter(ck, quant="q4", quantize_attention="q5_k", quantize_embedding="q6_k",
                          quantize_lm_head="q4_0", max_seq_len=16).export(d / "k256-q4.colibri")
    f = cformat.read_file(out)
    held = {cformat.DType(e.dtype) for e in f.entries}
    f.close()
    assert Q4_DTYPES <= held, f"{out.name} holds {sorted(held)}"
    return out


def _switch_model(d: Path) -> Path:
    """The golden Switch Transformers (tests/golden_switch.py) converted from
    the loaded model, int8, a 16-position cache."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from colibri.model.convert import ColibriExporter
    from golden_switch import make_switch
    return ColibriExporter(model=make_switch(seed=0), quant="int8", max_seq_len=16).export(
        d / "switch-int8.colibri")


@pytest.fixture(scope="session")
def matrix_models(tmp_path_factory, colibri_file):
    d = tmp_path_factory.mktemp("matrix-models")
    models = {
        "int8": lambda: testmodel.make_model(d / "fw-tiny-int8.colibri", "int8"),
        "f32": lambda: testmodel.make_model(d / "fw-tiny-f32.colibri", "f32"),
        "awkward": lambda: Path(colibri_file("awkward", "int8")),
        "ref": lambda: testmodel.make_model(d / "fw-tiny-f32-ref.colibri", "f32", seed=1),
    }
    models.update({b: (lambda f=f, q=q: _family_model(d, f, q))
                   for b, (f, q) in FAMILY_BUILDS.items()})
    models["switch"] = lambda: _switch_model(d)
    models["q4"] = lambda: _q4_model(d)
    lazy = _Lazy(models)
    lazy["ref-q4"] = lambda: lazy["q4"]    # one file, two kernel builds
    return lazy


class _Lazy(dict):
    """name -> model path, each made on first use."""
    def __getitem__(self, name):
        v = super().__getitem__(name)
        if callable(v):
            v = v()
            self[name] = v
        return v


@pytest.fixture(scope="session")
def matrix_build(tmp_path_factory, matrix_models, shared_builds):
    """build name -> build directory, built on first use. The builds of one
    kernel configuration share their compiled libraries (shared_builds):
    a new model is a relink, not a compilation of six targets."""
    root = tmp_path_factory.mktemp("matrix-build")
    done = {}

    def get(name):
        if name not in done:
            ref = name.startswith("ref")
            extra = ["avx2=0", "neon=0"] if ref else []
            out = root / name
            available = [n for n, t in TARGETS.items() if not toolchain.missing_tools(t)]
            target = "all" if len(available) == len(TARGETS) else None
            for t in ([target] if target else available):
                shared_builds.build(out, f"target={t}", f"model={matrix_models[name]}", *extra,
                                    config="ref-kernels" if ref else "default", timeout=600)
            done[name] = out
        return done[name]
    return get


def _need(target):
    missing = toolchain.missing_tools(target)
    if missing:
        pytest.skip(missing[0])
    problem = toolchain.missing_emulator(target)
    if problem:
        pytest.skip(problem)


@pytest.mark.parametrize("build", ["int8", "f32", "awkward", "qwen2_moe", "granitemoe_shared",
                                   "switch", "q4"])
@pytest.mark.parametrize("name", list(TARGETS))
def test_target_matches_reference(name, build, matrix_build, matrix_models):
    """Firmware (and colibri-cli on Linux) logits within the quantisation's
    tolerance of the reference, greedy tokens equal, CLI == firmware bits."""
    t = TARGETS[name]
    _need(t)
    bdir = matrix_build(build) / name
    cli = bdir / "colibri-cli" if t.is_linux else None
    expect = check.expected_kernels(t, simd=True).get(t.cpu)
    result = check.check_target(t, bdir / "firmware.elf", matrix_models[build], cli=cli,
                                expect_kernels=expect)
    assert result.ok, result.summary()
    fw = result.firmware
    assert fw.kernels, "the firmware did not say which kernel table it used"
    # The build reserved exactly what this runtime asks for on this target
    # (memory.py's formula with the target compiler's struct sizes).
    assert int(fw.header["arena_needed"]) == int(fw.header["arena_bytes"])
    assert int(fw.header["model_bytes"]) == (bdir / "firmware" / "model.bin").stat().st_size
    assert len(fw.prompts) == 2 and all(len(p.tokens) == 4 for p in fw.prompts)
    if golden.quantisation(matrix_models[build]) == "q4":
        _assert_most_positions_exact(fw, matrix_models[build])


def _assert_most_positions_exact(fw, model):
    """The q4 tolerance (golden.TOLERANCE) admits an activation rounding
    flip: the position where numpy and C round a tie differently moves, and
    so do the later positions of its prompt (they attend to it). Every
    other position must agree with the reference to float rounding: each
    prompt's first position, and every position of all prompts but one (a
    wrong block kernel moves them all)."""
    per_prompt = []
    for p in fw.prompts:
        want = golden.reference_rows(model, p.prompt, p.tokens[:-1])
        scale = np.maximum(1.0, np.abs(want).max(axis=1))
        per_prompt.append(np.abs(p.rows.astype(np.float64) - want).max(axis=1) / scale)
    errs = np.concatenate(per_prompt)
    assert np.median(errs) <= 1e-5, f"median position error {np.median(errs):.2e}"
    assert all(e[0] <= 1e-3 for e in per_prompt), \
        f"first positions {[float(e[0]) for e in per_prompt]}: over 1e-3"
    moved = [i for i, e in enumerate(per_prompt) if np.any(e > 1e-3)]
    assert len(moved) <= 1, f"prompts {moved} have positions over 1e-3"


@pytest.mark.parametrize("build", ["int8", "awkward", "q4"])
@pytest.mark.parametrize("name, cpu", OTHER_CPUS, ids=[f"{n}-{c}" for n, c in OTHER_CPUS])
def test_other_cpus_pick_their_kernels_and_give_the_same_bits(name, cpu, build, matrix_build,
                                                              matrix_models):
    """The same firmware and colibri-cli on another CPU of the target: the
    runtime picks that CPU's table (aarch64 on a Cortex-A76: neon-dotprod,
    SDOT) and passes the reference check. And the logits equal the pinned
    CPU's bit for bit: the tables of one target may differ only in exact
    instructions (kernels.h: the A64 int8 matmul is bit-identical to ref
    with or without SDOT). int8 and 4-bit models, where the tables differ."""
    t = TARGETS[name]
    _need(t)
    bdir = matrix_build(build) / name
    cli = bdir / "colibri-cli" if t.is_linux else None
    results = {}
    for c in (t.cpu, cpu):
        on = t.on_cpu(c)
        results[c] = check.check_target(on, bdir / "firmware.elf", matrix_models[build], cli=cli,
                                        expect_kernels=t.cpu_kernels[c])
        assert results[c].ok, results[c].summary()
    assert results[cpu].firmware.kernels != results[t.cpu].firmware.kernels
    for a, b in zip(results[t.cpu].firmware.prompts, results[cpu].firmware.prompts):
        assert np.array_equal(a.rows.view(np.uint32), b.rows.view(np.uint32)), (
            f"{name}: logits on {cpu} differ from {t.cpu}, prompt {a.prompt}")


def test_check_fails_on_an_unexpected_kernel_table(matrix_build, matrix_models):
    """The kernel expectation can fail: the aarch64 NEON build on a
    Cortex-A76 does not pass as 'neon' (nor the ARMv7 one as 'ref')."""
    name = "aarch64" if "aarch64" in TARGETS else "armv7"
    t = TARGETS[name]
    _need(t)
    bdir = matrix_build("int8") / name
    on = t.on_cpu(list(t.cpu_kernels)[-1])
    wrong = "neon" if name == "aarch64" else "ref"
    result = check.check_target(on, bdir / "firmware.elf", matrix_models["int8"],
                                cli=bdir / "colibri-cli", expect_kernels=wrong)
    assert not result.ok
    assert any(f"expected '{wrong}' on this CPU" in f for f in result.failures)
    assert any(f"colibri-cli --info on {on.cpu}" in f for f in result.failures)


@pytest.mark.parametrize("build", ["int8", "f32", "q4"])
@pytest.mark.parametrize("name", [n for n in ("armv7", "x86_64") if n in TARGETS])
def test_firmware_two_threads_same_bits(name, build, matrix_build):
    """The Linux firmware on 2 threads (COLIBRI_FW_THREADS=2: pthreads under
    qemu-arm for armv7) prints the rows and checksums of the 1-thread run."""
    from colibri.buildsteps import emulate
    t = TARGETS[name]
    _need(t)
    elf = matrix_build(build) / name / "firmware.elf"
    runs = []
    for threads in ("1", "2"):
        r = emulate.run(t, elf, env={"COLIBRI_FW_THREADS": threads})
        assert r.returncode == 0, f"{name}: {r.stdout[-500:]} {r.stderr[-500:]}"
        runs.append((r.stdout, emulate.parse_firmware_output(r.stdout)))
    assert "threads 2\n" in runs[1][0] and "threads " not in runs[0][0]
    one, two = runs[0][1], runs[1][1]
    assert two.done and len(two.prompts) == len(one.prompts) == 2
    for a, b in zip(one.prompts, two.prompts):
        assert a.checksum == b.checksum and a.tokens == b.tokens
        assert a.rows.tobytes() == b.rows.tobytes()


@pytest.mark.parametrize("build", ["ref", "ref-qwen3_moe", "ref-q4"])
def test_ref_kernels_bit_identical_across_targets(build, matrix_build):
    """With the reference kernels and -ffp-contract=off, every Linux target
    (x86_64, armv7, ppc, aarch64, riscv64) produces the same float bits for
    every logit (DESIGN.md 7), Mixtral and a version 2 family alike, and
    the 4-bit blocks (Q4_0, Q5_0, Q4_K, Q5_K, Q6_K: integer sums, then float32 in the
    order FORMAT.md 5 fixes; ppc uses the file big-endian in place)."""
    bdir = matrix_build(build)
    runs = {}
    for name in LINUX_REF_TARGETS:
        t = TARGETS[name]
        _need(t)
        from colibri.buildsteps import emulate
        r = emulate.run(t, bdir / name / "firmware.elf")
        assert r.returncode == 0, f"{name}: {r.stdout[-500:]} {r.stderr[-500:]}"
        runs[name] = emulate.parse_firmware_output(r.stdout)
        assert runs[name].kernels == "ref", (name, runs[name].kernels)
    base_name = LINUX_REF_TARGETS[0]
    base = runs[base_name]
    for name, run in runs.items():
        for i, (a, b) in enumerate(zip(base.prompts, run.prompts)):
            diff = np.argwhere(a.rows.view(np.uint32) != b.rows.view(np.uint32))
            assert diff.size == 0, (
                f"{name} vs {base_name}, prompt {i} {a.prompt}: {len(diff)} logits differ, first "
                f"at position {diff[0][0]} token {diff[0][1]}: {a.rows[tuple(diff[0])]!r} vs "
                f"{b.rows[tuple(diff[0])]!r}")
            assert a.checksum == b.checksum and a.tokens == b.tokens


@pytest.mark.parametrize("name", [n for n in ("cortex-m", "aarch64") if n in TARGETS])
def test_scons_check_runs_the_matrix_and_reports(name, matrix_build, matrix_models,
                                                 shared_builds, tmp_path):
    """`scons target=X check` on an up-to-date build runs the emulator on
    every CPU of the target and prints PASS with the CPU, the kernel table
    and the worst position per prompt."""
    matrix_build("int8")
    t = TARGETS[name]
    _need(t)
    # In the work directory the int8 build was made in (up to date but for
    # the model, which a later build may have swapped: a relink).
    p = shared_builds.build(tmp_path, f"target={name}", f"model={matrix_models['int8']}",
                            "check", timeout=600)
    assert p.stdout.count(f"target {name}: PASS") == len(t.cpu_kernels)
    for cpu, table in t.cpu_kernels.items():
        assert f"cpu {cpu}, kernels {table}," in p.stdout
    assert "worst position" in p.stdout
