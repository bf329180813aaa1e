"""SCons tool: running a target's firmware under its emulator.

`scons target=X check` (env.ColibriCheck) is the regression run;
`scons target=X run` (env.ColibriRun) runs the firmware once and shows its
prompt and generated tokens (as text for a text prompt) and tokens/s.

env.ColibriCheck(alias, firmware, cli, model) runs the firmware (and
colibri-cli on Linux targets) under the target's emulator with a timeout,
compares the logits with the numpy reference (colibri.buildsteps.check) and
fails naming the target, prompt, worst position and error.
"""
from SCons.Action import Action
import SCons.Errors

from colibri.buildsteps import check, fwrun
from colibri.errors import ColibriError


def _check_action(target, source, env):
    t = env["COLIBRI_TARGET"]
    firmware, model = str(source[0]), str(source[1])
    cli = str(source[2]) if len(source) > 2 else None
    try:
        result = check.check_target(t, firmware, model, cli=cli)
    except ColibriError as exc:
        raise SCons.Errors.BuildError(errstr=str(exc))
    print(result.summary())
    if not result.ok:
        raise SCons.Errors.BuildError(errstr="\n".join(result.failures))
    return 0


def ColibriCheck(env, alias, firmware, model, cli=None):
    srcs = [firmware, model] + ([cli] if cli is not None else [])
    a = env.Alias(alias, srcs, Action(_check_action, "  CHECK [$COLIBRI_TARGET_NAME]"))
    env.AlwaysBuild(a)
    return a


def _run_action(target, source, env):
    try:
        shown = fwrun.run_and_show(env["COLIBRI_TARGET"], str(source[0]),
                                   as_text=env["COLIBRI_PROMPT_IS_TEXT"])
    except ColibriError as exc:
        raise SCons.Errors.BuildError(errstr=str(exc))
    print("\n".join(shown.lines))
    return 0


def ColibriRun(env, alias, firmware, prompt_is_text=False):
    a = env.Alias(alias, [firmware], Action(_run_action, "  RUN   [$COLIBRI_TARGET_NAME]"),
                  COLIBRI_PROMPT_IS_TEXT=prompt_is_text)
    env.AlwaysBuild(a)
    return a


def generate(env):
    env.AddMethod(ColibriCheck)
    env.AddMethod(ColibriRun)


def exists(env):
    return True
