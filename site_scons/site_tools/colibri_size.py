"""SCons tool: size report and budgets (pyelftools, colibri.buildsteps.size).

env.ColibriSizeReport(report_txt, [firmware_elf, libcolibri_a, firmware_bin(, boot_elf)])
writes the report and fails the build, with one message naming the budget,
its total, the largest section and symbols, when a budget of the target
module is exceeded. env.ColibriShowSize(report_txt) prints it (`scons size`).
"""
from SCons.Action import Action
import SCons.Errors

from colibri.buildsteps import size


def _report_action(target, source, env):
    t = env["COLIBRI_TARGET"]
    report = size.measure(str(source[0]), str(source[1]), str(source[2]),
                          str(source[3]) if len(source) > 3 else None)
    with open(str(target[0]), "w") as f:
        f.write(size.format_report(report, t))
    problems = size.check_budgets(report, t)
    if problems:
        raise SCons.Errors.BuildError(errstr="size budget exceeded: " + " | ".join(problems))
    return 0


def _show_action(target, source, env):
    with open(str(source[0])) as f:
        print(f.read(), end="")
    return 0


def ColibriSizeReport(env, report, sources):
    nodes = env.Command(report, sources, Action(
        _report_action, "  SIZE  [$COLIBRI_TARGET_NAME] $TARGET"))
    # Re-check when the budgets (targets/*.py) or the measuring code change.
    t = env["COLIBRI_TARGET"]
    env.Depends(nodes, [env.Value(sorted(t.budgets.items())),
                        env.File("#colibri/buildsteps/size.py")])
    return nodes


def ColibriShowSize(env, alias, report):
    a = env.Alias(alias, report, Action(_show_action, cmdstr=None))
    env.AlwaysBuild(a)
    return a


def generate(env):
    env.AddMethod(ColibriSizeReport)
    env.AddMethod(ColibriShowSize)


def exists(env):
    return True
