"""The numpy reference forward pass over a .colibri file.

This is the golden truth the C runtime is tested against, so it computes
exactly what docs/FORMAT.md sections 5 and 6 say, in float32, with the same
dequantisation arithmetic as the C kernels:

- F32 matrix-vector: float32 accumulation (BLAS sgemm).
- I16_ROW (router, any I16_ROW matrix): `scale[r] * (float(q) @ x)`.
- I16_ROW embedding: `float(q[token]) * scale[token]`.
- I8_GROUP: activations quantised per group (colibri.file.quant), exact integer
  group dots, combined as `float(dot) * (scale[r,g] * xs[g])` and summed over
  the groups in order, in float32.

Usage:

    ref = Reference("model.colibri")
    logits = ref.forward(tokens, mask)             # [b, s, vocab], resets the cache
    more = ref.forward(next_tokens, n_past=s)      # continues with the KV cache
    tokens, rows = ref.generate([1, 2, 3], 8)      # greedy
    ref.router_choices()                           # per layer [b, s, top_k] experts

Shapes in comments: b batch, s new tokens, T = n_past + s keys, H query heads,
KV key/value heads, d head_dim, D hidden, F intermediate, E experts, k top_k.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ColibriError
from ..file import blocks
from ..file import format as cformat
from ..file.format import DENSE_KINDS, SHARED_KINDS, DType, Feat, Kind
from ..file.quant import quantize_activations_i8

F32 = np.float32


# --------------------------------------------------------------------------
# Matrix products, one per storage type. x is [N, cols], the result [N, rows].
# --------------------------------------------------------------------------

def matmul_f32(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y[n, r] = sum_c W[r, c] * x[n, c], float32 accumulation.
    w [rows, cols] float32, x [N, cols] float32 -> [N, rows] float32."""
    return np.matmul(x.astype(F32, copy=False), w.T).astype(F32, copy=False)


