"""Static analysis in the suite (colibri/buildsteps/analysis.py): gcc
-fanalyzer, cppcheck (warning, portability, performance, MISRA C:2012) and
clang --analyze over the library, the firmware application and the
bootloader in every build configuration; any finding that
docs/DEVIATIONS.md does not list fails.

The full run (92 configuration x source units, 76 distinct after
preprocessing) costs about 6.5 minutes of CPU (measured on a 2-core Zen 3:
6 min 15 s user + 27 s system with the planted test; gcc -fanalyzer on
src/kernels/avx2.c is 53 s of it, in the x86_64 configuration alone:
analysis.configs() says why; on avx512.c 28 s), so about 3.5 minutes on
two idle cores; it caches nothing between runs. The planted-defect test analyses a scratch
copy of one file in one configuration (about 10 s of CPU)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from colibri.buildsteps import analysis

ROOT = Path(__file__).resolve().parent.parent


def _tools_or_skip(tools=analysis.TOOLS):
    missing = {t: analysis.have_tool(t) for t in tools}
    missing = {t: why for t, why in missing.items() if why}
    if len(missing) == len(tools):
        pytest.skip("; ".join(f"{t}: {why}" for t, why in missing.items()))
    return [t for t in tools if t not in missing]


@pytest.fixture(scope="module")
def full_run():
    tools = _tools_or_skip()
    return analysis.analyse(ROOT, tools=tools)


@pytest.mark.slow
def test_no_finding_outside_the_deviations(full_run):
    v = analysis.check(full_run, analysis.load_deviations(ROOT / analysis.DEVIATIONS))
    rep = analysis.report(full_run, v)
    print(rep)
    assert not v.new and not v.over, rep
    assert not v.stale, rep
    for tool, why in full_run.skipped.items():
        pytest.skip(f"{tool} did not run: {why} (the others found nothing new)")


# A null dereference and an out-of-bounds read, each on a path that a file's
# bytes choose: the kind of defect the analysis exists to stop.
PLANTED = r"""

/* planted by tests/test_static_analysis.py */
int clb_planted_null(const uint8_t *b, size_t size)
{
    const uint8_t *p = NULL;
    if (size > 8)
        p = b;
    return p[0];
}

int clb_planted_oob(const uint8_t *b)
{
    static const uint8_t widths[4] = { 1, 2, 4, 8 };
    int sum = 0;
    for (unsigned i = 0; i <= 4; i++)
        sum += widths[i] * b[i];
    return sum;
}
"""


def test_a_planted_defect_fails_the_analysis(tmp_path):
    """A scratch copy of the tree with the two defects appended to
    src/format.c: each tool that runs reports new findings in them, so the
    suite's check fails."""
    tools = _tools_or_skip()
    for d in ("src", "firmware", "docs"):
        shutil.copytree(ROOT / d, tmp_path / d)
    (tmp_path / "third_party").symlink_to((ROOT / "third_party").resolve())
    fmt = tmp_path / "src" / "format.c"
    fmt.write_text(fmt.read_text() + PLANTED)
    cfgs = [c for c in analysis.configs() if c.name == "x86_64"]
    res = analysis.analyse(tmp_path, tools=tools, cfgs=cfgs, only={"src/format.c"})
    v = analysis.check(res, analysis.load_deviations(tmp_path / analysis.DEVIATIONS))
    print(analysis.report(res, v))
    planted = {(f.tool, f.function) for f in v.new}
    by_defect = {fn: sorted(t for t, f in planted if f == fn)
                 for fn in ("clb_planted_null", "clb_planted_oob")}
    print("caught by:", by_defect)
    # the null dereference: cppcheck and clang. gcc -fanalyzer finds it in a
    # small file but not appended to format.c: its exploration budget is
    # spent on the validator first (no -Wanalyzer-too-complex by default),
    # which is why three analysers run, not one
    want = sorted({"cppcheck", "clang-analyzer"} & set(tools))
    assert set(want) <= set(by_defect["clb_planted_null"]), by_defect
    # the out-of-bounds read: cppcheck (arrayIndexOutOfBounds) and gcc
    # (the loop's last iteration is undefined); clang's default checkers
    # do not model array bounds
    want = sorted({"cppcheck", "gcc-analyzer"} & set(tools))
    assert set(want) <= set(by_defect["clb_planted_oob"]), by_defect
    # and nothing else in format.c is new: the planted lines alone fail the check
    others = [f for f in v.new if f.function not in by_defect]
    assert not others, others
