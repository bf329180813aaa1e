"""The regression check of one target: run its firmware (and colibri-cli on
Linux targets) under its emulator and compare the logits with the numpy
reference, the chosen tokens with the numpy reference sampler (greedy or
seeded sampling, golden.check_greedy / check_sampled), in text mode the ids
the device's tokenizer produced and the text it printed with the Python
tokenizer (colibri/text/tokenizer.py), and check that the runtime picked the
kernel table the target expects on the emulated CPU (targets/: cpu_kernels). Used by
`scons target=X check` (every CPU of the target: check_all_cpus) and
tests/test_targets_matrix.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from . import blob, emulate, golden
from ..errors import ColibriError


@dataclass
class CheckResult:
    target: str
    quant: str
    emulated: bool = True
    cpu: str | None = None         # the emulated CPU model, None when native
    kernels: str = ""              # the kernel table the firmware reported
    firmware: emulate.FirmwareRun | None = None
    seconds: float = 0.0
    seconds_cli: float = 0.0
    worst: list[str] = field(default_factory=list)     # one comparison line per prompt
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        head = (f"target {self.target}: {'PASS' if self.ok else 'FAIL'} ({self.quant} model, "
                + (f"cpu {self.cpu}, " if self.cpu else "")
                + (f"kernels {self.kernels}, " if self.kernels else "")
                + f"firmware {self.seconds:.2f} s"
                + (f", colibri-cli {self.seconds_cli:.2f} s" if self.seconds_cli else "")
                + (" under emulation)" if self.emulated else " native)"))
        return "\n".join([head, *("  " + w for w in self.worst),
                          *("  FAIL " + f for f in self.failures)])


def expected_kernels(target, simd: bool) -> dict[str, str]:
    """Emulated CPU -> the kernel table the runtime must pick on it: the
    target's cpu_kernels for a build with its default SIMD kernels, "ref" on
    every CPU for a build without any (e.g. neon=0). Empty for a target run
    natively, whose table depends on the host."""
    return {cpu: (name if simd else "ref") for cpu, name in target.cpu_kernels.items()}


def _cli_kernels(target, cli, model) -> tuple[str, str]:
    """(kernel table colibri-cli --info reports, its output for a message)."""
    r = emulate.run(target, cli, ("--model", str(model), "--info"))
    m = re.search(r"^kernels: (\S+)$", r.stdout, re.M)
    return (m.group(1) if m else ""), (r.stdout + r.stderr).strip()[-300:]


def check_firmware(target, firmware, model, result: CheckResult,
                   expect_kernels: str | None = None) -> None:
    r = emulate.run(target, firmware)
    result.seconds = r.seconds
    where = f"target {target.name}: {' '.join(r.cmd)}"
    if r.returncode != 0:
        tail = (r.stdout + r.stderr).strip().splitlines()[-5:]
        result.failures.append(f"{where} exited with status {r.returncode}: "
                               + " / ".join(tail))
        return
    fw = emulate.parse_firmware_output(r.stdout)
    result.firmware = fw
    result.kernels = fw.kernels
    if not fw.done or not fw.prompts:
        result.failures.append(f"{where}: output ended before 'done'")
        return
    inputs = _inputs(firmware)
    if fw.header.get("kv", "f32") != inputs.kv:
        result.failures.append(f"{where}: the firmware ran with a {fw.header.get('kv', 'f32')} "
                               f"KV cache, its build asked for {inputs.kv} (fw_inputs.json)")
    if expect_kernels and fw.kernels != expect_kernels:
        result.failures.append(
            f"{where}: the runtime picked the kernels {fw.kernels or '(none reported)'!r}, "
            f"expected {expect_kernels!r} on this CPU (targets/{target.name.replace('-', '_')}"
            ".py cpu_kernels)")
    tol = golden.TOLERANCE[result.quant]
    params = inputs.params
    tok = n_text = None
    if inputs.device_tokenizes:
        from ..text.tokenizer import load
        tok = load(model)
        n_text = tok.n_vocab
    for i, p in enumerate(fw.prompts):
        what = f"target {target.name}, prompt {i} {p.prompt}"
        if tok is not None:
            bad = _check_text(p, inputs.prompts[i], tok, what)
            if bad:
                result.failures.append(bad)
                continue
        # rows: the prompt, then one per generated token but the last.
        want = golden.reference_rows(model, p.prompt, p.tokens[:-1], inputs.kv)
        n_pre = len(golden.decoder_prompt(model, p.prompt))
        cmp = golden.compare(p.rows, want, tol, what, n_pre)
        result.worst.append(cmp.message)
        if not cmp.ok:
            result.failures.append(cmp.message)
            continue
        if params.greedy:
            bad = golden.check_greedy(p.tokens, p.rows, want, n_pre, tol, what)
        else:
            bad = golden.check_sampled(p.tokens, p.rows, want, p.prompt, params, tol, what,
                                       n_text)
        if bad:
            result.failures.append(bad)


def _inputs(firmware) -> blob.FirmwareInputs:
    """The firmware's inputs (fw_inputs.json beside fw_config.h); a firmware
    built without one ran the default token-id prompts greedily."""
    fw_dir = Path(firmware).parent / "firmware"
    if not (fw_dir / blob.INPUTS_JSON).exists():
        return blob.FirmwareInputs([list(q) for q in blob.DEFAULT_PROMPTS])
    return blob.FirmwareInputs.load(fw_dir)


def _check_text(p: emulate.PromptRun, expected_ids, tok, what: str) -> str | None:
    """Text mode: the device's ids must be the Python tokenizer's, and the
    text it printed the Python streaming decoder's text of its tokens."""
    from ..text.tokenizer import StreamDecoder
    if list(p.prompt) != list(expected_ids):
        return (f"{what}: the device tokenised the prompt to {p.prompt}, the Python "
                f"tokenizer (colibri/text/tokenizer.py) to {list(expected_ids)}")
    dec = StreamDecoder(tok, skip_special=True)
    want = "".join(dec.push(t) for t in p.tokens) + dec.finish()
    if p.text != want.encode("utf-8"):
        return (f"{what}: the device printed {p.text.decode('utf-8', 'replace')!r}, the "
                f"Python decoder gives {want!r} for its tokens {p.tokens}")
    return None


