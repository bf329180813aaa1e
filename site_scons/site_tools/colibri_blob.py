"""SCons tool: embedding the model in the firmware.

env.ColibriFirmwareInputs(out_dir, model) generates, from the .colibri file,
model.bin (the target's byte order), model_blob.S (.incbin into the
.colibri_model section) and fw_config.h (arena size, prompts, KV cache)
through colibri.buildsteps.blob.prepare_firmware_inputs; `tables_obj`
(firmware/arena_tables.c compiled for the target) gives the arena formula
the target's struct sizes. env.ColibriTestModel(path)
writes the default tiny model (colibri.buildsteps.testmodel).
"""
from SCons.Action import Action
import SCons.Errors
import os

from colibri.buildsteps import blob, testmodel
from colibri.errors import ColibriError
from colibri.text.sampling import SampleParams


def _inputs_action(target, source, env):
    # SConstruct checks a model= file before building; this catches what it
    # cannot (the file changed meanwhile, prompts that do not fit the model)
    # as one "scons: *** [target] message" line, not a traceback.
    try:
        blob.prepare_firmware_inputs(str(source[0]), os.path.dirname(str(target[0])),
                                     env["COLIBRI_TARGET"], prompts=env["COLIBRI_PROMPTS"],
                                     n_generate=env["COLIBRI_GENERATE"],
                                     text=env["COLIBRI_PROMPT_TEXT"],
                                     sampling=SampleParams(**dict(env["COLIBRI_SAMPLING"])),
                                     kv=env["COLIBRI_KV"],
                                     tables_object=str(source[1]) if len(source) > 1 else None)
    except ColibriError as exc:
        raise SCons.Errors.BuildError(errstr=str(exc))
    return 0


def _model_action(target, source, env):
    testmodel.make_model(str(target[0]), env["COLIBRI_TEST_QUANT"])
    return 0


def ColibriFirmwareInputs(env, out_dir, model, prompts=blob.DEFAULT_PROMPTS,
                          n_generate=blob.DEFAULT_GENERATE, text="", sampling=None,
                          kv="f32", tables_obj=None):
    """prompts: token-id tuples the firmware runs (when `text` is empty);
    text: a text prompt (tokenised on the device when the model has a
    tokenizer); n_generate: tokens chosen after each; sampling: a
    colibri.text.sampling.SampleParams (default greedy); kv: the KV cache, "f32"
    or "i8"; tables_obj: the compiled firmware/arena_tables.c (None: the
    bound memory.tables_bound gives)."""
    out = env.Dir(out_dir)
    prompts = tuple(tuple(p) for p in prompts)
    sampling = tuple(sorted(vars(sampling or SampleParams()).items()))
    nodes = env.Command(
        [out.File("model.bin"), out.File("model_blob.S"), out.File("fw_config.h"),
         out.File(blob.INPUTS_JSON)],
        [model] + ([tables_obj] if tables_obj is not None else []),
        Action(_inputs_action, "  BLOB  [$COLIBRI_TARGET_NAME] $TARGET"),
        COLIBRI_PROMPTS=prompts, COLIBRI_GENERATE=n_generate, COLIBRI_PROMPT_TEXT=text,
        COLIBRI_SAMPLING=sampling, COLIBRI_KV=kv)
    # Regenerate when the generator, the prompts, the sampling or the
    # target's byte order/pointer size change.
    env.Depends(nodes, [env.File("#colibri/buildsteps/blob.py"),
                        env.File("#colibri/model/memory.py"),
                        env.Value((env["COLIBRI_TARGET"].byte_order,
                                   env["COLIBRI_TARGET"].pointer_bytes, prompts, n_generate,
                                   text, sampling, kv))])
    return nodes


def ColibriTestModel(env, path, quant="int8"):
    nodes = env.Command(path, [], Action(_model_action, "  MODEL $TARGET"),
                        COLIBRI_TEST_QUANT=quant)
    env.Depends(nodes, [env.File("#colibri/buildsteps/testmodel.py"), env.Value(quant)])
    return nodes


def generate(env):
    env.AddMethod(ColibriFirmwareInputs)
    env.AddMethod(ColibriTestModel)


def exists(env):
    return True