def matmul_i16_row(q: np.ndarray, scale: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y[n, r] = scale[r] * sum_c float(q[r, c]) * x[n, c].
    q [rows, cols] int16, scale [rows] float32, x [N, cols] -> [N, rows]."""
    acc = np.matmul(x.astype(F32, copy=False), q.astype(F32).T)      # [N, rows]
    return (scale.astype(F32)[None, :] * acc).astype(F32, copy=False)


class I8GroupMatrix:
    """An I8_GROUP weight prepared for the exact integer-dot product.

    The integer group dots are computed with a float matmul over integer
    values: each product is at most 127*127 and a group sums at most
    group_size of them, so while group_size * 127^2 < 2^24 every partial sum is
    an integer exactly representable in float32 and the dot is exact in any
    summation order (float64 beyond that). This is what int32 accumulation in
    C gives, at BLAS speed.
    """

    def __init__(self, q: np.ndarray, scale: np.ndarray, group_size: int):
        rows, cols = q.shape
        self.rows, self.cols, self.group_size = rows, cols, group_size
        self.ngroups = -(-cols // group_size)
        if scale.shape != (rows, self.ngroups):
            raise ColibriError(f"I8_GROUP scales have shape {scale.shape}, "
                               f"expected {(rows, self.ngroups)}")
        self.dot_dtype = F32 if group_size * 127 * 128 < 2 ** 24 else np.float64
        pad = self.ngroups * group_size - cols
        qp = np.pad(q.astype(self.dot_dtype), ((0, 0), (0, pad)))          # [rows, ng*G]
        # [ng, G, rows]: one [G, rows] matrix per group for a batched matmul.
        self.qg = np.ascontiguousarray(
            qp.reshape(rows, self.ngroups, group_size).transpose(1, 2, 0))
        self.scale = scale.astype(F32)                                     # [rows, ng]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x [N, cols] float32 -> y [N, rows] float32, FORMAT.md section 5."""
        n = x.shape[0]
        xq, xs = quantize_activations_i8(x.astype(F32, copy=False), self.group_size)
        # xq [N, cols] int8, xs [N, ng] float32
        pad = self.ngroups * self.group_size - self.cols
        xg = np.pad(xq.astype(self.dot_dtype), ((0, 0), (0, pad)))        # [N, ng*G]
        xg = xg.reshape(n, self.ngroups, self.group_size).transpose(1, 0, 2)  # [ng, N, G]
        dots = np.matmul(xg, self.qg).astype(F32)                          # [ng, N, rows] exact
        acc = np.zeros((n, self.rows), dtype=F32)
        for g in range(self.ngroups):  # outer sum in group order, float32
            combined = self.scale[None, :, g] * xs[:, g, None].astype(F32)  # [N, rows]
            acc += dots[g] * combined
        return acc


class Linear:
    """One weight tensor of the file with its storage-type-specific product."""

    def __init__(self, tensor, group_size: int):
        self.name = _tensor_name(tensor.kind, tensor.layer, tensor.expert)
        self.dtype = DType(tensor.dtype)
        self.rows, self.cols = tensor.rows, tensor.cols
        if self.dtype == DType.F32:
            self._w = np.ascontiguousarray(tensor.values, dtype=F32)
            self._fn = lambda x: matmul_f32(self._w, x)
        elif self.dtype == DType.I16_ROW:
            self._q, self._s = tensor.values, tensor.scales.astype(F32)
            self._fn = lambda x: matmul_i16_row(self._q, self._s, x)
        elif self.dtype == DType.I8_GROUP:
            self._fn = I8GroupMatrix(tensor.values, tensor.scales, group_size)
        elif blocks.is_block(self.dtype):
            self._blocks = tensor.values
            self._fn = lambda x: blocks.matmul(self._blocks, self.dtype, x)
        else:
            raise ColibriError(f"{self.name}: storage type {tensor.dtype} has no "
                               f"matrix product in the reference")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x [N, cols] -> [N, rows] float32."""
        return self._fn(x)


def _tensor_name(kind, layer, expert) -> str:
    name = Kind(kind).name
    if layer is not None and layer != 0xFFFF:
        name += f"[layer {layer}]"
    if expert is not None and expert != 0xFFFF:
        name += f"[expert {expert}]"
    return name


# --------------------------------------------------------------------------
# Elementwise pieces (FORMAT.md section 6).
# --------------------------------------------------------------------------

def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis, float32.
    x [..., D], w [D]."""
    x = x.astype(F32, copy=False)
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
    return (x / np.sqrt(ms + F32(eps)) * w).astype(F32, copy=False)


def rope_tables(positions: np.ndarray, head_dim: int, theta: float):
    """cos, sin [len(positions), head_dim // 2] float32 for RoPE.

    inv_freq[i] = theta ^ (-2i/d) and angle = pos * inv_freq[i] are computed in
    float32 as transformers does; cos/sin are the correctly rounded float32
    values of that float32 angle."""
    half = head_dim // 2
    exponent = np.arange(0, head_dim, 2, dtype=F32) / F32(head_dim)   # [half]
    inv_freq = (F32(1.0) / np.power(F32(theta), exponent, dtype=F32)).astype(F32)
    angle = positions.astype(F32)[:, None] * inv_freq[None, :half]    # [P, half]
    a64 = angle.astype(np.float64)
    return np.cos(a64).astype(F32), np.sin(a64).astype(F32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """rotate_half RoPE. x [b, s, heads, d]; cos/sin [s, d/2].
    out[i] = x[i] cos - x[i+d/2] sin, out[i+d/2] = x[i+d/2] cos + x[i] sin."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(F32)


def softmax(v: np.ndarray, axis: int = -1) -> np.ndarray:
    """Float32 softmax, max-subtracted."""
    v = v.astype(F32, copy=False)
    e = np.exp(v - np.max(v, axis=axis, keepdims=True))
    return (e / np.sum(e, axis=axis, keepdims=True, dtype=F32)).astype(F32)


def silu(v: np.ndarray) -> np.ndarray:
    """v / (1 + e^-v), float32 (e^-v may overflow to inf: the result is -0)."""
    with np.errstate(over="ignore"):
        return (v / (F32(1) + np.exp(-v))).astype(F32)


def top_k(p: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k over the last axis with ties broken towards the lower index.
    p [N, E] -> (indices [N, k] int64 in selection order, values [N, k]).

    k passes over all experts, each taking the first maximum (np.argmax
    returns the lowest index among equal values), as the C loop does."""
    work = p.astype(F32, copy=True)
    rows = np.arange(p.shape[0])
    idx = np.empty((p.shape[0], k), dtype=np.int64)
    for i in range(k):
        idx[:, i] = np.argmax(work, axis=-1)
        work[rows, idx[:, i]] = -np.inf
    return idx, np.take_along_axis(p, idx, axis=-1).astype(F32)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
              visible: np.ndarray, scale: float | None = None) -> np.ndarray:
    """Grouped-query attention with a visibility mask.

    q [b, s, H, d]; k, v [b, KV, T, d]; visible [b, s, T] bool.
    Returns [b, s, H, d]. Query head h uses KV head h // (H / KV). Scores
    are scaled by `scale` (the file's attn_scale; None: 1/sqrt(d)). A query
    row with no visible key gets a zero output (never NaN)."""
    b, s, n_heads, d = q.shape
    n_kv = k.shape[1]
    rep = n_heads // n_kv
    qh = q.transpose(0, 2, 1, 3).reshape(b, n_kv, rep, s, d)          # [b, KV, rep, s, d]
    scores = np.matmul(qh, k[:, :, None].transpose(0, 1, 2, 4, 3))      # [b, KV, rep, s, T]
    scores = scores * F32(1.0 / np.sqrt(d) if scale is None else scale)
    vis = visible[:, None, None]                                        # [b, 1, 1, s, T]
    masked = np.where(vis, scores, -np.inf)
    m = np.max(masked, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, F32(0))
    e = np.where(vis, np.exp(np.where(vis, scores - m, 0)), F32(0)).astype(F32)
    denom = np.sum(e, axis=-1, keepdims=True, dtype=F32)
    p = (e / np.where(denom > 0, denom, F32(1))).astype(F32)
    out = np.matmul(p, v[:, :, None])                                   # [b, KV, rep, s, d]
    return out.reshape(b, n_heads, s, d).transpose(0, 2, 1, 3).astype(F32)


def kv_quantize_i8(x: np.ndarray) -> np.ndarray:
    """Keys or values [..., d] as the 8-bit KV cache holds them, dequantised:
    per head vector (the last axis) xq = clip(rint(x * 127/amax), -127, 127),
    scale = amax/127 (FORMAT.md 5's activation rule, group d), returned as
    float32(xq) * scale. The C runtime keeps xq and scale and applies the
    scale to the finished dot product (q.k = scale * sum q[c] xq[c]; the
    value sum likewise): the same values, summed in another order."""
    d = x.shape[-1]
    xq, xs = quantize_activations_i8(x, d)                          # [..., d], [..., 1]
    return (xq.astype(F32) * xs).astype(F32)


# --------------------------------------------------------------------------
# The model.
# --------------------------------------------------------------------------

@dataclass
class Routing:
    """One layer's routing for the last forward: experts [b, s, k] int64 in
    selection order and their renormalised weights [b, s, k] float32."""
    experts: np.ndarray
    weights: np.ndarray


class Reference:
    """Numpy forward pass over a .colibri file, with its own KV cache.

    Reference(path_or_ColibriFile, kv="f32"). The cache holds up to max_batch
    sequences of max_seq_len slots, as the C runtime's does. kv="i8" stores
    each key and value head vector [head_dim] as the C runtime's 8-bit cache
    does (colibri_options.kv_dtype = COLIBRI_KV_I8): FORMAT.md 5's I8
    activation rule with group head_dim (scale = amax/127, rint, clip +-127),
    attention then reads float(q8) * scale."""

    def __init__(self, file_or_path, kv: str = "f32"):
        if kv not in ("f32", "i8"):
            raise ColibriError(f"kv={kv!r}: the KV cache is f32 or i8")
        self.kv = kv
        if isinstance(file_or_path, (str, Path)):
            file_or_path = cformat.read_file(file_or_path)
        self.file = file_or_path
        self.shape = sh = file_or_path.shape
        f = file_or_path
        gs = sh.group_size
        # What the model computes (a version 1 file: Mixtral). Read as data:
        # no family name appears in the forward pass.
        self.desc = d = f.desc
        if d.has(Feat.ENC_DEC):
            raise ColibriError("an encoder-decoder file (ENC_DEC): its reference is "
                               "colibri.model.reference_encdec.from_file")

        emb = f.tensor(Kind.EMBED)
        if DType(emb.dtype) == DType.F32:
            self._emb_values, self._emb_scales = emb.values.astype(F32), None
        elif DType(emb.dtype) == DType.I16_ROW:
            self._emb_values, self._emb_scales = emb.values, emb.scales.astype(F32)
        elif blocks.is_block(emb.dtype):   # a lookup reads the blocks' exact values
            self._emb_values = blocks.dequantize(emb.values, emb.dtype, emb.cols)
            self._emb_scales = None
        elif DType(emb.dtype) == DType.I8_GROUP:   # float(q) * its group's scale
            g = sh.group_size
            scale = np.repeat(emb.scales.astype(F32), g, axis=1)[:, :emb.cols]
            self._emb_values = (emb.values.astype(F32) * scale).astype(F32)
            self._emb_scales = None
        else:
            raise ColibriError(f"EMBED: storage type {emb.dtype} is not supported "
                               f"(F32, I16_ROW, I8_GROUP or a block type)")

        def norm(kind, layer=None):
            return f.tensor(kind, layer).values.reshape(-1).astype(F32)

        def opt(kind, flag, layer):
            return norm(kind, layer) if d.features & flag else None

        def swiglu(kinds, layer):
            return tuple(Linear(f.tensor(k, layer), gs) for k in kinds)

        qk = Feat.QK_NORM_HEAD | Feat.QK_NORM_PROJ
        self.layers = []
        for l in range(sh.n_layers):
            layer = dict(
                attn_norm=norm(Kind.ATTN_NORM, l),
                wq=Linear(f.tensor(Kind.WQ, l), gs),
                wk=Linear(f.tensor(Kind.WK, l), gs),
                wv=Linear(f.tensor(Kind.WV, l), gs),
                wo=Linear(f.tensor(Kind.WO, l), gs),
                bq=opt(Kind.BQ, Feat.BIAS_QKV, l), bk=opt(Kind.BK, Feat.BIAS_QKV, l),
                bv=opt(Kind.BV, Feat.BIAS_QKV, l), bo=opt(Kind.BO, Feat.BIAS_O, l),
                q_norm=opt(Kind.Q_NORM, qk, l), k_norm=opt(Kind.K_NORM, qk, l),
                ffn_norm=norm(Kind.FFN_NORM, l),
                dense=None, router=None, experts=[], shared=None, shared_gate=None,
            )
            if d.is_dense(l):
                layer["dense"] = swiglu(DENSE_KINDS, l)
            else:
                layer["router"] = Linear(f.tensor(Kind.ROUTER, l), gs)
                layer["experts"] = [(Linear(f.tensor(Kind.EXPERT_W1, l, e), gs),
                                     Linear(f.tensor(Kind.EXPERT_W3, l, e), gs),
                                     Linear(f.tensor(Kind.EXPERT_W2, l, e), gs))
                                    for e in range(sh.n_experts)]
                if d.has(Feat.SHARED_EXPERT):
                    layer["shared"] = swiglu(SHARED_KINDS, l)
                if d.has(Feat.SHARED_GATE):
                    layer["shared_gate"] = Linear(f.tensor(Kind.SHARED_GATE, l), gs)
            self.layers.append(layer)
        self.final_norm = norm(Kind.FINAL_NORM)
        # TIED_LM_HEAD: the embedding matrix, with its own storage type
        self.lm_head = Linear(f.tensor(Kind.EMBED if d.has(Feat.TIED_LM_HEAD)
                                       else Kind.LM_HEAD), gs)
        self._rope_cos, self._rope_sin = rope_tables(
            np.arange(sh.max_seq_len), sh.head_dim, sh.rope_theta)     # [max_seq, d/2]
        self.reset()

    # ---- cache -----------------------------------------------------------

    def reset(self) -> None:
        """Forget the KV cache and the last routing."""
        self._cache_k = self._cache_v = None  # per layer [b, KV, max_seq, d]
        self._cache_mask = None               # [b, max_seq] bool
        self._cache_len = 0
        self._routing: list[Routing] = []

    @property
    def cached_length(self) -> int:
        """Number of positions held in the KV cache."""
        return self._cache_len

    # ---- public API --------------------------------------------------------

    def linear(self, kind, x: np.ndarray, layer: int | None = None,
               expert: int | None = None) -> np.ndarray:
        """The product of one weight of the file with x [N, cols] -> [N, rows],
        as forward computes it (for tests of a single matmul)."""
        kind = Kind(kind)
        if kind == Kind.LM_HEAD:
            lin = self.lm_head
        elif kind in (Kind.EXPERT_W1, Kind.EXPERT_W3, Kind.EXPERT_W2):
            w1, w3, w2 = self.layers[layer]["experts"][expert]
            lin = {Kind.EXPERT_W1: w1, Kind.EXPERT_W3: w3, Kind.EXPERT_W2: w2}[kind]
        else:
            key = {Kind.WQ: "wq", Kind.WK: "wk", Kind.WV: "wv", Kind.WO: "wo",
                   Kind.ROUTER: "router"}.get(kind)
            if key is None:
                raise ColibriError(f"{kind.name} is not a matrix applied by linear()")
            lin = self.layers[layer][key]
        return lin(np.asarray(x, dtype=F32))

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """tokens int [...] -> [..., D] float32 (I16_ROW: float(q) * scale)."""
        if self._emb_scales is None:
            return self._emb_values[tokens]
        return (self._emb_values[tokens].astype(F32)
                * self._emb_scales[tokens][..., None]).astype(F32)

    def forward(self, tokens, mask=None, n_past: int = 0) -> np.ndarray:
        """Logits [b, s, vocab] float32 for tokens [b, s] (a 1-D sequence is
        batch 1: the result is then still [1, s, vocab]).

        mask [b, s] of 0/1 (0 = padding), None = all 1. n_past = 0 starts
        fresh; 0 < n_past <= cached_length continues after the first n_past
        cached positions (rewinding drops the rest), with the same batch size.
        Each position's RoPE position is n_past + t."""
        tokens, mask = self._check_inputs(tokens, mask, n_past)
        b, s = tokens.shape
        sh = self.shape
        if n_past == 0:
            kv_shape = (b, sh.n_kv_heads, sh.max_seq_len, sh.head_dim)
            self._cache_k = [np.zeros(kv_shape, F32) for _ in range(sh.n_layers)]
            self._cache_v = [np.zeros(kv_shape, F32) for _ in range(sh.n_layers)]
            self._cache_mask = np.zeros((b, sh.max_seq_len), dtype=bool)
        total = n_past + s
        self._cache_mask[:, n_past:total] = mask
        self._cache_mask[:, total:] = False
        self._cache_len = total

        # visible[b, t, j]: key j is not later than query n_past+t and not padding.
        q_pos = n_past + np.arange(s)                                    # [s]
        causal = np.arange(total)[None, :] <= q_pos[:, None]             # [s, T]
        visible = causal[None] & self._cache_mask[:, None, :total]       # [b, s, T]
        cos = self._rope_cos[n_past:total]
        sin = self._rope_sin[n_past:total]                               # [s, d/2]

        d = self.desc
        x = self.embed(tokens)                                           # [b, s, D]
        if d.embed_scale != 1.0:
            x = (x * F32(d.embed_scale)).astype(F32)
        res = F32(d.residual_scale)  # 1.0: x + y * 1 is x + y exactly
        self._routing = []
        for l, layer in enumerate(self.layers):
            h = x + self._attention_block(l, layer, x, visible, cos, sin, n_past) * res
            if layer["dense"] is not None:
                w1, w3, w2 = layer["dense"]
                hn = rmsnorm(h, layer["ffn_norm"], sh.rms_eps).reshape(b * s, -1)
                x = h + w2(silu(w1(hn)) * w3(hn)).reshape(b, s, -1) * res
            else:
                x = h + self._moe_block(layer, h) * res
        xn = rmsnorm(x, self.final_norm, sh.rms_eps)                     # [b, s, D]
        logits = self.lm_head(xn.reshape(b * s, -1)).reshape(b, s, -1)   # [b, s, vocab]
        if d.logits_divisor != 1.0:
            logits = (logits / F32(d.logits_divisor)).astype(F32)
        return logits

    def generate(self, prompt_tokens, n_new: int):
        """Greedy generation from one or more equal-length prompts.

        prompt_tokens [s] or [b, s]. Returns (tokens, rows): tokens [n_new]
        (or [b, n_new]) generated ids, rows [s + max(n_new - 1, 0), vocab]
        (or [b, ...]) the logits of every position fed to the model: row i is
        the distribution that chose token i + 1 of prompt + generated (the
        last generated token is not fed back). The argmax takes the lowest id
        among equal logits."""
        prompt = np.asarray(prompt_tokens)
        single = prompt.ndim == 1
        prompt = np.atleast_2d(prompt)
        if int(n_new) < 0:
            raise ColibriError(f"generate: n_new must be >= 0, got {n_new}")
        n_new = int(n_new)
        b, s = prompt.shape
        if n_new and s + n_new - 1 > self.shape.max_seq_len:
            raise ColibriError(
                f"generate: prompt length {s} + {n_new} new tokens needs "
                f"{s + n_new - 1} positions, above max_seq_len {self.shape.max_seq_len}")
        rows = [self.forward(prompt)]                                    # [b, s, V]
        out = np.empty((b, n_new), dtype=np.int64)
        for i in range(n_new):
            nxt = np.argmax(rows[-1][:, -1, :], axis=-1)                 # [b]
            out[:, i] = nxt
            if i + 1 < n_new:
                rows.append(self.forward(nxt[:, None], n_past=s + i))
        logits = np.concatenate(rows, axis=1)                            # [b, s+n_new-1, V]
        return (out[0], logits[0]) if single else (out, logits)

    def router_choices(self) -> list[np.ndarray]:
        """Per layer, the experts [b, s, top_k] (selection order) chosen in
        the last forward."""
        return [r.experts for r in self._routing]

    def routing(self) -> list[Routing]:
        """Per layer, experts and weights of the last forward."""
        return list(self._routing)

    # ---- blocks ------------------------------------------------------------

    def _attention_block(self, l, layer, x, visible, cos, sin, n_past):
        """x [b, s, D] -> WO . attn(rmsnorm(x)) [b, s, D]; fills the cache."""
        sh = self.shape
        b, s, _ = x.shape
        d = sh.head_dim
        desc = self.desc
        xn = rmsnorm(x, layer["attn_norm"], sh.rms_eps).reshape(b * s, -1)
        q, k, v = layer["wq"](xn), layer["wk"](xn), layer["wv"](xn)     # [N, qdim|kvdim]
        if layer["bq"] is not None:
            q, k, v = q + layer["bq"], k + layer["bk"], v + layer["bv"]
        q = q.reshape(b, s, sh.n_heads, d)
        k = k.reshape(b, s, sh.n_kv_heads, d)
        v = v.reshape(b, s, sh.n_kv_heads, d)
        if layer["q_norm"] is not None:
            if desc.has(Feat.QK_NORM_HEAD):   # each head of head_dim
                q = rmsnorm(q, layer["q_norm"], sh.rms_eps)
                k = rmsnorm(k, layer["k_norm"], sh.rms_eps)
            else:                             # the whole projection
                q = rmsnorm(q.reshape(b, s, -1), layer["q_norm"], sh.rms_eps).reshape(q.shape)
                k = rmsnorm(k.reshape(b, s, -1), layer["k_norm"], sh.rms_eps).reshape(k.shape)
        if desc.has(Feat.CLIP_QKV):
            c = F32(desc.clip_qkv)
            q, k, v = np.clip(q, -c, c), np.clip(k, -c, c), np.clip(v, -c, c)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv == "i8":
            k, v = kv_quantize_i8(k), kv_quantize_i8(v)
        total = n_past + s
        self._cache_k[l][:, :, n_past:total] = k.transpose(0, 2, 1, 3)   # [b, KV, s, d]
        self._cache_v[l][:, :, n_past:total] = v.transpose(0, 2, 1, 3)
        att = attention(q, self._cache_k[l][:, :, :total],
                        self._cache_v[l][:, :, :total], visible, desc.attn_scale)  # [b, s, H, d]
        o = layer["wo"](att.reshape(b * s, -1))
        if layer["bo"] is not None:
            o = o + layer["bo"]
        return o.reshape(b, s, -1)

    def _moe_block(self, layer, h):
        """h [b, s, D] -> moe(rmsnorm(h)) [b, s, D]; records the routing."""
        sh = self.shape
        b, s, dim = h.shape
        xn = rmsnorm(h, layer["ffn_norm"], sh.rms_eps).reshape(b * s, dim)  # [N, D]
        p = softmax(layer["router"](xn))                                    # [N, E]
        idx, top = top_k(p, sh.top_k)                                       # [N, k]
        if self.desc.has(Feat.ROUTER_RENORM):
            total = top[:, 0].copy()
            for i in range(1, sh.top_k):  # sum in selection order, float32
                total += top[:, i]
            weights = (top / total[:, None]).astype(F32)                    # [N, k]
        else:  # the softmax probabilities as they are (Qwen2-MoE, OLMoE)
            weights = top.astype(F32)
        self._routing.append(Routing(idx.reshape(b, s, -1), weights.reshape(b, s, -1)))

        # y[n, i] = expert idx[n, i] applied to token n.
        y = np.zeros((b * s, sh.top_k, dim), dtype=F32)                     # [N, k, D]
        for e, (w1, w3, w2) in enumerate(layer["experts"]):
            tok, slot = np.nonzero(idx == e)
            if tok.size == 0:
                continue
            xe = xn[tok]                                                    # [n_e, D]
            y[tok, slot] = w2(silu(w1(xe)) * w3(xe))                        # [n_e, D]
        out = y[:, 0] * weights[:, 0, None]
        for i in range(1, sh.top_k):  # out = sum_i w_i * expert_i, in order
            out = out + y[:, i] * weights[:, i, None]
        if layer["shared"] is not None:  # every token, [* sigmoid(gate . x)]
            w1, w3, w2 = layer["shared"]
            ys = w2(silu(w1(xn)) * w3(xn))                                  # [N, D]
            if layer["shared_gate"] is not None:
                g = layer["shared_gate"](xn)                                # [N, 1]
                with np.errstate(over="ignore"):
                    ys = (F32(1) / (F32(1) + np.exp(-g))).astype(F32) * ys
            out = out + ys
        return out.reshape(b, s, dim).astype(F32)

    # ---- validation --------------------------------------------------------

    def _check_inputs(self, tokens, mask, n_past):
        sh = self.shape
        tokens = np.asarray(tokens)
        if tokens.ndim == 1:
            tokens = tokens[None, :]
        if tokens.ndim != 2:
            raise ColibriError(f"tokens must be [batch, seq], got shape {tokens.shape}")
        if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
            raise ColibriError(f"tokens must be integers, got dtype {tokens.dtype}")
        tokens = tokens.astype(np.int64)
        b, s = tokens.shape
        if b < 1 or s < 1:
            raise ColibriError(f"tokens shape {tokens.shape}: batch and seq must be >= 1")
        if b > sh.max_batch:
            raise ColibriError(f"batch {b} is above the model's max_batch {sh.max_batch}: "
                               "fewer sequences, or re-convert with a larger --max-batch")
        bad = (tokens < 0) | (tokens >= sh.vocab)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise ColibriError(f"token id {tokens[i, j]} at [{i}, {j}] is outside "
                               f"the vocabulary [0, {sh.vocab}): use token ids below the "
                               "model's vocab")
        if isinstance(n_past, bool) or int(n_past) != n_past or n_past < 0:
            raise ColibriError(f"n_past must be a non-negative integer, got {n_past!r}")
        n_past = int(n_past)
        if n_past + s > sh.max_seq_len:
            raise ColibriError(f"n_past {n_past} + seq {s} = {n_past + s} is above "
                               f"the model's max_seq_len {sh.max_seq_len}: shorten the "
                               "input, or re-convert with a larger --max-seq-len")
        if n_past > 0:
            if n_past > self._cache_len:
                raise ColibriError(f"n_past {n_past} is beyond the {self._cache_len} "
                                   f"cached positions")
            cached_b = self._cache_mask.shape[0]
            if b != cached_b:
                raise ColibriError(f"batch {b} differs from the cached batch {cached_b}; "
                                   f"start again with n_past=0")
        if mask is None:
            mask = np.ones((b, s), dtype=bool)
        else:
            mask = np.asarray(mask)
            if mask.ndim == 1 and b == 1:
                mask = mask[None, :]
            if mask.shape != (b, s):
                raise ColibriError(f"mask shape {mask.shape} differs from tokens shape {(b, s)}")
            if not np.isin(mask, (0, 1)).all():
                raise ColibriError("mask entries must be 0 (padding) or 1")
            mask = mask.astype(bool)
        return tokens, mask
