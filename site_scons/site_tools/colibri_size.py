"""SCons tool: size report and budgets (pyelftools, colibri.buildsteps.size).

env.ColibriSizeReport(report_txt, [firmware_elf, libcolibri_a, firmware_bin(, boot_elf)],
model=(model_bin, arena_tables_o), kv="f32"|"i8") writes the report (with the
model's flash and RAM when `model` is given: size.model_memory) and fails the build, with one message naming the budget,
its total, the largest section and symbols, when a budget of the target
module is exceeded. env.ColibriShowSize(report_txt) prints it (`scons size`).
"""
from SCons.Action import Action
import SCons.Errors

from colibri.buildsteps import blob, size


def _report_action(target, source, env):
    t = env["COLIBRI_TARGET"]
    n = env["COLIBRI_SIZE_N_ELF"]
    report = size.measure(str(source[0]), str(source[1]), str(source[2]),
                          str(source[3]) if n > 3 else None)
    if len(source) > n:   # the model blob and the struct-size probe
        tables, chunk = blob.table_sizes_from_object(str(source[n + 1]))
        report.model = size.model_memory(str(source[n]), env["COLIBRI_KV"], tables, chunk)
    with open(str(target[0]), "w") as f:
        f.write(size.format_report(report, t))
    problems = size.check_budgets(report, t, env["COLIBRI_OPTIONS"])
    if problems:
        raise SCons.Errors.BuildError(errstr="size budget exceeded: " + " | ".join(problems))
    return 0


def _show_action(target, source, env):
    with open(str(source[0])) as f:
        print(f.read(), end="")
    return 0


def ColibriSizeReport(env, report, sources, model=None, kv="f32"):
    """sources: [firmware_elf, libcolibri_a, firmware_bin(, boot_elf)];
    model: (model.bin, arena_tables.o) of the firmware, kv its KV cache."""
    nodes = env.Command(report, list(sources) + list(model or ()), Action(
        _report_action, "  SIZE  [$COLIBRI_TARGET_NAME] $TARGET"),
        COLIBRI_SIZE_N_ELF=len(sources), COLIBRI_KV=kv)
    # Re-check when the budgets (targets/*.py) or the measuring code change.
    t = env["COLIBRI_TARGET"]
    env.Depends(nodes, [env.Value(sorted(size.budgets_for(t, env["COLIBRI_OPTIONS"]).items())),
                        env.Value(kv),
                        env.File("#colibri/buildsteps/size.py"),
                        env.File("#colibri/model/memory.py")])
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
