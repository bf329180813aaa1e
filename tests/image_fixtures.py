"""Shared pieces of the image, OTA and model-check tests: the smallest model
a firmware can embed, a signing key and that model's bytes.

Test modules import what they use; pytest registers imported fixtures."""
from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from colibri.buildsteps import testmodel
from colibri.file.format import ModelShape

TINY = ModelShape(vocab=8, hidden=4, intermediate=4, max_seq_len=4, n_layers=1, n_heads=1,
                  n_kv_heads=1, head_dim=4, n_experts=2, top_k=1, group_size=4)


@pytest.fixture(scope="module")
def key():
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def model_blob(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.colibri"
    testmodel.make_model(path, "f32", shape=TINY)
    return path.read_bytes()
