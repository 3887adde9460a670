"""The codec decoder's SnakeBeta activation, x + sin^2(x * a) / b per channel, in one Triton kernel.

The torch expression (`models/qwen3_tts/codec_decoder_blocks.SnakeBeta`) runs five full-size element-wise kernels
(x * a, sin, pow 2, the scale, the residual add), each reading and writing the whole activation: in the codec's
upsampling stack (up to 1536 channels at 24 kHz / 2^k) that traffic was a large share of the codec's GPU time
(H200 profile, 2026-11-29: sin / pow / mul / add kernels of 45-290 us each). Here one pass reads x once and writes
y once. The per-channel a = exp(alpha) and 1 / (exp(beta) + 1e-9) are computed by the caller with the reference's
own torch ops ([C] values, bit-identical). The preceding convolution's bias can be added in the same pass
(`bias=`), and `bias_residual` adds a residual unit's last bias and its input in one pass: PyTorch adds a
convolution's bias as a separate broadcast pass (non-vectorised: 56 calls and 14 ms of a 111 ms 64 x 25-frame codec
call on the H200, benchmarks/results/h200/2026-12-01-session4/codec_run4.txt).

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
def snake(x, a, inv, DTYPE: tl.constexpr, PRECISE: tl.constexpr):
    """x + inv * sin(x * a)^2 on fp32 values (a, inv broadcast against x), rounded where torch stores in DTYPE.
    Shared with the channels-last kernels (causal_conv.py): their SnakeBeta pass and the convolutions' epilogue.
    PRECISE: 0 the interpreter's sin, 1 libdevice's sinf (torch's bits), 2 the hardware's sin.approx."""
    t = round_to(x * a, DTYPE)
    if PRECISE == 2:                           # sin.approx.f32: causal_conv.py's epilogues where the convolution
        s = libdevice.fast_sinf(t)             # is inexact anyway (TF32, bf16, fp16; see FAST_EPILOGUE_SIN)
    elif PRECISE:
        s = libdevice.sin(t)                   # sinf, as torch's CUDA kernel
    else:
        s = tl.sin(t)                          # the interpreter has no libdevice
    s = round_to(s, DTYPE)
    s2 = round_to(s * s, DTYPE)
    return round_to(x + round_to(inv * s2, DTYPE), DTYPE)


@triton.jit
def _snake_beta_kernel(x_ptr, a_ptr, inv_ptr, bias_ptr, out_ptr, C, T, stride_b, stride_c, out_stride_b,
                       out_stride_c, HAS_BIAS: tl.constexpr, PRECISE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)                     # (batch, channel) pair
    b, c = row // C, row % C
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < T
    dtype = x_ptr.dtype.element_ty
    base = b.to(tl.int64) * stride_b + c.to(tl.int64) * stride_c
    x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:                               # the previous convolution's bias, rounded as its output would be
        x = round_to(x + tl.load(bias_ptr + c).to(tl.float32), dtype)
    a = tl.load(a_ptr + c).to(tl.float32)
    inv = tl.load(inv_ptr + c).to(tl.float32)
    y = snake(x, a, inv, dtype, PRECISE)
    out_base = b.to(tl.int64) * out_stride_b + c.to(tl.int64) * out_stride_c
    tl.store(out_ptr + out_base + offs, y.to(dtype), mask=mask)


def supported(x: torch.Tensor, a: torch.Tensor, inv: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """x [B, C, T] with a unit last stride, a / inv (/ bias) [C] in x's dtype, one device, no autograd graph to
    record."""
    if x.dim() != 3 or x.stride(-1) != 1 or x.dtype not in _DTYPES:
        return False
    terms = (a, inv) if bias is None else (a, inv, bias)
    if any(t.shape != (x.shape[1],) or t.dtype != x.dtype or t.device != x.device for t in terms):
        return False
    return not (torch.is_grad_enabled() and x.requires_grad)


def snake_beta(x: torch.Tensor, a: torch.Tensor, inv: torch.Tensor, bias: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """x + inv * sin(x * a)^2 per channel (a, inv [C] broadcast over B and T); a new contiguous tensor, or written
    into `out` ([B, C, T] with a unit last stride, e.g. a slice of a buffer that already holds a convolution's left
    context: the concatenation's copy is saved).
    bias [C]: x is a convolution's output without its bias, which is added first (rounded, as the convolution would
    have stored it): the bias add's own pass over the activation is saved."""
    bsz, c, t = x.shape
    if out is None:
        out = torch.empty((bsz, c, t), dtype=x.dtype, device=x.device)
    elif out.shape != x.shape or out.stride(-1) != 1 or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out must be {tuple(x.shape)} {x.dtype} with a unit last stride")
    if out.numel():
        a, inv = a.contiguous(), inv.contiguous()
        bias_arg = a if bias is None else bias.contiguous()       # not read without HAS_BIAS
        _snake_beta_kernel[(bsz * c, triton.cdiv(t, _BLOCK))](
            x, a, inv, bias_arg, out, c, t, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
            HAS_BIAS=bias is not None,
            PRECISE=x.is_cuda, BLOCK=_BLOCK, num_warps=4,
            enable_fp_fusion=False)            # the scaled square and the sum stay two rounded operations
    return out


@triton.jit
def _bias_residual_kernel(h_ptr, bias_ptr, x_ptr, out_ptr, C, T, BLOCK: tl.constexpr):
    row = tl.program_id(0)                     # (batch, channel) pair; all three tensors contiguous [B, C, T]
    c = row % C
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < T
    dtype = h_ptr.dtype.element_ty
    base = row.to(tl.int64) * T
    h = tl.load(h_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    h = round_to(h + tl.load(bias_ptr + c).to(tl.float32), dtype)
    tl.store(out_ptr + base + offs, round_to(h + x, dtype).to(dtype), mask=mask)


def bias_residual_supported(h: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> bool:
    return (h.dim() == 3 and h.shape == x.shape and h.is_contiguous() and x.is_contiguous() and h.dtype == x.dtype
            and h.dtype in _DTYPES and bias.shape == (h.shape[1],) and bias.dtype == h.dtype
            and h.device == x.device == bias.device and not (torch.is_grad_enabled() and h.requires_grad))


def bias_residual(h: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(h + bias per channel) + x, each sum rounded to the dtype as the separate torch adds round them, in one pass:
    a residual unit's last (bias-less) convolution output h, its bias, and the unit's input x, all [B, C, T]."""
    bsz, c, t = h.shape
    out = torch.empty_like(h)
    if out.numel():
        _bias_residual_kernel[(bsz * c, triton.cdiv(t, _BLOCK))](h, bias.contiguous(), x, out, c, t, BLOCK=_BLOCK,
                                                                 num_warps=4, enable_fp_fusion=False)
    return out
