"""The regression check of one target: run its firmware (and colibri-cli on
Linux targets) under its emulator and compare the logits with the numpy
reference. Used by `scons target=X check` and tests/test_targets_matrix.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ColibriError
from . import emulate, golden


@dataclass
class CheckResult:
    target: str
    quant: str
    emulated: bool = True
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
                f"firmware {self.seconds:.2f} s"
                + (f", colibri-cli {self.seconds_cli:.2f} s" if self.seconds_cli else "")
                + (" under emulation)" if self.emulated else " native)"))
        return "\n".join([head, *("  " + w for w in self.worst),
                          *("  FAIL " + f for f in self.failures)])


def check_firmware(target, firmware, model, result: CheckResult) -> None:
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
    if not fw.done or not fw.prompts:
        result.failures.append(f"{where}: output ended before 'done'")
        return
    tol = golden.TOLERANCE[result.quant]
    for i, p in enumerate(fw.prompts):
        what = f"target {target.name}, prompt {i} {p.prompt}"
        # rows: the prompt, then one per generated token but the last.
        want = golden.reference_rows(model, p.prompt, p.tokens[:-1])
        cmp = golden.compare(p.rows, want, tol, what, len(p.prompt))
        result.worst.append(cmp.message)
        if not cmp.ok:
            result.failures.append(cmp.message)
            continue
        bad = golden.check_greedy(p.tokens, p.rows, want, len(p.prompt), tol, what)
        if bad:
            result.failures.append(bad)


def check_target(target, firmware, model, cli=None, cli_model=None) -> CheckResult:
    """Run everything of `target` and compare. `model` is the .colibri file
    the firmware embeds (any byte order: the reference reads both);
    `cli_model` the file colibri-cli loads (default: the blob next to the
    firmware, already in the target's byte order)."""
    result = CheckResult(target.name, golden.quantisation(model), bool(target.emulator))
    check_firmware(target, firmware, model, result)
    if cli is not None:
        from . import cli_check
        if cli_model is None:
            cli_model = Path(firmware).parent / "firmware" / "model.bin"
        cli_check.check_cli(target, cli, cli_model, result)
    return result