def check_target(target, firmware, model, cli=None, cli_model=None,
                 expect_kernels: str | None = None) -> CheckResult:
    """Run everything of `target` (under the CPU its emulator pins) and
    compare. `model` is the .colibri file the firmware embeds (any byte
    order: the reference reads both); `cli_model` the file colibri-cli loads
    (default: the blob next to the firmware, already in the target's byte
    order). `expect_kernels`: the kernel table the firmware and colibri-cli
    must report (None: not checked)."""
    result = CheckResult(target.name, golden.quantisation(model), bool(target.emulator),
                         cpu=target.cpu)
    check_firmware(target, firmware, model, result, expect_kernels)
    if cli is not None:
        from . import cli_check
        if cli_model is None:
            cli_model = Path(firmware).parent / "firmware" / "model.bin"
        cli_check.check_cli(target, cli, cli_model, result, kv=_inputs(firmware).kv)
        if expect_kernels:
            got, out = _cli_kernels(target, cli, cli_model)
            if got != expect_kernels:
                result.failures.append(
                    f"target {target.name}, colibri-cli --info on {target.cpu}: kernels "
                    f"{got or '(not reported)'!r}, expected {expect_kernels!r}: {out}")
    return result


def check_all_cpus(target, firmware, model, cli=None, simd: bool = True) -> list[CheckResult]:
    """check_target on every emulated CPU of the target's cpu_kernels (the
    pinned one first), each expecting its kernel table; `simd`: the build
    has the target's SIMD kernels (False for avx2=0 neon=0). A native
    target is checked once, without a kernel expectation."""
    expected = expected_kernels(target, simd)
    if not expected:
        return [check_target(target, firmware, model, cli=cli)]
    return [check_target(target.on_cpu(cpu), firmware, model, cli=cli, expect_kernels=name)
            for cpu, name in expected.items()]
