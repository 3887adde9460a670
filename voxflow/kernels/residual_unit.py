"""A codec residual unit's two convolutions in one Triton kernel, for units of at most 128 channels.

The channels-last waveform stack (models/qwen3_tts/codec_waveform_cl.py) runs a residual unit as the dilated k=7
convolution with its bias and the second SnakeBeta in the epilogue (causal_conv.py), which writes h, then the 1x1
convolution, which reads h back and adds its bias and the unit's input x. At the 96-channel level (24 kHz) h is
the size of the whole activation (295 MB for a 16-stream, 25-frame call in fp32) and the 1x1 pass costs 0.30 ms of
such a call's 0.96 + 0.30 (H200, benchmarks/results/h200/2026-12-02-session14, calls 3 and 6). Here one program
holds a tile's h for all channels (<= 128, one column tile) and multiplies it by the 1x1 weight in its epilogue: h
never leaves the SM.

Numerics are the two kernels': h is rounded as the k=7 convolution stores it (bf16: rounded to bf16 before the
second product), the 1x1 product in the same precision (TF32 / bf16 tensor cores, fp32 accumulation), its bias
and the residual added with the same rounding points. Only the 1x1 product's summation order may differ (one
K = 128 product instead of 32 / 64-channel steps).

Off by default (VOXFLOW_FUSED_RESIDUAL_UNIT=1): on the H200 it saved 5% of the pair in fp32 and cost 53% in bf16
(session 15, call 1); it takes fp32 / bf16 only, so with the codec in fp16 (the GPU default since session 15) the
unit runs as the two kernels even when switched on.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from voxflow.kernels.causal_conv import (_dot_precision, _unit_channel_stride, bias_snake_epilogue, conv_mainloop,
                                         epilogue_sin_mode, tile_rows)
from voxflow.kernels.rms_norm import round_to

MAX_CHANNELS = 128
# Off: measured on the device (docstring above); VOXFLOW_FUSED_RESIDUAL_UNIT=1.
ENABLED = os.environ.get("VOXFLOW_FUSED_RESIDUAL_UNIT", "0") == "1"


@triton.jit
def _residual_unit_kernel(x_ptr, w7_ptr, b7_ptr, a_ptr, inv_ptr, w1_ptr, b1_ptr, res_ptr, out_ptr,
                          ROWS, T, C, NK, x_sb, x_st, res_sb, res_st, out_sb, out_st,
                          DILATION: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                          DOT_IN_FP32: tl.constexpr, EVEN_K: tl.constexpr,
                          BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
    r, row_ok, bb, tt = tile_rows(tl.program_id(0), ROWS, T, BLOCK_T)
    cols = tl.arange(0, BLOCK_C)                    # every channel: the 1x1 product needs all of h's
    col_ok = cols < C
    dtype = out_ptr.dtype.element_ty
    x_rows = x_ptr + (bb * x_sb + tt * x_st)[:, None]
    acc = conv_mainloop(x_rows, row_ok, w7_ptr, cols, col_ok, C, C, NK, x_st, 7, DILATION, DOT_PRECISION,
                        DOT_IN_FP32, EVEN_K, BLOCK_T, BLOCK_C, BLOCK_K)
    h = bias_snake_epilogue(acc, cols, col_ok, b7_ptr, a_ptr, inv_ptr, dtype, True, True, PRECISE)
    # Channels >= C of h are 0 (masked weights, bias and SnakeBeta terms), and so are the 1x1 weight's rows there.
    w1 = tl.load(w1_ptr + cols[:, None] * C + cols[None, :], mask=col_ok[:, None] & col_ok[None, :], other=0.0)
    if DOT_IN_FP32:
        h_in = h
        w1 = w1.to(tl.float32)
    else:
        h_in = h.to(dtype)                           # as the 1x1 convolution would read the stored h
    y = tl.dot(h_in, tl.trans(w1), input_precision=DOT_PRECISION)
    y = round_to(y, dtype)
    y = round_to(y + tl.load(b1_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :], dtype)
    mask = row_ok[:, None] & col_ok[None, :]
    res = tl.load(res_ptr + (bb * res_sb + tt * res_st)[:, None] + cols[None, :], mask=mask, other=0.0)
    y = round_to(y + res.to(tl.float32), dtype)
    tl.store(out_ptr + (bb * out_sb + tt * out_st)[:, None] + cols[None, :], y.to(dtype), mask=mask)


def supported(x: torch.Tensor, channels: int, kernel_size: int) -> bool:
    """A unit this kernel takes: a k=7 first convolution over at most MAX_CHANNELS channels, fp32 / bf16 rows."""
    return kernel_size == 7 and channels <= MAX_CHANNELS and x.dtype in (torch.float32, torch.bfloat16)


def launch_config(dtype: torch.dtype) -> dict:
    """128-row tiles over all (<= 128) channels; 3 pipeline stages leave shared memory for the 1x1 weight and h."""
    return dict(BLOCK_T=128, BLOCK_K=32 if dtype == torch.float32 else 64, num_warps=8, num_stages=3)


def residual_unit_channels_last(x: torch.Tensor, w7_packed: torch.Tensor, b7: torch.Tensor, dilation: int,
                                snake_terms: tuple[torch.Tensor, torch.Tensor], w1_packed: torch.Tensor,
                                b1: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """conv1x1(snake(conv7(x) + b7)) + b1 + residual over channels-last rows: x [B, T + 6 * dilation, C] (left
    context included, unit channel stride), w7_packed [7, C, C] / w1_packed [1, C, C] (causal_conv.pack_weight),
    residual [B, T, C] -> [B, T, C] contiguous."""
    bsz, rows_in, c = x.shape
    if w7_packed.shape != (7, c, c) or w1_packed.shape != (1, c, c) or c > MAX_CHANNELS:
        raise ValueError(f"weights {tuple(w7_packed.shape)} / {tuple(w1_packed.shape)} do not fit {c} channels "
                         f"(<= {MAX_CHANNELS})")
    t = rows_in - 6 * dilation
    if t < 0:
        raise ValueError(f"{rows_in} input rows hold no output of a 7-tap, dilation-{dilation} convolution")
    out = torch.empty((bsz, t, c), dtype=x.dtype, device=x.device)
    if residual.shape != out.shape or not _unit_channel_stride(residual) or not _unit_channel_stride(x):
        raise ValueError(f"x (unit channel stride) and residual {tuple(out.shape)} (unit channel stride) needed")
    if out.numel() == 0:
        return out
    cfg = launch_config(x.dtype)
    a, inv = snake_terms
    precision = _dot_precision(x)
    _residual_unit_kernel[(triton.cdiv(bsz * t, cfg["BLOCK_T"]),)](
        x, w7_packed, b7, a, inv, w1_packed, b1, residual, out,
        bsz * t, t, c, triton.cdiv(c, cfg["BLOCK_K"]), x.stride(0), x.stride(1), residual.stride(0),
        residual.stride(1), out.stride(0), out.stride(1),
        DILATION=dilation, PRECISE=epilogue_sin_mode(x.is_cuda, x.dtype, precision), DOT_PRECISION=precision,
        DOT_IN_FP32=not x.is_cuda, EVEN_K=c % cfg["BLOCK_K"] == 0,
        BLOCK_T=cfg["BLOCK_T"], BLOCK_C=max(16, triton.next_power_of_2(c)), BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False)
    return out
