"""models/configs/*.json (real checkpoints' config.json fields) and the
sizes table `python -m colibri.model.memory --readme-table` prints: every config
is read by its family, and the f32 file size is the parameter count counted
here from the shape (4 bytes each) plus the header, table and 64-byte
padding, which is small; q4 < int8 < f32 (format.PRESET_* as now); and the
table the documentation shows (docs/QUANTISATION.md, "Memory") is the one
the command prints today, row for row."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from docs_text import doc_lines

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "models" / "configs").glob("*.json"))
FAMILY = {"mixtral": "mixtral", "qwen2_moe": "qwen2_moe", "qwen3_moe": "qwen3_moe",
          "olmoe": "olmoe", "granitemoe": "granitemoe"}


def _params(cfg: dict) -> int:
    """Decoder-only MoE parameters from config.json, written out here."""
    h, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    d = cfg.get("head_dim") or h // heads
    E = cfg.get("num_local_experts") or cfg["num_experts"]
    inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    attn = h * heads * d * 2 + 2 * h * kv * d
    if cfg["model_type"] == "qwen2_moe":
        attn += heads * d + 2 * kv * d                     # q, k, v biases
    if cfg["model_type"] in ("qwen3_moe", "olmoe"):
        attn += 2 * d if cfg["model_type"] == "qwen3_moe" else heads * d + kv * d  # q/k norms
    ffn = E * 3 * h * inter + E * h                        # experts, router
    shared = cfg.get("shared_expert_intermediate_size", 0)
    if shared:
        ffn += 3 * h * shared + h                          # shared expert, its gate
    tied = cfg.get("tie_word_embeddings", False)           # one matrix (TIED_LM_HEAD)
    return V * h * (1 if tied else 2) + L * (attn + ffn + 2 * h) + h   # embed, LM head


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_plans_to_its_parameter_count(path):
    from colibri.model import memory
    cfg = json.loads(path.read_text())
    f32, i8, q4 = (memory.plan_from_config(path, q) for q in ("f32", "int8", "q4"))
    assert f32.family == FAMILY[cfg["model_type"]]
    assert f32.shape.max_seq_len == min(cfg["max_position_embeddings"], 4096)
    n = _params(cfg)
    assert 4 * n <= f32.file_size() <= 4 * n * 1.001 + (1 << 20), (4 * n, f32.file_size())
    assert q4.file_size() < i8.file_size() < f32.file_size() / 3


def test_readme_table_lists_every_config_and_quant():
    p = subprocess.run([sys.executable, "-m", "colibri.model.memory", "--readme-table",
                        *map(str, CONFIGS)], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    rows = [r for r in p.stdout.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert len(rows) == 3 * len(CONFIGS)
    assert {r.split(" | ")[0][2:] for r in rows} == {c.stem for c in CONFIGS}
    # The documented table is this output: a change to the planner, a
    # preset or a config that moves a figure must reprint the table.
    documented = set(doc_lines())
    stale = [r for r in p.stdout.splitlines() if r.startswith("| ") and r not in documented]
    assert not stale, ("the sizes table in README.md / docs/ (docs/QUANTISATION.md) differs "
                       "from `python -m colibri.model.memory --readme-table "
                       "models/configs/*.json`; "
                       "rows not found:\n" + "\n".join(stale))
