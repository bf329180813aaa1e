"""Every library size the documentation states ("20.9 KiB on Cortex-M", in
README.md or any page of docs/) is what the size report of today's build
prints, in its unit.

The README's figures once drifted from the report (21,307 bytes written as
"21.3 KiB", the report's 20.8 KiB); this holds them to the build, so a change
that moves the library by a tenth of a KiB must update the page with it.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import targets as target_defs  # noqa: E402
from colibri.buildsteps.size import measure_runtime  # noqa: E402
from docs_text import doc_text  # noqa: E402

TARGETS = target_defs.load_all()

# How the documentation names each target in prose.
README_NAMES = {"Cortex-M": "cortex-m", "x86_64": "x86_64", "ARMv7": "armv7",
                "PowerPC": "ppc", "AArch64": "aarch64", "aarch64": "aarch64",
                "RISC-V 64": "riscv64", "riscv64": "riscv64"}
CLAIM = re.compile(r"(\d+\.\d) KiB on (" + "|".join(map(re.escape, README_NAMES)) + r")\b")


def readme_claims() -> list[tuple[str, str]]:
    """(figure, target name) for every "N.N KiB on TARGET" of the README and
    docs/ (wrapped lines joined)."""
    return [(kib, README_NAMES[name]) for kib, name in CLAIM.findall(doc_text())]


def test_readme_states_library_sizes():
    assert len(readme_claims()) >= 2  # the pattern still finds the figures
    # The README's own headline sizes are among them.
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert len(CLAIM.findall(readme)) >= 2


@pytest.mark.parametrize("name", sorted({t for _, t in readme_claims()}))
def test_readme_library_size_is_the_size_reports(name, shared_builds, tmp_path):
    target = TARGETS[name]
    if shutil.which(target.tool("gcc")) is None:
        pytest.skip(f"{target.tool('gcc')} not installed")
    # The target's default library, in the work directory the firmware
    # tests build it in (the model changes only the firmware): compiled
    # there once, not again here.
    goal = shared_builds.work_dir() / name / "libcolibri.a"
    shared_builds.build(tmp_path, f"target={name}", str(goal), timeout=600)
    kinds, _ = measure_runtime(tmp_path / name / "libcolibri.a")   # the build's copy
    # The report's unit and rounding (colibri/buildsteps/size.py).
    report = f"{sum(kinds.values()) / 1024:.1f}"
    for kib, t in readme_claims():
        if t == name:
            assert kib == report, (f"the docs say {kib} KiB for {name}; its size report "
                                   f"says {report} KiB ({sum(kinds.values()):,} bytes): "
                                   f"update README.md / docs/ (grep '{kib} KiB on')")
