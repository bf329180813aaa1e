"""colibri-cli under the target's emulator on the firmware's fixed prompts:
its logits (--logits-out, little-endian float32 rows) against the numpy
reference, and against the firmware's rows from the same library (the two
programs must agree bit for bit)."""
from __future__ import annotations

import os
import tempfile

import numpy as np

from . import blob, emulate, golden


def run_cli(target, cli, model, prompt, n_generate, kv: str = "f32"):
    """Returns (rows [positions, vocab] float32, generated tokens, RunResult)
    of colibri-cli with the KV cache `kv` (--kv f32|i8)."""
    fd, out = tempfile.mkstemp(suffix=".logits")
    os.close(fd)
    try:
        dec = golden.decoder_prompt(model, prompt)
        enc = () if list(dec) == list(prompt) else (
            "--encoder-tokens", ",".join(map(str, prompt)))
        args = ("--model", str(model), *enc, "--tokens", ",".join(map(str, dec)),
                "--generate", str(n_generate), "--logits-out", out, "--kv", kv)
        r = emulate.run(target, cli, args)
        rows = np.fromfile(out, dtype="<f4").astype(np.float32)
    finally:
        os.unlink(out)
    tokens = []
    for line in r.stdout.splitlines():
        if line.startswith("generated:"):
            tokens = [int(t) for t in line.split(":", 1)[1].split()]
    return rows, tokens, r


def check_cli(target, cli, model, result, prompts=blob.DEFAULT_PROMPTS,
              n_generate=blob.DEFAULT_GENERATE, kv: str = "f32") -> None:
    """Append failures to `result` (a check.CheckResult). `model` must be in
    the target's byte order when the CLI cannot swap (static work buffer).
    kv: the firmware's KV cache, which colibri-cli then uses too (so the two
    stay bit-identical) and the reference quantises likewise."""
    tol = golden.TOLERANCE[result.quant]
    fw_prompts = result.firmware.prompts if result.firmware else []
    for i, prompt in enumerate(prompts):
        what = f"target {target.name}, colibri-cli, prompt {i} {list(prompt)}"
        rows, tokens, r = run_cli(target, cli, model, prompt, n_generate, kv)
        result.seconds_cli = getattr(result, "seconds_cli", 0.0) + r.seconds
        if r.returncode != 0:
            tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
            result.failures.append(f"{what}: exit status {r.returncode}: {' / '.join(tail)}")
            continue
        if len(tokens) != n_generate:
            result.failures.append(f"{what}: printed {len(tokens)} generated tokens, "
                                   f"expected {n_generate}")
            continue
        want = golden.reference_rows(model, list(prompt), tokens[:-1], kv)
        if rows.size != want.size:
            result.failures.append(f"{what}: --logits-out holds {rows.size} values, "
                                   f"expected {want.shape}")
            continue
        rows = rows.reshape(want.shape)
        n_pre = len(golden.decoder_prompt(model, prompt))
        cmp = golden.compare(rows, want, tol, what, n_pre)
        result.worst.append(cmp.message)
        if not cmp.ok:
            result.failures.append(cmp.message)
        bad = golden.check_greedy(tokens, rows, want, n_pre, tol, what)
        if bad:
            result.failures.append(bad)
        if i < len(fw_prompts) and fw_prompts[i].rows.shape == rows.shape:
            if not np.array_equal(fw_prompts[i].rows.view(np.uint32), rows.view(np.uint32)):
                result.failures.append(f"{what}: logits differ from the firmware's on the "
                                       "same target (same library, must be bit-identical)")
