"""The numpy reference of an encoder-decoder MoE (Switch Transformers, T5
lineage), the golden truth its C runtime is tested against.

What it computes (transformers' SwitchTransformersForConditionalGeneration):

- Both stacks: pre-norm blocks with T5 LayerNorm (RMS, no mean, no bias),
  attention WITHOUT the 1/sqrt(d) scaling, scores + a relative position bias
  that the first layer of each stack owns and every layer of the stack adds
  (bidirectional buckets in the encoder, causal in the decoder), then a
  feed-forward that is either dense (ReLU, wi/wo) or a top-1 MoE of ReLU
  experts; decoder blocks add cross-attention (no position bias) over the
  encoder output between self-attention and feed-forward.
- Top-1 router: softmax of router logits in float32, the first maximum wins;
  expert capacity counted per sequence of ONE call (the cumulative count of
  tokens routed to an expert along the sequence, padding included): a token
  beyond capacity gets no expert output, only the residual. Cached decode
  steps are one token per call, so they never overflow (transformers too).
- Final norm, then with tied embeddings the hidden state times
  d_model ** -0.5 before the LM head (the shared embedding).

The relative position bias is applied through tables indexed by relative
distance (`position_bias_table`), built once from the bucket embedding: the
converter writes those tables into the file, so the C runtime needs no
logarithm and agrees with this reference bit for bit on the buckets.

Weights come in as a mapping of canonical names (see `EncDecWeights`) to
float32 arrays (vectors) or callables x [N, cols] -> [N, rows] (matrices:
colibri.model.reference.Linear over a file's tensor, or `DenseMatrix`).

Shapes: b batch, s new tokens, S encoder length, T keys, H heads, d d_kv,
D d_model, F d_ff, E experts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from .reference import kv_quantize_i8, matmul_f32, rmsnorm, softmax  # noqa: F401 (softmax re-exported)
from ..errors import ColibriError
from ..file import blocks

F32 = np.float32


@dataclass(frozen=True)
class EncDecShape:
    vocab: int
    d_model: int
    d_kv: int
    n_heads: int
    d_ff: int
    n_experts: int
    expert_capacity: int
    enc_layers: int
    dec_layers: int
    enc_sparse: tuple[int, ...]     # encoder layers whose feed-forward is the MoE
    dec_sparse: tuple[int, ...]
    eps: float
    lm_scale: float                 # d_model ** -0.5 (tied embeddings) or 1.0
    decoder_start: int
    max_seq_len: int                # encoder and decoder positions
    max_batch: int = 8


class DenseMatrix:
    """A float32 weight [rows, cols] as a callable x [N, cols] -> [N, rows]."""

    def __init__(self, w: np.ndarray):
        self.w = np.ascontiguousarray(w, dtype=F32)
        self.rows, self.cols = self.w.shape

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return matmul_f32(self.w, x)


# --------------------------------------------------------------------------
# T5 relative position buckets, float32 like torch.
# --------------------------------------------------------------------------

def relative_position_bucket(rel: np.ndarray, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> np.ndarray:
    """Bucket [...] int64 of relative positions rel = key - query [...] int,
    as SwitchTransformersAttention._relative_position_bucket computes it:
    half the buckets exact distances, the rest log-spaced up to max_distance
    (the log in float32, truncated toward zero)."""
    rel = np.asarray(rel, dtype=np.int64)
    buckets = np.zeros(rel.shape, dtype=np.int64)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).astype(np.int64) * num_buckets
        n = np.abs(rel)
    else:
        n = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (n.astype(F32) / F32(max_exact)).astype(F32)
        lg = (np.log(ratio).astype(F32) / F32(math.log(max_distance / max_exact))).astype(F32)
        scaled = (lg * F32(num_buckets - max_exact)).astype(F32)
        large = max_exact + np.where(np.isfinite(scaled), scaled, 0).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(is_small, n, large)


def position_bias_table(rel_emb: np.ndarray, bidirectional: bool, num_buckets: int,
                        max_distance: int, max_len: int) -> np.ndarray:
    """The bias of every relative distance, [H, 2*max_len - 1] float32.

    rel_emb [num_buckets, H] is relative_attention_bias.weight. Column
    rel + max_len - 1 holds the bias of rel = key - query in
    [-(max_len - 1), max_len - 1]; in a causal stack only rel <= 0 is used."""
    rel = np.arange(-(max_len - 1), max_len)
    b = relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    return np.ascontiguousarray(np.asarray(rel_emb, dtype=F32)[b].T)   # [H, 2L-1]


def gather_bias(table: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    """table [H, 2L-1] -> bias [H, len(q_pos), len(k_pos)]."""
    max_len = (table.shape[1] + 1) // 2
    rel = k_pos[None, :] - q_pos[:, None]                               # [s, T]
    return table[:, rel + max_len - 1]


def t5_attention(q, k, v, bias, visible):
    """q [b, s, H, d]; k, v [b, T, H, d]; bias [H, s, T]; visible [b, s, T]
    bool -> [b, s, H, d]. No 1/sqrt(d) scaling. Rows without any visible key
    (never produced by the callers) would give zeros."""
    qh = q.transpose(0, 2, 1, 3)                                        # [b, H, s, d]
    kh = k.transpose(0, 2, 3, 1)                                        # [b, H, d, T]
    scores = (np.matmul(qh, kh) + bias[None]).astype(F32)               # [b, H, s, T]
    vis = visible[:, None]                                              # [b, 1, s, T]
    m = np.max(np.where(vis, scores, -np.inf), axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, F32(0))
    e = np.where(vis, np.exp(np.where(vis, scores - m, 0)), F32(0)).astype(F32)
    den = np.sum(e, axis=-1, keepdims=True, dtype=F32)
    p = (e / np.where(den > 0, den, F32(1))).astype(F32)
    out = np.matmul(p, v.transpose(0, 2, 1, 3))                         # [b, H, s, d]
    return out.transpose(0, 2, 1, 3).astype(F32)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, F32(0)).astype(F32)


def top1_with_capacity(probs: np.ndarray, capacity: int):
    """probs [b, s, E] float32 -> (expert [b, s] int64, prob [b, s] float32,
    kept [b, s] bool). The first maximum wins; a token is kept while the
    number of tokens of its sequence routed to its expert so far (itself
    included) is <= capacity (transformers' cumsum over the sequence)."""
    expert = np.argmax(probs, axis=-1)                                  # [b, s]
    prob = np.max(probs, axis=-1).astype(F32)
    onehot = np.eye(probs.shape[-1], dtype=np.int64)[expert]            # [b, s, E]
    priority = np.cumsum(onehot, axis=1)                                # [b, s, E]
    kept = np.take_along_axis(priority, expert[..., None], -1)[..., 0] <= capacity
    return expert, prob, kept


# --------------------------------------------------------------------------
# The model.
# --------------------------------------------------------------------------

class EncDecWeights:
    """Canonical names of an encoder-decoder's weights (stack "enc"/"dec"):

      embed [V, D] array               lm_head  matrix (V x D)
      {st}.pos_bias [H, 2L-1] array     {st}.final_norm [D]
      {st}.{l}.attn_norm [D]  {st}.{l}.wq/wk/wv (H*d x D)  {st}.{l}.wo (D x H*d)
      dec.{l}.cross_norm [D]  dec.{l}.cq/ck/cv/co  (as wq..wo)
      {st}.{l}.ffn_norm [D]
      dense layer:  {st}.{l}.wi (F x D), {st}.{l}.wo_ff (D x F)
      sparse layer: {st}.{l}.router (E x D), {st}.{l}.e{e}.wi, {st}.{l}.e{e}.wo
    """

    def __init__(self, tensors: Mapping[str, object], embed_fn: Callable | None = None):
        self.t = tensors
        self.embed_fn = embed_fn     # ids [...] -> [..., D]; default: rows of "embed"

    def __getitem__(self, name):
        try:
            return self.t[name]
        except KeyError:
            raise ColibriError(f"encoder-decoder weights: {name} is missing") from None

    def embed(self, ids: np.ndarray) -> np.ndarray:
        if self.embed_fn is not None:
            return self.embed_fn(ids)
        return np.asarray(self.t["embed"], dtype=F32)[ids]


class EncDecReference:
    """encode(ids, mask) once, then decode(tokens) steps with a KV cache.

    ref = EncDecReference(shape, weights)
    enc = ref.encode(ids [b, S], mask [b, S])     # [b, S, D], final-normed
    logits = ref.decode(tokens [b, s])            # [b, s, V]; next call continues
    """

    def __init__(self, shape: EncDecShape, weights: EncDecWeights, kv: str = "f32"):
        if kv not in ("f32", "i8"):
            raise ColibriError(f"kv={kv!r}: the KV cache is f32 or i8")
        self.shape, self.w, self.kv = shape, weights, kv
        self._enc = None
        self.reset_decoder()

    def _cached(self, x: np.ndarray) -> np.ndarray:
        """Keys or values [b, s, H, d] as the KV cache holds them: kv="i8"
        rounds each head vector as the C runtime's 8-bit cache does
        (reference.kv_quantize_i8); the encoder's, the decoder's and the
        cross-attention's alike."""
        return kv_quantize_i8(x) if self.kv == "i8" else x

    def reset_decoder(self):
        self._k = self._v = None        # per decoder layer [b, T, H, d]
        self._ck = self._cv = None      # per decoder layer cross K/V [b, S, H, d]
        self._dec_len = 0

    # ---- pieces ------------------------------------------------------------

    def _proj(self, name, x):
        """name's matrix applied to x [b, s, cols] -> [b, s, rows]."""
        b, s, c = x.shape
        return self.w[name](x.reshape(b * s, c)).reshape(b, s, -1).astype(F32)

    def _heads(self, x):
        b, s, _ = x.shape
        return x.reshape(b, s, self.shape.n_heads, self.shape.d_kv)

    def _ffn(self, st, l, sparse, h):
        """h [b, s, D] -> h + ffn(norm(h)), the capacity counted over s."""
        sh = self.shape
        b, s, dim = h.shape
        xn = rmsnorm(h, self.w[f"{st}.{l}.ffn_norm"], sh.eps)           # [b, s, D]
        if not sparse:
            y = self._proj(f"{st}.{l}.wo_ff", relu(self._proj(f"{st}.{l}.wi", xn)))
            return (h + y).astype(F32)
        probs = softmax(self._proj(f"{st}.{l}.router", xn))            # [b, s, E] float32
        expert, prob, kept = top1_with_capacity(probs, sh.expert_capacity)
        self.routing.append((st, l, expert, kept))
        flat = xn.reshape(b * s, dim)
        y = np.zeros((b * s, dim), dtype=F32)
        ef, kf, pf = expert.reshape(-1), kept.reshape(-1), prob.reshape(-1)
        for e in range(sh.n_experts):
            tok = np.nonzero((ef == e) & kf)[0]
            if tok.size:
                ye = self.w[f"{st}.{l}.e{e}.wo"](relu(self.w[f"{st}.{l}.e{e}.wi"](flat[tok])))
                y[tok] = (ye * pf[tok, None]).astype(F32)
        return (h + y.reshape(b, s, dim)).astype(F32)

    # ---- encoder -------------------------------------------------------------

    def encode(self, ids, mask=None) -> np.ndarray:
        """Encoder output [b, S, D] (final-normed) for ids [b, S] with mask
        [b, S] 0/1 (0 = padding key). Resets the decoder."""
        sh = self.shape
        ids = np.atleast_2d(np.asarray(ids, dtype=np.int64))
        b, n = ids.shape
        if n < 1 or n > sh.max_seq_len:
            raise ColibriError(f"encoder input of {n} tokens: 1 to {sh.max_seq_len} allowed")
        if b < 1 or b > sh.max_batch:
            raise ColibriError(f"batch {b}: 1 to {sh.max_batch} allowed")
        mask = np.ones((b, n), bool) if mask is None else np.atleast_2d(mask).astype(bool)
        pos = np.arange(n)
        bias = gather_bias(self.w["enc.pos_bias"], pos, pos)             # [H, S, S]
        visible = np.broadcast_to(mask[:, None, :], (b, n, n))
        self.routing = []
        x = self.w.embed(ids).astype(F32)                               # [b, S, D]
        for l in range(sh.enc_layers):
            xn = rmsnorm(x, self.w[f"enc.{l}.attn_norm"], sh.eps)
            q, k, v = (self._heads(self._proj(f"enc.{l}.{m}", xn)) for m in ("wq", "wk", "wv"))
            att = t5_attention(q, self._cached(k), self._cached(v), bias, visible).reshape(b, n, -1)
            x = (x + self._proj(f"enc.{l}.wo", att)).astype(F32)
            x = self._ffn("enc", l, l in sh.enc_sparse, x)
        self._enc = rmsnorm(x, self.w["enc.final_norm"], sh.eps)
        self._enc_mask = mask
        self.reset_decoder()
        return self._enc

    # ---- decoder -------------------------------------------------------------

    def decode(self, tokens) -> np.ndarray:
        """Logits [b, s, V] of decoder tokens [b, s] continuing the cached
        ones (the first call starts at position 0: tokens usually begin with
        decoder_start)."""
        sh = self.shape
        if self._enc is None:
            raise ColibriError("decode before encode: run encode(ids) first")
        tokens = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
        b, s = tokens.shape
        if b != self._enc.shape[0]:
            raise ColibriError(f"decoder batch {b} differs from the encoder batch "
                               f"{self._enc.shape[0]}")
        past = self._dec_len
        total = past + s
        if total > sh.max_seq_len:
            raise ColibriError(f"decoder positions {total} above max_seq_len {sh.max_seq_len}")
        if past == 0:
            self._k = [np.zeros((b, sh.max_seq_len, sh.n_heads, sh.d_kv), F32)
                       for _ in range(sh.dec_layers)]
            self._v = [np.zeros_like(self._k[0]) for _ in range(sh.dec_layers)]
            self._ck = [self._cached(self._heads(self._proj(f"dec.{l}.ck", self._enc)))
                        for l in range(sh.dec_layers)]
            self._cv = [self._cached(self._heads(self._proj(f"dec.{l}.cv", self._enc)))
                        for l in range(sh.dec_layers)]
        q_pos, k_pos = past + np.arange(s), np.arange(total)
        bias = gather_bias(self.w["dec.pos_bias"], q_pos, k_pos)         # [H, s, T]
        causal = k_pos[None, :] <= q_pos[:, None]                        # [s, T]
        visible = np.broadcast_to(causal[None], (b, s, total))
        n_enc = self._enc.shape[1]
        cross_vis = np.broadcast_to(self._enc_mask[:, None, :], (b, s, n_enc))
        zero_bias = np.zeros((sh.n_heads, s, n_enc), F32)
        self.routing = []
        x = self.w.embed(tokens).astype(F32)
        for l in range(sh.dec_layers):
            xn = rmsnorm(x, self.w[f"dec.{l}.attn_norm"], sh.eps)
            q, k, v = (self._heads(self._proj(f"dec.{l}.{m}", xn)) for m in ("wq", "wk", "wv"))
            self._k[l][:, past:total] = self._cached(k)
            self._v[l][:, past:total] = self._cached(v)
            att = t5_attention(q, self._k[l][:, :total], self._v[l][:, :total], bias, visible)
            x = (x + self._proj(f"dec.{l}.wo", att.reshape(b, s, -1))).astype(F32)
            xn = rmsnorm(x, self.w[f"dec.{l}.cross_norm"], sh.eps)
            q = self._heads(self._proj(f"dec.{l}.cq", xn))
            att = t5_attention(q, self._ck[l], self._cv[l], zero_bias, cross_vis)
            x = (x + self._proj(f"dec.{l}.co", att.reshape(b, s, -1))).astype(F32)
            x = self._ffn("dec", l, l in sh.dec_sparse, x)
        self._dec_len = total
        xn = rmsnorm(x, self.w["dec.final_norm"], sh.eps)
        if sh.lm_scale != 1.0:
            xn = (xn * F32(sh.lm_scale)).astype(F32)
        return self._proj("lm_head", xn)

    def generate(self, ids, n_new: int, mask=None):
        """Greedy: encode ids [S] (batch 1), decode from decoder_start.
        Returns (tokens [n_new], logits rows [n_new, V])."""
        self.encode(np.atleast_2d(ids), None if mask is None else np.atleast_2d(mask))
        tok, out, rows = self.shape.decoder_start, [], []
        for _ in range(n_new):
            row = self.decode([[tok]])[0, -1]
            tok = int(np.argmax(row))
            out.append(tok)
            rows.append(row)
        return np.array(out, np.int64), np.array(rows, F32)


# --------------------------------------------------------------------------
# A .colibri file (ENC_DEC) as canonical weights.
# --------------------------------------------------------------------------

def canonical_name(kind, layer, expert, encoder_layers: int) -> str:
    """The EncDecWeights name of a file tensor (kind, layer, expert). File
    layers [0, encoder_layers) are the encoder's, the rest the decoder's."""
    from ..file.format import Kind
    kind = Kind(kind)
    glob = {Kind.EMBED: "embed", Kind.LM_HEAD: "lm_head", Kind.ENC_POS_BIAS: "enc.pos_bias",
            Kind.DEC_POS_BIAS: "dec.pos_bias", Kind.ENC_FINAL_NORM: "enc.final_norm",
            Kind.FINAL_NORM: "dec.final_norm"}
    if kind in glob:
        return glob[kind]
    st, l = ("enc", layer) if layer < encoder_layers else ("dec", layer - encoder_layers)
    if kind == Kind.EXPERT_W1:
        return f"{st}.{l}.e{expert}.wi"
    if kind == Kind.EXPERT_W2:
        return f"{st}.{l}.e{expert}.wo"
    per_layer = {Kind.ATTN_NORM: "attn_norm", Kind.WQ: "wq", Kind.WK: "wk", Kind.WV: "wv",
                 Kind.WO: "wo", Kind.XATTN_NORM: "cross_norm", Kind.XWQ: "cq", Kind.XWK: "ck",
                 Kind.XWV: "cv", Kind.XWO: "co", Kind.FFN_NORM: "ffn_norm",
                 Kind.ROUTER: "router", Kind.DENSE_W1: "wi", Kind.DENSE_W2: "wo_ff"}
    if kind not in per_layer:
        raise ColibriError(f"{kind.name} is not a tensor of an encoder-decoder file")
    return f"{st}.{l}.{per_layer[kind]}"


def decoder_bias_columns(dec_table: np.ndarray) -> np.ndarray:
    """DEC_POS_BIAS [H, L] (column j: distance j, key j positions before the
    query) -> the [H, 2L-1] form gather_bias indexes (rel = -j at column
    L-1-j; later keys are never visible, their columns are 0)."""
    h, n = dec_table.shape
    full = np.zeros((h, 2 * n - 1), F32)
    full[:, :n] = dec_table[:, ::-1]
    return full


def from_file(file_or_path, kv: str = "f32") -> EncDecReference:
    """The reference over an ENC_DEC .colibri file, with the file's storage
    types (colibri.model.reference.Linear: F32, I8_GROUP, I16_ROW products)
    and the KV cache type kv (f32 or i8, as colibri_options.kv_dtype)."""
    from pathlib import Path

    from ..file import format as cformat
    from ..file.format import DType, Feat, Kind, tensor_order
    from .reference import Linear
    cf = file_or_path
    if isinstance(cf, (str, Path)):
        cf = cformat.read_file(cf)
    d, s = cf.desc, cf.shape
    if not d.has(Feat.ENC_DEC):
        raise ColibriError("not an encoder-decoder file (no ENC_DEC flag): use "
                           "colibri.model.reference.Reference")
    n_enc = d.encoder_layers
    dense = set(d.dense_layers)
    shape = EncDecShape(
        vocab=s.vocab, d_model=s.hidden, d_kv=s.head_dim, n_heads=s.n_heads, d_ff=s.intermediate,
        n_experts=s.n_experts, expert_capacity=d.expert_capacity, enc_layers=n_enc,
        dec_layers=s.n_layers - n_enc,
        enc_sparse=tuple(l for l in range(n_enc) if l not in dense),
        dec_sparse=tuple(l - n_enc for l in range(n_enc, s.n_layers) if l not in dense),
        eps=s.rms_eps, lm_scale=d.lm_scale, decoder_start=d.decoder_start,
        max_seq_len=s.max_seq_len, max_batch=s.max_batch)
    t, embed_fn = {}, None
    for kind, layer, expert in tensor_order(s, d):
        if kind == Kind.DESC:
            continue
        ten = cf.tensor(kind, layer, expert)
        name = canonical_name(kind, layer, expert, n_enc)
        if kind == Kind.EMBED:
            vals = ten.values
            if DType(ten.dtype) == DType.I16_ROW:
                sc = ten.scales.astype(F32)
                embed_fn = (lambda ids, v=vals, sc=sc:   # float(q) * scale, as C
                            (v[ids].astype(F32) * sc[ids][..., None]).astype(F32))
            elif blocks.is_block(ten.dtype):   # the blocks' exact values
                t[name] = blocks.dequantize(vals, ten.dtype, ten.cols)
            else:
                t[name] = vals.astype(F32)
        elif kind == Kind.DEC_POS_BIAS:
            t[name] = decoder_bias_columns(ten.values.astype(F32))
        elif kind == Kind.ENC_POS_BIAS:
            t[name] = ten.values.astype(F32)
        elif kind in (Kind.ATTN_NORM, Kind.XATTN_NORM, Kind.FFN_NORM, Kind.FINAL_NORM,
                      Kind.ENC_FINAL_NORM):
            t[name] = ten.values.astype(F32).reshape(-1)
        else:
            t[name] = Linear(ten, s.group_size)
    return EncDecReference(shape, EncDecWeights(t, embed_fn), kv=kv)
