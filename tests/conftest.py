"""Shared pytest fixtures: golden Hugging Face checkpoints and their .colibri
conversions, built once per test session and cached.

Factory fixtures (session-scoped; call them with arguments):

- `hf_model(name)` -> transformers MixtralForCausalLM (eval, float32) of
  tests/golden_configs.py GOLDEN_CONFIGS[name], seed 0. Treat it as read-only.
- `hf_checkpoint(name)` -> Path of a directory holding that model saved with
  `save_pretrained` (config.json + model.safetensors, float32).
- `colibri_file(name, quant)` -> Path of that checkpoint converted by the real
  converter (`colibri.model.convert.ColibriExporter`) with quant "f32" or "int8",
  max_seq_len GOLDEN_MAX_SEQ, max_batch GOLDEN_MAX_BATCH, group size 32 (the
  format's default).
- `reference(name, quant)` -> a colibri.model.reference.Reference over that file.
  Shared: it holds a KV cache, so every forward with n_past=0 starts afresh;
  don't rely on a cache another test left behind.

Names are the keys of GOLDEN_CONFIGS: "tiny", "awkward", "wide". Everything
lives under one pytest temporary directory; nothing is downloaded.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/golden_configs.py

from golden_configs import GOLDEN_CONFIGS, save_mixtral, make_mixtral  # noqa: E402

GOLDEN_NAMES = ("tiny", "awkward", "wide")
# The 4-bit mix's golden models: tiny (narrow rows: Q5_0 and int8 fallbacks)
# and k256 (Q4_K, Q6_K, and Q5_0 in one expert).
Q4_NAMES = ("tiny", "k256")
GOLDEN_MAX_SEQ = 64     # = max_position_embeddings of every golden config
GOLDEN_MAX_BATCH = 4    # the golden tests use batches up to 3
# "q4+q4_0" / "q4+q5_k": the q4 mix with the experts in Q4_0 / Q5_K
# (--experts ...): the mix itself picks neither, so these files keep them
# under the golden tests; "int8+q8_0" the int8 preset with Q8_0 experts.
QUANTS = ("f32", "int8", "q4", "q4+q4_0", "q4+q5_k", "int8+q8_0")


def _check_name(name: str) -> None:
    if name not in GOLDEN_CONFIGS:
        raise KeyError(f"unknown golden config {name!r}; known: {', '.join(GOLDEN_NAMES)}")


@pytest.fixture(scope="session")
def hf_model():
    """Factory: hf_model(name) -> cached transformers MixtralForCausalLM."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cache = {}

    def get(name: str):
        _check_name(name)
        if name not in cache:
            model = make_mixtral(name, seed=0)
            # eager attention: the plain softmax(QK^T)V that FORMAT.md describes.
            model.config._attn_implementation = "eager"
            cache[name] = model
        return cache[name]
    return get


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """Factory: hf_checkpoint(name) -> Path of a cached save_pretrained dir."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("hf")
    cache = {}

    def get(name: str) -> Path:
        _check_name(name)
        if name not in cache:
            cache[name] = save_mixtral(name, root / name, seed=0)
        return cache[name]
    return get


@pytest.fixture(scope="session")
def colibri_file(tmp_path_factory, hf_checkpoint):
    """Factory: colibri_file(name, quant) -> Path of a cached converted file."""
    root = tmp_path_factory.mktemp("colibri")
    cache = {}

    def get(name: str, quant: str = "f32") -> Path:
        _check_name(name)
        if quant not in QUANTS:
            raise KeyError(f"unknown quant {quant!r}; known: {', '.join(QUANTS)}")
        key = (name, quant)
        if key not in cache:
            from colibri.model.convert import ColibriExporter
            out = root / f"{name}-{quant}.colibri"
            preset, _, experts = quant.partition("+")
            ColibriExporter(hf_checkpoint(name), quant=preset,
                            quantize_experts=experts or None,
                            max_seq_len=GOLDEN_MAX_SEQ,
                            max_batch=GOLDEN_MAX_BATCH).export(out)
            cache[key] = out
        return cache[key]
    return get


@pytest.fixture(scope="session")
def reference(colibri_file):
    """Factory: reference(name, quant) -> cached Reference over colibri_file."""
    from colibri.model.reference import Reference
    cache = {}

    def get(name: str, quant: str = "f32"):
        key = (name, quant)
        if key not in cache:
            cache[key] = Reference(colibri_file(name, quant))
        return cache[key]
    return get


@pytest.fixture(scope="session")
def shared_builds(tmp_path_factory):
    """SCons builds sharing their compiled libraries (tests/shared_builds.py),
    across the xdist workers of the run: shared_builds.build(out_dir,
    "target=all", "model=M", ...)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import targets
    from shared_builds import SharedBuilds
    from test_runtime_support import session_shared_dir
    return SharedBuilds(session_shared_dir(tmp_path_factory, "shared-builds"),
                        list(targets.load_all()))
