"""The codec decoder's SnakeBeta activation, x + sin^2(x * a) / b per channel, in one Triton kernel.

The torch expression (`models/qwen3_tts/codec_decoder_blocks.SnakeBeta`) runs five full-size element-wise kernels
(x * a, sin, pow 2, the scale, the residual add), each reading and writing the whole activation: in the codec's
upsampling stack (up to 1536 channels at 24 kHz / 2^k) that traffic was a large share of the codec's GPU time
(H200 profile, 2026-11-29: sin / pow / mul / add kernels of 45-290 us each). Here one pass reads x once and writes
y once. The per-channel a = exp(alpha) and 1 / (exp(beta) + 1e-9) are computed by the caller with the reference's
own torch ops ([C] values, bit-identical).

Numerics: the reference's rounding points in the activation dtype (t = x * a, sin t, its square, the scaled
square, the sum: each rounded as torch stores it), fp32 arithmetic in between, no FMA contraction. On CUDA sin is
libdevice's sinf, as torch's kernel uses, so the result equals torch's bit for bit; under the CPU interpreter sin
is numpy's (tests allow a few ulp).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from voxflow.kernels.rms_norm import round_to

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BLOCK = 1024


@triton.jit
def _snake_beta_kernel(x_ptr, a_ptr, inv_ptr, out_ptr, C, T, stride_b, stride_c, PRECISE: tl.constexpr,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0)                     # (batch, channel) pair
    b, c = row // C, row % C
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < T
    dtype = x_ptr.dtype.element_ty
    base = b.to(tl.int64) * stride_b + c.to(tl.int64) * stride_c
    x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + c).to(tl.float32)
    inv = tl.load(inv_ptr + c).to(tl.float32)
    t = round_to(x * a, dtype)
    if PRECISE:
        s = libdevice.sin(t)                   # sinf, as torch's CUDA kernel
    else:
        s = tl.sin(t)                          # the interpreter has no libdevice
    s = round_to(s, dtype)
    s2 = round_to(s * s, dtype)
    y = round_to(x + round_to(inv * s2, dtype), dtype)
    out_base = row.to(tl.int64) * T
    tl.store(out_ptr + out_base + offs, y.to(dtype), mask=mask)


def supported(x: torch.Tensor, a: torch.Tensor, inv: torch.Tensor) -> bool:
    """x [B, C, T] with a unit last stride, a / inv [C] in x's dtype, one device, no autograd graph to record."""
    if x.dim() != 3 or x.stride(-1) != 1 or x.dtype not in _DTYPES:
        return False
    if a.shape != (x.shape[1],) or inv.shape != a.shape or a.dtype != x.dtype or inv.dtype != x.dtype:
        return False
    if a.device != x.device or inv.device != x.device:
        return False
    return not (torch.is_grad_enabled() and x.requires_grad)


def snake_beta(x: torch.Tensor, a: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """x + inv * sin(x * a)^2 per channel (a, inv [C] broadcast over B and T); a new contiguous tensor."""
    bsz, c, t = x.shape
    out = torch.empty((bsz, c, t), dtype=x.dtype, device=x.device)
    if out.numel():
        a, inv = a.contiguous(), inv.contiguous()
        _snake_beta_kernel[(bsz * c, triton.cdiv(t, _BLOCK))](
            x, a, inv, out, c, t, x.stride(0), x.stride(1), PRECISE=x.is_cuda, BLOCK=_BLOCK, num_warps=4,
            enable_fp_fusion=False)            # the scaled square and the sum stay two rounded operations
    return out
