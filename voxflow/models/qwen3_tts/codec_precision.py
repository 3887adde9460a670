"""Which precision the codec decoder runs in: `codec_dtype="auto"` picks fp16 on a GPU when this checkpoint's
decoder, checked at load, stays within AUTO_MIN_SNR_DB of its own fp32 decode; fp32 otherwise.

Why fp16: the waveform stack's convolutions run on fp16 tensor cores at bf16's speed (H200, 16 streams x 25 frames:
9.9 ms a codec call against 18.0 in fp32 with TF32, 12.6 in bf16), and fp16 keeps 10 mantissa bits to bf16's 7:
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
import time

import numpy as np
import torch

from voxflow.kernels import kernels_off
from voxflow.layers.cast import cast_parameters
from voxflow.layers.derived_weights import drop_derived_weights

log = logging.getLogger("voxflow.codec")

CODEC_DTYPES = ("auto", "float32", "bfloat16", "float16")
# fp16 lands at ~45 dB (GPU and CPU, real-size random weights); TF32's own test threshold is 35 dB. A decode that
# overflowed, or that lost fp16's extra bits somewhere, falls far below.
AUTO_MIN_SNR_DB = 35.0
CHECK_FRAMES = 25
CHECK_SEED = 0


def cast_decoder(decoder, dtype: torch.dtype):
    """A copy with its parameters in `dtype` (buffers such as the RoPE frequencies stay fp32, as model._build)."""
    out = copy.deepcopy(decoder)
    cast_parameters(out, dtype)
    return out


def snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    """10 log10(signal / error energy), in float64; +inf when x == ref."""
    ref, x = ref.astype(np.float64), x.astype(np.float64)
    err = float(np.sum((ref - x) ** 2))
    return math.inf if err == 0.0 else 10.0 * math.log10(float(np.sum(ref ** 2)) / err)


def half_precision_check(decoder, dtype: torch.dtype, frames: int = CHECK_FRAMES, seed: int = CHECK_SEED) -> dict:
    """One-pass decode of `frames` seeded random frames by `decoder` (fp32) and by a `dtype` copy of it:
    {"dtype", "frames", "finite", "identical", "snr_db"} (snr_db None when the copy's output is not finite or is
    identical: JSON has no infinity; "reference": "plain", or "kernels" where the plain pass failed and the
    kernels' fp32 decode stood in). The reference is the plain fp32 one: TF32 off for the check (restored after)
    and the Triton kernels off for its pass (plain PyTorch), so the copy's kernels are held against it too. Why
    not the kernels in fp32: a fresh machine compiles every kernel at its first use, and the fp32 variants of the
    codec's kernels served nothing else once fp16 was chosen (session 63's first server on a fresh H100 spent 80.8 s
    in this check, against 1.6-2.2 s with Triton's cache warm)."""
    cfg = decoder.config
    device = next(decoder.parameters()).device
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.num_quantizers, frames),
                          generator=torch.Generator().manual_seed(seed)).to(device)
    low = cast_decoder(decoder, dtype)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            try:
                with kernels_off():
                    ref = decoder(codes).float().cpu().numpy()
                reference = "plain"
            except Exception as e:  # noqa: BLE001 - the kernels' fp32 decode, as before, rather than no check
                log.warning("codec check: its plain fp32 reference failed (%s: %s); the kernels' fp32 decode "
                            "instead", type(e).__name__, e)
                ref = decoder(codes).float().cpu().numpy()
                reference = "kernels"
            got = low(codes).float().cpu().numpy()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
        del low
        # Weights derived for the kernels (packed convolution weights) left on the decoder's modules are dead:
        # the decoder is about to be cast. Free them, and the copy's memory, before the engine sizes its KV pool
        # from the free memory.
        drop_derived_weights(decoder)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    finite = bool(np.isfinite(got).all())
    if not np.isfinite(ref).all():                  # the fp32 decode itself is broken: nothing to measure against
        raise ValueError("the codec decoder's fp32 decode of random codes is not finite: a broken checkpoint?")
    snr = snr_db(ref, got) if finite else math.nan
    identical = snr == math.inf
    snr = None if not finite or identical else round(snr, 2)
    return {"dtype": str(dtype).removeprefix("torch."), "frames": frames, "finite": finite, "identical": identical,
            "snr_db": snr, "reference": reference}


def _passes(check: dict) -> bool:
    return check["finite"] and (check["identical"] or check["snr_db"] >= AUTO_MIN_SNR_DB)


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
    started = time.perf_counter()
    try:
        check = half_precision_check(decoder, torch.float16)
        check["seconds"] = round(time.perf_counter() - started, 3)     # startup time the check took
    except Exception as e:  # noqa: BLE001 - e.g. out of memory, or a kernel this GPU cannot compile in fp16
        if requested == "float16":
            raise
        log.warning("codec in fp32: its fp16 check could not run (%s: %s)", type(e).__name__, e)
        return "float32", {"requested": "auto", "dtype": "float32", "why": f"fp16 check error: {type(e).__name__}"}
    passed = _passes(check)
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
