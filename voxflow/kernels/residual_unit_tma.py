"""A codec residual unit in one fp16 TMA kernel: the 96- and 192-channel levels of the waveform stack.

The waveform stack (models/qwen3_tts/codec_waveform_cl.py) runs a residual unit as two TMA convolutions
(causal_conv.py): the dilated k=7 one with its bias and SnakeBeta in the epilogue, which stores h, and the 1x1 one,
which reads h back, adds its bias and the unit's input, and (ACT_IN_EPILOGUE 2) stores that raw value and the next
layer's SnakeBeta of it. At 96 and 192 channels h is as large as the whole activation (a 16-stream 25-frame call:
768,000 rows x 96 channels, 147 MB in fp16) and the 1x1 kernel costs 0.177 / 0.133 ms of the unit's 0.50 / 0.42 on
an H100 (benchmarks/results/h100/2026-12-06-session46). Here one program makes a 128-row tile's h for every channel
in two accumulators (96 = 64 + 32, 192 = 128 + 64, as the split-N convolution does) and multiplies it by the 1x1
weight before anything is stored: h never leaves the SM, and one launch replaces two.

Numerics are the two kernels': h is rounded to fp16 as the k=7 convolution stores it, the 1x1 product runs on the
same tensor cores with fp32 accumulation, and its epilogue is the same function (`causal_conv._tma_epilogue`:
bias, residual, SnakeBeta, with the same rounding points). Only the 1x1 product's summation order differs (K in
blocks of 64 + 32 (128 + 64) instead of the 1x1 kernel's 32- (64-) channel steps).

On by default (VOXFLOW_FUSED_RESIDUAL_UNIT_TMA=0 turns it off) since session 49 measured it on an H100
(benchmarks/results/h100/2026-12-06-session49): at the 16-stream 25-frame shapes a 96-channel unit 0.523 -> 0.361 ms
and a 192-channel one 0.432 -> 0.408 at CONFIGS' tiles (the probe's sweep winners), and the served 0.6B c=64 <= 8 GB
offline run 751.7 -> 759.0 audio-s/s (alternating, one machine; at session 48's 8-warp tiles) with 0.24 GiB less
peak memory (h is never stored).
Session 15's pointer-load fused unit (residual_unit.py) had lost 53% in bf16 to its two dots' register and
shared-memory needs; TMA loads and fp16 leave this one room (sm_90: 190 / 219 registers, no spill).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from voxflow.kernels.causal_conv import (_dot_precision, _tma_epilogue, bias_snake_epilogue, checked_outputs,
                                         epilogue_sin_mode, tma_descriptors)

ENABLED = os.environ.get("VOXFLOW_FUSED_RESIDUAL_UNIT_TMA", "1") == "1"

# channels -> tiles: BLOCK_N + BLOCK_N2 = channels (the split-N convolution's column split and its k=7 tiles); the
# fastest of the probe's sweep on an H100 (session 49: four warps beat eight at both widths, 64 rows at 192 channels)
CONFIGS: dict = {
    96: dict(BLOCK_T=128, BLOCK_N=64, BLOCK_N2=32, BLOCK_K=32, num_warps=4, num_stages=4),
    192: dict(BLOCK_T=64, BLOCK_N=128, BLOCK_N2=64, BLOCK_K=64, num_warps=4, num_stages=3),
}


@triton.jit
def _residual_unit_tma_kernel(x_desc, w_desc, w2_desc, b7_ptr, a_ptr, inv_ptr, w1_ptr, b1_ptr, res_ptr, a2_ptr,
                              inv2_ptr, raw_ptr, out_ptr, T, C, NK, res_sb, res_st, raw_sb, raw_st, out_sb, out_st,
                              DILATION: tl.constexpr, ACTIVATE: tl.constexpr, RAW_OUT: tl.constexpr,
                              PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                              BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_N2: tl.constexpr,
                              BLOCK_K: tl.constexpr):
    # grid: (row tiles of one sequence, sequences); a program owns all C = BLOCK_N + BLOCK_N2 columns
    t0 = tl.program_id(0) * BLOCK_T
    b = tl.program_id(1)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_T, BLOCK_N2), dtype=tl.float32)
    for it in range(0, 7 * NK):                 # the k=7 convolution: tap j's rows are the input shifted j * DILATION
        j = it // NK
        k0 = (it - j * NK) * BLOCK_K
        a = x_desc.load([b, t0 + j * DILATION, k0]).reshape(BLOCK_T, BLOCK_K)
        w = w_desc.load([j * C, k0])
        w2 = w2_desc.load([j * C + BLOCK_N, k0])
        if DOT_IN_FP32:                         # the interpreter's dot does not take half-precision operands
            a = a.to(tl.float32)
            w = w.to(tl.float32)
            w2 = w2.to(tl.float32)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
        acc2 = tl.dot(a, tl.trans(w2), acc2, input_precision=DOT_PRECISION)
    dtype = out_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK_N)
    cols2 = BLOCK_N + tl.arange(0, BLOCK_N2)
    # h as the k=7 convolution would store it (+ bias, SnakeBeta, rounded to the activation dtype)
    h = bias_snake_epilogue(acc, cols, cols < C, b7_ptr, a_ptr, inv_ptr, dtype, True, True, PRECISE).to(dtype)
    h2 = bias_snake_epilogue(acc2, cols2, cols2 < C, b7_ptr, a_ptr, inv_ptr, dtype, True, True, PRECISE).to(dtype)
    # the 1x1 weight [C out, C in] in four blocks: (out 0..N | N..C) x (in 0..N | N..C)
    w11 = tl.load(w1_ptr + cols[:, None] * C + cols[None, :])
    w12 = tl.load(w1_ptr + cols[:, None] * C + cols2[None, :])
    w21 = tl.load(w1_ptr + cols2[:, None] * C + cols[None, :])
    w22 = tl.load(w1_ptr + cols2[:, None] * C + cols2[None, :])
    if DOT_IN_FP32:
        h, h2 = h.to(tl.float32), h2.to(tl.float32)
        w11, w12, w21, w22 = w11.to(tl.float32), w12.to(tl.float32), w21.to(tl.float32), w22.to(tl.float32)
    y = tl.dot(h, tl.trans(w11), input_precision=DOT_PRECISION)
    y = tl.dot(h2, tl.trans(w12), y, input_precision=DOT_PRECISION)
    y2 = tl.dot(h, tl.trans(w21), input_precision=DOT_PRECISION)
    y2 = tl.dot(h2, tl.trans(w22), y2, input_precision=DOT_PRECISION)
    # the 1x1 convolution's epilogue: + bias, + the unit's input, the raw value and / or the next SnakeBeta stored
    tt = (t0 + tl.arange(0, BLOCK_T)).to(tl.int64)
    _tma_epilogue(y, 0, tt, b, b1_ptr, a_ptr, inv_ptr, res_ptr, a2_ptr, inv2_ptr, raw_ptr, out_ptr, T, C, res_sb,
                  res_st, raw_sb, raw_st, out_sb, out_st, True, False, True, ACTIVATE, RAW_OUT, PRECISE, BLOCK_N)
    _tma_epilogue(y2, BLOCK_N, tt, b, b1_ptr, a_ptr, inv_ptr, res_ptr, a2_ptr, inv2_ptr, raw_ptr, out_ptr, T, C,
                  res_sb, res_st, raw_sb, raw_st, out_sb, out_st, True, False, True, ACTIVATE, RAW_OUT, PRECISE,
                  BLOCK_N2)


def fits(x: torch.Tensor, w7_packed: torch.Tensor, t: int) -> bool:
    """A unit this kernel takes: ENABLED; fp16; a k=7 first convolution (`w7_packed` [7, C, C]) over a CONFIGS
    channel count; operands TMA can read (causal_conv.tma_fits: a Hopper GPU, or the interpreter on a CPU; 16-byte
    aligned rows); and `t` output rows a sequence that its per-sequence tiles cover without much waste (the TMA
    convolution's rule)."""
    from voxflow.kernels.causal_conv import _sequence_tiles_waste_little, tma_fits
    c = x.shape[2]
    return (ENABLED and x.dtype == torch.float16 and c in CONFIGS and tuple(w7_packed.shape) == (7, c, c)
            and tma_fits(x, w7_packed) and _sequence_tiles_waste_little(x.shape[0], t, CONFIGS[c]["BLOCK_T"]))


def residual_unit_tma(x: torch.Tensor, w7_packed: torch.Tensor, b7: torch.Tensor, dilation: int,
                      snake_terms: tuple[torch.Tensor, torch.Tensor], w1_packed: torch.Tensor, b1: torch.Tensor,
                      residual: torch.Tensor, *, activation: tuple[torch.Tensor, torch.Tensor] | None = None,
                      out: torch.Tensor | None = None, raw_out: torch.Tensor | None = None,
                      config: dict | None = None) -> torch.Tensor:
    """conv1x1(snake(conv7(x) + b7)) + b1 + residual over channels-last rows, as `conv1d_channels_last` makes it in
    two calls (the second with residual=, activation=, out=, raw_out=): x [B, T + 6 * dilation, C] (left context
    included, unit channel stride, 16-byte aligned rows), w7_packed [7, C, C] / w1_packed [1, C, C] (pack_weight),
    residual [B, T, C]; activation (a, inv): the next layer's SnakeBeta applied last; out: [B, T, C] rows to write
    (e.g. a buffer's after its context; a new tensor when None); raw_out: the value before `activation`; config:
    tiles other than CONFIGS[C] (BLOCK_N + BLOCK_N2 = C; for probe_residual_unit_tma.py's sweep)."""
    bsz, rows_in, c = x.shape
    if c not in CONFIGS or w7_packed.shape != (7, c, c) or w1_packed.shape != (1, c, c):
        raise ValueError(f"weights {tuple(w7_packed.shape)} / {tuple(w1_packed.shape)} for {c} channels: "
                         f"{sorted(CONFIGS)} channels only")
    if x.stride(2) != 1 or not (w7_packed.is_contiguous() and w1_packed.is_contiguous()):
        raise ValueError("x needs a unit channel stride and the packed weights contiguous rows (TMA boxes)")
    t = rows_in - 6 * dilation
    if t < 0:
        raise ValueError(f"{rows_in} input rows hold no output of a 7-tap, dilation-{dilation} convolution")
    out = checked_outputs(x, (bsz, t, c), out, residual, raw_out, activation)
    if out.numel() == 0:
        return out
    cfg = config or CONFIGS[c]
    if cfg["BLOCK_N"] + cfg["BLOCK_N2"] != c:
        raise ValueError(f"a config's BLOCK_N + BLOCK_N2 must be the {c} channels")
    bt, bn, bn2, bk = cfg["BLOCK_T"], cfg["BLOCK_N"], cfg["BLOCK_N2"], cfg["BLOCK_K"]
    x_desc, w_desc, w2_desc = tma_descriptors(x, w7_packed, bt, bn, bn2, bk)
    a, inv = snake_terms
    a2, inv2 = activation if activation is not None else (a, inv)      # not read without ACTIVATE
    raw = raw_out if raw_out is not None else out                       # not written without RAW_OUT
    precision = _dot_precision(x)
    _residual_unit_tma_kernel[(triton.cdiv(t, bt), bsz)](
        x_desc, w_desc, w2_desc, b7, a, inv, w1_packed, b1, residual, a2, inv2, raw, out, t, c,
        triton.cdiv(c, bk), residual.stride(0), residual.stride(1), raw.stride(0), raw.stride(1), out.stride(0),
        out.stride(1), DILATION=dilation, ACTIVATE=activation is not None, RAW_OUT=raw_out is not None,
        PRECISE=epilogue_sin_mode(x.is_cuda, x.dtype, precision), DOT_PRECISION=precision,
        DOT_IN_FP32=not x.is_cuda, BLOCK_T=bt, BLOCK_N=bn, BLOCK_N2=bn2, BLOCK_K=bk,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], enable_fp_fusion=False)
    return out
