"""Golden logits from the numpy reference (colibri/model/reference.py, never the
C code) and the comparison of a target's logits with them.

Tolerances, per quantisation of the model file (docs/FORMAT.md 5 and
DESIGN.md 7), as a bound on |target - reference| relative to the row's
largest reference magnitude (at least 1):
  f32   1e-4  float32 sums in a different order (BLAS vs the C loops)
  int8  1e-3  as f32, plus activation quantisation flips at rounding ties
  q4    3e-2  a block type in the file: one flip there moves a whole
              position (TOLERANCE below says why)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..file import blocks
from ..file import format as cformat
from ..model.reference import Reference

# Worst logit error relative to the row scale. "q4" (a file holding block
# types): the block products are exact integer sums in both C and numpy, but
# their activations are rounded to int8 over 256 columns, and an activation
# that numpy computes exactly on a rounding tie (x.5) may land 1 ulp off it
# in C (attention and norms differ by an ulp from BLAS's sums): one flipped
# rounding moves every later logit of that position by up to ~1.5e-2 (seen on
# the golden k256 model; tests/test_runtime_golden.py allows 3e-2 per row for
# the same reason). The other positions stay within 1e-6.
TOLERANCE = {"f32": 1e-4, "int8": 1e-3, "q4": 3e-2}


def quantisation(model) -> str:
    """"f32" if every tensor of the file is float32, "q4" if any is a 4- to
    6-bit block type (Q4_0, Q5_0, Q4_K, Q5_K, Q6_K), else "int8" (Q8_0 too:
    its product is I8_GROUP's with groups of 32, an fp16 scale)."""
    f = cformat.read_file(model)
    try:
        dtypes = {e.dtype for e in f.entries if e.kind in cformat.Kind._value2member_map_}
        if all(d == cformat.DType.F32 for d in dtypes):
            return "f32"
        return "q4" if any(blocks.is_block(d) and d != blocks.Q8_0 for d in dtypes) else "int8"
    finally:
        f.close()


def decoder_prompt(model, prompt) -> list[int]:
    """The tokens the decoder is prefilled with: the prompt itself, or for an
    encoder-decoder (the prompt is the encoder's input) its start token."""
    from ..file import format as cformat
    cf = cformat.read_file(model, check_crc=False) if not hasattr(model, "desc") else model
    if cf.desc.has(cformat.Feat.ENC_DEC):
        return [cf.desc.decoder_start]
    return list(prompt)


def reference_rows(model, prompt, fed_tokens, kv: str = "f32") -> np.ndarray:
    """Reference logits [len(prompt) + len(fed_tokens), vocab] for a prefill
    of `prompt` followed by one decode step per token of `fed_tokens`
    (teacher-forced with the tokens the target chose, so one argmax near a
    tie cannot derail the rest of the comparison). An encoder-decoder
    encodes `prompt` and prefills the decoder with its start token: [1 +
    len(fed_tokens), vocab]. kv: the KV cache the target ran with ("i8":
    the reference quantises its cache as the C runtime does)."""
    from ..file import format as cformat
    cf = cformat.read_file(model)
    if cf.desc.has(cformat.Feat.ENC_DEC):
        from ..model.reference_encdec import from_file
        ed = from_file(cf, kv=kv)
        ed.encode(np.asarray([prompt], dtype=np.int64))
        rows = [ed.decode([[cf.desc.decoder_start]])[0]]
        rows += [ed.decode([[tok]])[0] for tok in fed_tokens]
        return np.concatenate(rows, axis=0).astype(np.float32)
    ref = Reference(cf, kv=kv)
    rows = [ref.forward(np.asarray([prompt], dtype=np.int64))[0]]
    for i, tok in enumerate(fed_tokens):
        rows.append(ref.forward(np.asarray([[tok]], dtype=np.int64), n_past=len(prompt) + i)[0])
    return np.concatenate(rows, axis=0).astype(np.float32)


@dataclass
class Comparison:
    ok: bool
    worst_position: int
    worst_token: int
    got: float
    want: float
    error: float          # relative to the row scale
    tolerance: float
    message: str


def compare(got: np.ndarray, want: np.ndarray, tolerance: float, what: str,
            prompt_len: int) -> Comparison:
    """Compare [positions, vocab] logits; the message names `what` (target,
    prompt), the worst position (prefill or decode) and the error."""
    if got.shape != want.shape:
        return Comparison(False, -1, -1, 0.0, 0.0, float("inf"), tolerance,
                          f"{what}: logits shape {got.shape}, reference {want.shape}")
    if not np.all(np.isfinite(got)):
        pos, tok = np.argwhere(~np.isfinite(got))[0]
        return Comparison(False, int(pos), int(tok), float(got[pos, tok]), float(want[pos, tok]),
                          float("inf"), tolerance,
                          f"{what}: non-finite logit {got[pos, tok]} at position {pos} token {tok}")
    scale = np.maximum(1.0, np.max(np.abs(want), axis=1, keepdims=True))
    rel = np.abs(got.astype(np.float64) - want) / scale
    pos, tok = np.unravel_index(int(np.argmax(rel)), rel.shape)
    err = float(rel[pos, tok])
    phase = "prefill" if pos < prompt_len else f"decode step {pos - prompt_len + 1}"
    msg = (f"{what}: worst position {pos} ({phase}), token {tok}: target {got[pos, tok]:.7g}"
           f" vs reference {want[pos, tok]:.7g}, relative error {err:.2e} "
           f"{'<=' if err <= tolerance else '>'} tolerance {tolerance:.0e}")
    return Comparison(err <= tolerance, int(pos), int(tok), float(got[pos, tok]),
                      float(want[pos, tok]), err, tolerance, msg)


def check_greedy(tokens, rows: np.ndarray, want: np.ndarray, prompt_len: int,
                 tolerance: float, what: str) -> str | None:
    """The target's greedy token i must be the reference argmax of the row
    that chose it, unless the reference's top two are within the tolerance
    (a tie the arithmetic may break either way). Returns a message or None."""
    for i, tok in enumerate(tokens):
        r = want[prompt_len - 1 + i]
        best = int(np.argmax(r))
        if tok != best:
            gap = (float(r[best]) - float(r[tok])) / max(1.0, float(np.max(np.abs(r))))
            if gap > tolerance:
                return (f"{what}: greedy token {i} is {tok}, the reference chooses {best} "
                        f"(logit gap {gap:.2e} > tolerance {tolerance:.0e})")
    return None


def check_sampled(tokens, rows: np.ndarray, want: np.ndarray, prompt: list[int], params,
                  tolerance: float, what: str, n_text: int | None = None) -> str | None:
    """The target's sampled tokens against the numpy reference sampler
    (colibri/text/sampling.py) for the same seed, step by step (step g draws
    counter g; the history is the prompt plus the tokens before).

    Two questions, so a near-tie cannot make the check flaky while a wrong
    sampler or wrong logits still fail it:
    1. the C sampler: the reference sampler given the TARGET's own logits
       must choose exactly the target's token (both compute the same double
       arithmetic; they may differ only when the draw sits within ~1e-12 of
       a bucket boundary, the margin reported by sampling.sample);
    2. the logits: the reference sampler given the REFERENCE logits must
       choose the same token, unless its decision margin is below what the
       logits' tolerance can move: a relative logit error e changes a
       probability by a factor exp(e * scale / T), so a decision whose
       margin (relative to the total mass) is under 4 * e * scale / T may
       go either way. Returns a message or None."""
    from ..text.sampling import sample
    history = list(prompt)
    for g, tok in enumerate(tokens):
        i = len(prompt) - 1 + g
        got_row = np.array(rows[i], dtype=np.float32)
        ref_row = np.array(want[i], dtype=np.float32)
        if n_text is not None:
            got_row[n_text:] = -np.inf
            ref_row[n_text:] = -np.inf
        mine, m_mine = sample(got_row, params, history, g, margin=True)
        if mine != tok and m_mine > 1e-9:
            return (f"{what}: token {g} is {tok}, but the reference sampler given the "
                    f"target's own logits chooses {mine} (margin {m_mine:.1e}): the C "
                    "sampler and colibri/text/sampling.py disagree")
        theirs, m_ref = sample(ref_row, params, history, g, margin=True)
        if theirs != tok:
            scale = max(1.0, float(np.max(np.abs(want[i][np.isfinite(want[i])]))))
            temp = params.temperature if not params.greedy else 1.0
            allowed = 4.0 * tolerance * scale / max(temp, 1e-6)
            if m_ref > allowed:
                return (f"{what}: token {g} is {tok}, the reference chooses {theirs} with "
                        f"margin {m_ref:.2e} > {allowed:.1e} (what the logit tolerance "
                        f"{tolerance:.0e} can move)")
        history.append(tok)
    return None
