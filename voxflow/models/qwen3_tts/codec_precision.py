"""Which precision the codec decoder runs in: `codec_dtype="auto"` picks fp16 on a GPU when this checkpoint's
decoder, checked at load, stays within AUTO_MIN_SNR_DB of its own fp32 decode; fp32 otherwise.

Why fp16: the waveform stack's convolutions run on fp16 tensor cores at bf16's speed (H200, 16 streams x 25 frames:
10.4 ms a codec call against 18.0 in fp32 with TF32, 12.6 in bf16), and fp16 keeps 10 mantissa bits to bf16's 7:
the streamed fp16 decode is 45.5 dB from the fp32 one pass (real-size random weights), TF32's class (46.3), where
bf16 is 28 dB (benchmarks/results/h200/2026-12-02-session15/call3).

Why a check: fp16's range ends at 65504. vLLM-Omni shipped a codec whose half-precision decode produced NaN
(all-silence audio, their PR #1664), and a real checkpoint's SnakeBeta terms (e^alpha, 1 / e^beta) or activations
could leave that range where the random-weight tests never go. So before choosing fp16 the loader decodes
CHECK_FRAMES seeded random frames in one pass with the fp32 decoder and with an fp16 copy: every sample must be
finite and the SNR at least AUTO_MIN_SNR_DB, else the codec stays fp32 (and says why). An explicit
codec_dtype="float16" runs the same check and logs a warning when it fails, but keeps fp16.
"""
from __future__ import annotations

import copy
import logging
import math

import torch

log = logging.getLogger("voxflow.codec")

CODEC_DTYPES = ("auto", "float32", "bfloat16", "float16")
# fp16 lands at ~45 dB (GPU and CPU, real-size random weights); TF32's own test threshold is 35 dB. A decode that
# overflowed, or that lost fp16's extra bits somewhere, falls far below.
AUTO_MIN_SNR_DB = 35.0
CHECK_FRAMES = 25
CHECK_SEED = 0


def half_precision_check(decoder, dtype: torch.dtype, frames: int = CHECK_FRAMES, seed: int = CHECK_SEED) -> dict:
    """One-pass decode of `frames` seeded random frames by `decoder` (fp32) and by a `dtype` copy of it:
    {"dtype", "frames", "finite", "snr_db"} (snr_db None when the copy's output is not finite, inf when equal).
    Plain fp32 reference: TF32 off for the check (restored after)."""
    cfg = decoder.config
    device = next(decoder.parameters()).device
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, frames),
                          generator=torch.Generator().manual_seed(seed)).to(device)
    low = copy.deepcopy(decoder)
    for p in low.parameters():
        p.data = p.data.to(dtype)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            ref = decoder(codes).double()
            got = low(codes).double()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
        del low
    finite = bool(torch.isfinite(got).all())
    snr = None
    if finite:
        err = float(((ref - got) ** 2).sum())
        snr = math.inf if err == 0.0 else 10.0 * math.log10(float((ref ** 2).sum()) / err)
    return {"dtype": str(dtype).removeprefix("torch."), "frames": frames, "finite": finite,
            "snr_db": None if snr is None else (snr if math.isinf(snr) else round(snr, 2))}


def resolve_codec_dtype(requested: str, decoder, gpu: bool | None = None) -> tuple[str, dict]:
    """(dtype name the decoder should run in, a report for the engine's startup record). `decoder`: fp32, on its
    device. "auto": float16 on a GPU when half_precision_check passes, else float32; on a CPU float32 (no fast
    half-precision convolutions there). gpu: whether it runs on a GPU (None: its parameters' device says)."""
    if requested not in CODEC_DTYPES:
        raise ValueError(f"codec_dtype must be one of {', '.join(CODEC_DTYPES)}, got {requested!r}")
    on_gpu = next(decoder.parameters()).device.type == "cuda" if gpu is None else gpu
    if requested == "auto" and not on_gpu:
        return "float32", {"requested": "auto", "dtype": "float32", "why": "no GPU"}
    if requested not in ("auto", "float16"):
        return requested, {"requested": requested, "dtype": requested}
    check = half_precision_check(decoder, torch.float16)
    passed = check["finite"] and check["snr_db"] >= AUTO_MIN_SNR_DB
    report = {"requested": requested, "check": check, "min_snr_db": AUTO_MIN_SNR_DB}
    if requested == "float16":
        if not passed:
            log.warning("codec_dtype=float16 asked for, but this decoder's fp16 check failed (%s; needs finite "
                        "audio and >= %.0f dB against fp32): expect degraded audio", check, AUTO_MIN_SNR_DB)
        return "float16", {**report, "dtype": "float16"}
    if not passed:
        log.warning("codec in fp32: its fp16 check failed (%s; needs finite audio and >= %.0f dB against fp32)",
                    check, AUTO_MIN_SNR_DB)
        return "float32", {**report, "dtype": "float32", "why": "fp16 check failed"}
    return "float16", {**report, "dtype": "float16"}
