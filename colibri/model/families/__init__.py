"""One module per model family, as targets/ has one per target.

A family module maps a Hugging Face checkpoint onto the .colibri format:
which config.json fields give the routed experts' count and width and what
the model computes (a `format.Description`: feature flags and scalars), and
where each .colibri tensor kind lives in the checkpoint. The converter, the
reference and the C runtime know no family names: they read the description.
Adding a family is one module here (listed in MODULES) plus whatever new
feature it brings to the format.

`pick(config)` chooses the module from config.json's `architectures`
(or `model_type` when that is absent) and refuses any other model by name,
listing the supported ones.

This module is the registry: it imports every family module (the encoder-
decoder `switch_transformers` too, which has its own converter). What the
family modules share (`Family`, the tensor-name tables, the config.json
readers) is in common.py, which they import; nothing here is imported by
them. Imports: errors, the family modules.
"""
from __future__ import annotations

from . import granitemoe, granitemoe_shared, mixtral, olmoe, qwen2_moe, qwen3_moe
from . import switch_transformers
from .common import Family
from ...errors import ConversionError

# The decoder-only family modules, in the order the README lists them.
MODULES = (mixtral, qwen2_moe, qwen3_moe, olmoe, granitemoe, granitemoe_shared)
FAMILIES = tuple(m.__name__.rpartition(".")[2] for m in MODULES)
_BY_NAME = dict(zip(FAMILIES, MODULES))


def load(name: str) -> Family:
    return _BY_NAME[name].FAMILY


def all_families() -> list[Family]:
    return [m.FAMILY for m in MODULES]


def pick_gguf(arch: str, has_key, path=None) -> Family:
    """The family of a GGUF file's `general.architecture` (`has_key(name)`:
    whether the file has metadata key ARCH.name with a value > 0); `path`
    names the file in the refusal."""
    fams = [f for f in all_families() if f.gguf is not None and f.gguf.arch == arch]
    for f in fams:
        if f.gguf.selected_by and has_key(f.gguf.selected_by):
            return f
    for f in fams:
        if not f.gguf.selected_by:
            return f
    archs = sorted({f.gguf.arch for f in all_families() if f.gguf is not None})
    where = f"{path}: " if path is not None else ""
    raise ConversionError(f"{where}unsupported GGUF architecture {arch!r}: colibri converts the "
                          f"MoE architectures {', '.join(archs)} (with experts); this model "
                          "needs llama.cpp")


def supported() -> str:
    """'MixtralForCausalLM, Qwen2MoeForCausalLM, ...' for messages (the
    encoder-decoder Switch Transformers last: colibri.model.convert_encdec)."""
    return ", ".join([a for f in all_families() for a in f.architectures]
                     + list(switch_transformers.ARCHITECTURES))


def pick(cfg: dict) -> Family:
    """The family of a config.json, by `architectures` (else `model_type`)."""
    archs = cfg.get("architectures") or []
    if (any(a in switch_transformers.ARCHITECTURES for a in archs)
            or cfg.get("model_type") in switch_transformers.MODEL_TYPES):
        raise ConversionError(
            "an encoder-decoder (Switch Transformers) has no decoder-only family: convert "
            "it with ColibriExporter / colibri convert, which hand it to "
            "colibri.model.convert_encdec")
    fams = all_families()
    if archs:
        for f in fams:
            if any(a in f.architectures for a in archs):
                return f
        raise ConversionError(
            f"unsupported architecture {', '.join(map(str, archs))}: colibri converts the "
            f"MoE families {supported()}")
    mt = cfg.get("model_type")
    for f in fams:
        if mt in f.model_types:
            return f
    raise ConversionError(
        f"unsupported architecture (model_type {mt!r}, no 'architectures'): colibri "
        f"converts the MoE families {supported()} (model_type "
        f"{', '.join(t for f in fams for t in f.model_types)})")
