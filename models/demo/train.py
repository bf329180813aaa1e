"""Train the demo model: a small Mixtral with a BPE tokenizer on the Python documentation.

    .venv/bin/python models/demo/train.py          # writes models/demo/checkpoint/

Reproducible by construction: fixed seeds, a fixed step count (STEPS, never a
wall-clock cutoff), a deterministic corpus and tokenizer (prepare_corpus.py,
train_tokenizer.py), one thread. Takes 11 CPU-minutes (658 s measured, see
THREADS), 35 minutes of wall time while the machine was busy with other jobs.
Prints step, training loss (nats per token) and elapsed time every LOG_EVERY
steps and the held-out bits per byte every EVAL_EVERY steps. The checkpoint is committed, so
nobody needs to run this to use Colibri.

Model: transformers' MixtralForCausalLM over the 2048 pieces of the byte-level
BPE tokenizer that train_tokenizer.py writes to checkpoint/tokenizer.json (run
it first), 4 layers, hidden 128, 8 experts of intermediate width 112 with
top-2 routing, 4 query heads / 2 KV heads of 32, input and output embeddings
tied: 1,840,256 parameters, exactly the budget of the byte-level model it
replaced (vocabulary 256, untied, experts of width 128; its figures are kept in
byte_level/). Same steps, batch, sequence length (in tokens), schedule and
seeds as that model; a token covers ~3.5 bytes, so each step sees more text.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import prepare_corpus as corpus  # noqa: E402
import train_tokenizer  # noqa: E402

# MixtralConfig keyword arguments. The budget: 8 experts x 3 matrices x hidden
# x intermediate x 4 layers = 1.38 M of the 1.84 M parameters, the tied
# embedding 2048 x 128 = 0.26 M; with float32 model.safetensors stays under 8 MB.
MODEL_CONFIG = dict(
    vocab_size=train_tokenizer.VOCAB_SIZE, hidden_size=128, intermediate_size=112,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    num_local_experts=8, num_experts_per_tok=2,
    max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=True,
    # The load-balancing loss keeps all 8 experts in use (transformers adds
    # router_aux_loss_coef * aux to the loss when output_router_logits is set).
    router_aux_loss_coef=0.01,
    # The tokenizer has no special tokens (no bos/eos in the training stream).
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)

SEED = 1234
# One thread, not two: the machine's 2 cores are shared with other jobs, and
# with 2 threads torch's OpenMP barriers collapse under contention (measured
# at batch 32: 3-4 s/step at load 4 against 0.7 s/step with 1 thread; 0.43
# s/step with 2 threads on an idle machine).
THREADS = 1
STEPS = 1200
BATCH = 16
SEQ_LEN = 256            # = max_position_embeddings
PEAK_LR = 3e-3
MIN_LR_RATIO = 0.1       # cosine decays to PEAK_LR * MIN_LR_RATIO
WARMUP = 100
WEIGHT_DECAY = 0.1       # on matrices only, not on norm weights
GRAD_CLIP = 1.0
LOG_EVERY = 50
EVAL_EVERY = 200
EVAL_BATCHES = 8         # held-out windows of SEQ_LEN+1 tokens per evaluation: 8 x BATCH

LN2 = math.log(2.0)


def build_model():
    """A freshly initialised MixtralForCausalLM of MODEL_CONFIG (seeded)."""
    from transformers import MixtralConfig, MixtralForCausalLM
    kwargs = dict(MODEL_CONFIG)
    theta = kwargs.pop("rope_theta")
    config = MixtralConfig(**kwargs)
    # transformers 5 keeps rope_theta in rope_parameters; 4 in rope_theta.
    if getattr(config, "rope_parameters", None) is not None:
        config.rope_parameters["rope_theta"] = theta
    else:
        config.rope_theta = theta
    torch.manual_seed(SEED)
    return MixtralForCausalLM(config)


def lr_at(step: int, steps: int) -> float:
    """Linear warm-up for WARMUP steps, then cosine from PEAK_LR to
    PEAK_LR * MIN_LR_RATIO at the last step."""
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, steps - 1 - WARMUP)
    return PEAK_LR * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * t)))


def random_batch(tokens: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """BATCH random windows of SEQ_LEN+1 tokens -> [BATCH, SEQ_LEN+1] int64."""
    starts = rng.integers(0, len(tokens) - SEQ_LEN - 1, size=BATCH)
    return torch.from_numpy(np.stack([tokens[s:s + SEQ_LEN + 1] for s in starts]))


def heldout_batches(tokens: np.ndarray) -> list[torch.Tensor]:
    """EVAL_BATCHES batches of evenly spaced held-out windows [BATCH, SEQ_LEN+1]."""
    n = EVAL_BATCHES * BATCH
    starts = [i * (len(tokens) - SEQ_LEN - 1) // (n - 1) for i in range(n)]
    windows = np.stack([tokens[s:s + SEQ_LEN + 1] for s in starts])
    return [torch.from_numpy(windows[i:i + BATCH]) for i in range(0, n, BATCH)]


def next_token_nats(model, batch: torch.Tensor) -> torch.Tensor:
    """Total cross-entropy (nats) of predicting batch[:, 1:] from batch[:, :-1]."""
    logits = model(batch[:, :-1]).logits                           # [B, S, vocab]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                           batch[:, 1:].reshape(-1), reduction="sum")


@torch.no_grad()
def heldout_bpb(model, batches: list[torch.Tensor], lengths: torch.Tensor) -> float:
    """Bits per byte of the held-out windows: total nats / ln 2 / the bytes of
    the predicted tokens (lengths: [vocab] bytes per piece)."""
    model.eval()
    nats = sum(float(next_token_nats(model, b)) for b in batches)
    nbytes = sum(int(lengths[b[:, 1:]].sum()) for b in batches)
    model.train()
    return nats / LN2 / nbytes


def param_groups(model):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0}]


def train(out_dir: Path, steps: int) -> dict:
    torch.set_num_threads(THREADS)
    np_rng = np.random.default_rng(SEED)
    train_docs, held_docs = corpus.split()
    tok = train_tokenizer.load()
    lengths = torch.tensor(train_tokenizer.piece_lengths(tok))           # [vocab]
    train_bytes, held_bytes = corpus.join(train_docs), corpus.join(held_docs)
    train_tokens = np.array(train_tokenizer.encode_bytes(tok, train_bytes), dtype=np.int64)
    held_tokens = np.array(train_tokenizer.encode_bytes(tok, held_bytes), dtype=np.int64)
    held = heldout_batches(held_tokens)
    print(f"corpus: {len(train_docs)} training documents ({len(train_bytes)} bytes, "
          f"{len(train_tokens)} tokens), {len(held_docs)} held out ({len(held_bytes)} bytes, "
          f"{len(held_tokens)} tokens)", flush=True)

    model = build_model()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters; {steps} steps of {BATCH} x {SEQ_LEN} tokens "
          f"({steps * BATCH * SEQ_LEN / len(train_tokens):.2f} epochs)", flush=True)
    opt = torch.optim.AdamW(param_groups(model), lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8)

    start = time.monotonic()
    cpu_start = time.process_time()
    log = []
    window_loss = 0.0
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        batch = random_batch(train_tokens, np_rng)
        out = model(batch[:, :-1], output_router_logits=True)
        logits = out.logits                                          # [B, S, vocab]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                             batch[:, 1:].reshape(-1))               # nats per token
        loss = ce + model.config.router_aux_loss_coef * out.aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        window_loss += ce.item()

        done = step + 1
        if done % LOG_EVERY == 0 or done == steps:
            n = LOG_EVERY if done % LOG_EVERY == 0 else done % LOG_EVERY
            ce_avg = window_loss / n
            window_loss = 0.0
            entry = dict(step=done, loss=round(ce_avg, 4),
                         aux=round(out.aux_loss.item(), 4), lr=round(g["lr"], 6),
                         elapsed_s=round(time.monotonic() - start, 1))
            if done % EVAL_EVERY == 0 or done == steps:
                entry["heldout_bpb"] = round(heldout_bpb(model, held, lengths), 4)
            log.append(entry)
            print("  ".join(f"{k} {v}" for k, v in entry.items()), flush=True)

    elapsed = time.monotonic() - start
    cpu = time.process_time() - cpu_start
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    summary = dict(steps=steps, batch=BATCH, seq_len=SEQ_LEN, tokens=steps * BATCH * SEQ_LEN,
                   train_bytes_seen=round(steps * BATCH * SEQ_LEN * len(train_bytes)
                                          / len(train_tokens)),
                   parameters=n_params, train_seconds=round(elapsed, 1),
                   train_cpu_seconds=round(cpu, 1), vocab_size=tok.get_vocab_size(),
                   torch=torch.__version__, threads=THREADS, seed=SEED,
                   final_heldout_bpb=log[-1]["heldout_bpb"], log=log)
    (out_dir.parent / "train_log.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"saved {out_dir} after {elapsed:.0f} s", flush=True)
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train the Colibri demo model.")
    ap.add_argument("--out", type=Path, default=HERE / "checkpoint",
                    help="checkpoint directory (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=STEPS,
                    help="only for smoke tests: the committed model uses the default "
                         "(%(default)s)")
    args = ap.parse_args(argv)
    try:
        train(args.out, args.steps)
    except corpus.CorpusError as exc:
        print(f"train: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
