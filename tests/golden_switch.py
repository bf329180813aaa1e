"""A tiny Switch Transformers checkpoint built locally with fixed seeds (no
hub), on awkward shapes: odd d_model 37, d_kv 10 (3 heads of 10 is not 37),
5 experts with capacity 2 so that tokens overflow, 4 encoder layers with 2
sparse (layers 1, 3), 3 decoder layers with 1 sparse (layer 1), 8 buckets
with max_distance 12 so log-spaced buckets occur within 16 tokens.
Weights are re-drawn at a scale that gives logits of order one (as
tests/golden_families.py does).

`scenario()` is the golden run: a right-padded encoder batch, a decoder
prefill, then cached single-token decode steps, transformers' logits for
each call.
"""
from __future__ import annotations

import numpy as np

SWITCH_CONFIG = dict(
    vocab_size=67, d_model=37, d_kv=10, d_ff=23, num_heads=3, num_experts=5,
    expert_capacity=2, num_layers=4, num_sparse_encoder_layers=2, num_decoder_layers=3,
    num_sparse_decoder_layers=1, relative_attention_num_buckets=8,
    relative_attention_max_distance=12, layer_norm_epsilon=1e-6, router_jitter_noise=0.0,
    dropout_rate=0.0, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1,
    decoder_start_token_id=0)


def make_switch(seed: int = 0, **overrides):
    """SwitchTransformersForConditionalGeneration (eval, float32, eager)."""
    import torch
    import transformers

    config = transformers.SwitchTransformersConfig(**{**SWITCH_CONFIG, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.SwitchTransformersForConditionalGeneration(config).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters()):
            if p.dim() == 1:      # T5 LayerNorm weights: around 1
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                std = 1.0 / fan_in ** 0.5
                if pname == "shared.weight":
                    std = 1.0
                if "relative_attention_bias" in pname:
                    std = 0.5
                if "router.classifier" in pname:
                    std = 2.0 / fan_in ** 0.5   # routers with clear preferences
                p.copy_(std * torch.randn(p.shape, generator=gen))
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


def hf_config_dict(model) -> dict:
    return model.config.to_dict()


def hf_state(model) -> dict:
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def scenario(model, enc_lengths=(11, 7), dec_prefill=4, decode=8, seed=0):
    """(enc_ids [b, S], enc_mask [b, S], decoder calls [[b, s] ...],
    transformers encoder output [b, S, D], logits per call [b, s, V])."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache

    cfg = model.config
    rng = np.random.default_rng(seed)
    b, n = len(enc_lengths), max(enc_lengths)
    ids = rng.integers(2, cfg.vocab_size, size=(b, n))
    mask = np.zeros((b, n), dtype=np.int64)
    for i, m in enumerate(enc_lengths):
        mask[i, :m] = 1
        ids[i, m:] = cfg.pad_token_id
    dec = rng.integers(2, cfg.vocab_size, size=(b, dec_prefill))
    dec[:, 0] = cfg.decoder_start_token_id
    calls = [dec] + [rng.integers(2, cfg.vocab_size, size=(b, 1)) for _ in range(decode)]
    tm = torch.as_tensor(mask)
    with torch.no_grad():
        enc = model.get_encoder()(input_ids=torch.as_tensor(ids), attention_mask=tm)
        cache = EncoderDecoderCache(DynamicCache(config=cfg), DynamicCache(config=cfg))
        logits = []
        for c in calls:
            out = model(encoder_outputs=enc, attention_mask=tm,
                        decoder_input_ids=torch.as_tensor(c), cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits.float().numpy())
    return ids, mask, calls, enc.last_hidden_state.float().numpy(), logits
