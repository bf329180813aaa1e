"""SCons tool: running a target's firmware under its emulator.

`scons target=X check` (env.ColibriCheck) is the regression run;
`scons target=X run` (env.ColibriRun) runs the firmware once and shows its
prompt and generated tokens (as text for a text prompt) and tokens/s.

env.ColibriCheck(alias, firmware, cli, model) runs the firmware (and
colibri-cli on Linux targets) under the target's emulator with a timeout, on
every emulated CPU the target lists (cpu_kernels: aarch64 runs a core
without and one with the dot-product extension), compares the logits with
the numpy reference and the kernel table with the one expected on that CPU
(colibri.buildsteps.check) and fails naming the target, CPU, prompt, worst
position and error.
"""
from SCons.Action import Action
import SCons.Errors

from colibri.buildsteps import check, fwrun
from colibri.errors import ColibriError


def _check_action(target, source, env):
    t = env["COLIBRI_TARGET"]
    firmware, model = str(source[0]), str(source[1])
    cli = str(source[2]) if len(source) > 2 else None
    simd = bool(env["COLIBRI_OPTIONS"].kernels)
    try:
        results = check.check_all_cpus(t, firmware, model, cli=cli, simd=simd)
    except ColibriError as exc:
        raise SCons.Errors.BuildError(errstr=str(exc))
    for result in results:
        print(result.summary())
    failures = [f for result in results for f in result.failures]
    if failures:
        raise SCons.Errors.BuildError(errstr="\n".join(failures))
    return 0


def ColibriCheck(env, alias, firmware, model, cli=None):
    srcs = [firmware, model] + ([cli] if cli is not None else [])
    a = env.Alias(alias, srcs, Action(_check_action, "  CHECK [$COLIBRI_TARGET_NAME]"))
    env.AlwaysBuild(a)
    return a


def _run_action(target, source, env):
    try:
        shown = fwrun.run_and_show(env["COLIBRI_TARGET"], str(source[0]),
                                   as_text=bool(env["COLIBRI_PROMPT_TEXT"]),
                                   text=env["COLIBRI_PROMPT_TEXT"])
    except ColibriError as exc:
        raise SCons.Errors.BuildError(errstr=str(exc))
    print("\n".join(shown.lines))
    return 0


def ColibriRun(env, alias, firmware, prompt_text=""):
    a = env.Alias(alias, [firmware], Action(_run_action, "  RUN   [$COLIBRI_TARGET_NAME]"),
                  COLIBRI_PROMPT_TEXT=prompt_text)
    env.AlwaysBuild(a)
    return a


def generate(env):
    env.AddMethod(ColibriCheck)
    env.AddMethod(ColibriRun)


def exists(env):
    return True
