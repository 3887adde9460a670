"""Channels-last ([B, T, C]) 1-D convolutions and SnakeBeta for the codec decoder's high-rate stack, in Triton.

Why: the decoder's upsampling blocks run 96-768-channel convolutions at up to 24 kHz; in PyTorch's [B, C, T] layout
cuDNN ran them as sm80 TF32 kernels with layout conversions around each one (nchwToNhwc / nhwcToNchw: 5.7 ms of a
90 ms 64 x 25-frame call on the H200), and every bias, activation and residual add was another full pass over
activations of up to a GB (benchmarks/results/h200/2026-12-01-session4/codec_run5_after_fusions.txt). Here a
convolution is one implicit GEMM over channels-last rows: output row t of a k-tap convolution with dilation d is
sum_j x[t + j*d] @ W_j, so each tile of rows loads k shifted row blocks of the (left-padded) input, and the epilogue
adds the bias, and optionally applies the next SnakeBeta or adds the residual, before the single store.

Numerics: products and sums in fp32 (fp32 inputs multiply in TF32 when cuDNN's convolutions may,
`torch.backends.cudnn.allow_tf32`, PyTorch's default; bf16 / fp16 inputs on their tensor cores), the output rounded
to the activation dtype where torch would store it: the bias-less convolution, + bias, the SnakeBeta steps
(snake_beta.py's rounding points), + residual. (The one-channel output conv's [B, C, T] kernel path rounds each
tap's product before its fp32 sum instead: the same class of error.) The GPU tests hold the whole stack to the plain
PyTorch decoder.
"""
from __future__ import annotations

import importlib.util
import os

import torch
import triton
import triton.language as tl

from voxflow.kernels import _major_capability
from voxflow.kernels.rms_norm import round_to
from voxflow.kernels.snake_beta import snake

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _snake_cl_kernel(x_ptr, a_ptr, inv_ptr, out_ptr, N, C, x_sb, out_sb,
                     PRECISE: tl.constexpr, BLOCK: tl.constexpr):
    # One sequence's [T, C] rows are contiguous: element e is channel e % C (no masked channel lanes).
    b = tl.program_id(1).to(tl.int64)
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)     # one long sequence may pass 2^31 values
    mask = e < N
    c = e % C
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + b * x_sb + e, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + c, mask=mask, other=0.0).to(tl.float32)
    inv = tl.load(inv_ptr + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + b * out_sb + e, snake(x, a, inv, dtype, PRECISE).to(dtype), mask=mask)


@triton.jit
def conv_mainloop(x_rows, row_ok, w_ptr, cols, col_ok, CIN, COUT, NK, x_st,
                  KSIZE: tl.constexpr, DILATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  DOT_IN_FP32: tl.constexpr, EVEN_K: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The implicit GEMM of a tile: sum over taps j and input channels of x[t + j * DILATION] @ W_j -> fp32
    [BLOCK_T, BLOCK_N]. x_rows: [BLOCK_T, 1] pointers to each output row's first input row."""
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    # One flat loop over (tap, input-channel block), so the software pipeline spans the taps. The weight tile is
    # read K-major ([k, Cout, Cin] rows) and transposed in registers: the layout wgmma wants for TF32 operands.
    for it in range(0, KSIZE * NK):
        j = it // NK
        kk = (it - j * NK) * BLOCK_K + ks
        w_ptrs = w_ptr + (j * COUT + cols)[:, None] * CIN + kk[None, :]
        if EVEN_K:
            a = tl.load(x_rows + j * DILATION * x_st + kk[None, :], mask=row_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=col_ok[:, None], other=0.0)
        else:
            k_ok = kk < CIN
            a = tl.load(x_rows + j * DILATION * x_st + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_IN_FP32:                        # the interpreter's dot does not take bf16 operands
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def bias_snake_epilogue(acc, cols, col_ok, bias_ptr, a_ptr, inv_ptr, dtype: tl.constexpr, HAS_BIAS: tl.constexpr,
                        SNAKE: tl.constexpr, PRECISE: tl.constexpr):
    """The accumulator rounded as the stored convolution, + bias (rounded), then SnakeBeta: fp32 values."""
    h = round_to(acc, dtype)                                        # the bias-less convolution, as stored
    if HAS_BIAS:
        h = round_to(h + tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :], dtype)
    if SNAKE:
        av = tl.load(a_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        iv = tl.load(inv_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        h = snake(h, av, iv, dtype, PRECISE)
    return h


@triton.jit
def residual_activation_store(h, mask, bb, tt, cols, col_ok, res_ptr, res_sb, res_st, a2_ptr, inv2_ptr, raw_ptr,
                              raw_sb, raw_st, out_ptr, out_sb, out_st, dtype: tl.constexpr, RESIDUAL: tl.constexpr,
                              ACTIVATE: tl.constexpr, RAW_OUT: tl.constexpr, PRECISE: tl.constexpr):
    """The epilogue's end: + residual (rounded); with ACTIVATE the next layer's SnakeBeta (a2, inv2) of that value is
    what `out` gets, and with RAW_OUT the value before it is stored too (into raw). bb (one, or one a row) and tt:
    the int64 sequence and row numbers of the tile's rows. The SnakeBeta takes the epilogue's sin (PRECISE): on a
    GPU sin.approx where the convolution is inexact (FAST_EPILOGUE_SIN), as conv1's own SnakeBeta epilogue does,
    not the libdevice sinf of the SnakeBeta pass it replaces (libdevice's sinf here: 93 -> 176 registers and a
    272-byte spill under the 128 cap in the fp16 1x1 kernels, compile_check)."""
    if RESIDUAL:
        res = tl.load(res_ptr + (bb * res_sb + tt * res_st)[:, None] + cols[None, :], mask=mask, other=0.0)
        h = round_to(h + res.to(tl.float32), dtype)
    if RAW_OUT:
        tl.store(raw_ptr + (bb * raw_sb + tt * raw_st)[:, None] + cols[None, :], h.to(dtype), mask=mask)
    if ACTIVATE:
        av = tl.load(a2_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        iv = tl.load(inv2_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        h = snake(h, av, iv, dtype, PRECISE)
    tl.store(out_ptr + (bb * out_sb + tt * out_st)[:, None] + cols[None, :], h.to(dtype), mask=mask)


@triton.jit
def tile_rows(tile, ROWS, T, BLOCK_T: tl.constexpr):
    """A tile's output rows: all B sequences' rows numbered b * T + t, so short sequences (low rates, 1-frame calls)
    fill tiles -> (r, r < ROWS, b, t), b and t as int64."""
    r = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    return r, r < ROWS, (r // T).to(tl.int64), (r % T).to(tl.int64)


@triton.jit
def _conv_cl_kernel(x_ptr, w_ptr, bias_ptr, a_ptr, inv_ptr, res_ptr, a2_ptr, inv2_ptr, raw_ptr, out_ptr,
                    ROWS, T, CIN, COUT, NK, x_sb, x_st, res_sb, res_st, raw_sb, raw_st, out_sb, out_st,
                    KSIZE: tl.constexpr, DILATION: tl.constexpr, HAS_BIAS: tl.constexpr, SNAKE: tl.constexpr,
                    RESIDUAL: tl.constexpr, ACTIVATE: tl.constexpr, RAW_OUT: tl.constexpr,
                    PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    DOT_IN_FP32: tl.constexpr, EVEN_K: tl.constexpr,
                    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    r, row_ok, bb, tt = tile_rows(tl.program_id(0), ROWS, T, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < COUT
    dtype = out_ptr.dtype.element_ty
    x_rows = x_ptr + (bb * x_sb + tt * x_st)[:, None]
    acc = conv_mainloop(x_rows, row_ok, w_ptr, cols, col_ok, CIN, COUT, NK, x_st, KSIZE, DILATION, DOT_PRECISION,
                        DOT_IN_FP32, EVEN_K, BLOCK_T, BLOCK_N, BLOCK_K)
    h = bias_snake_epilogue(acc, cols, col_ok, bias_ptr, a_ptr, inv_ptr, dtype, HAS_BIAS, SNAKE, PRECISE)
    mask = row_ok[:, None] & col_ok[None, :]
    residual_activation_store(h, mask, bb, tt, cols, col_ok, res_ptr, res_sb, res_st, a2_ptr, inv2_ptr, raw_ptr,
                              raw_sb, raw_st, out_ptr, out_sb, out_st, dtype, RESIDUAL, ACTIVATE, RAW_OUT, PRECISE)


@triton.jit
def _conv_cl_tma_kernel(x_desc, w_desc, w2_desc, bias_ptr, a_ptr, inv_ptr, res_ptr, a2_ptr, inv2_ptr, raw_ptr,
                        out_ptr, T, T_IN, ROWS_IN, COUT, NK, res_sb, res_st, raw_sb, raw_st, out_sb, out_st,
                        KSIZE: tl.constexpr, DILATION: tl.constexpr, HAS_BIAS: tl.constexpr, SNAKE: tl.constexpr,
                        RESIDUAL: tl.constexpr, ACTIVATE: tl.constexpr, RAW_OUT: tl.constexpr,
                        PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        DOT_IN_FP32: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, SPLIT_N: tl.constexpr, BLOCK_N2: tl.constexpr,
                        FLAT: tl.constexpr):
    # `_conv_cl_kernel` with its operand tiles fetched by the tensor memory accelerator (TMA): a tile is one
    # sequence's rows (grid axis 2 = the sequence), so each tap's input rows are one box of the [B, T_in, Cin]
    # descriptor; rows and channels past the tensor read as zeros. FLAT: the descriptor is [1, B * T_in, Cin] (a
    # batch of contiguous sequences) and a tile any BLOCK_T of its rows, across sequences: input row r computes
    # output (r // T_in, r % T_in), stored where r % T_in < T (its taps are then all in its own sequence); the rows
    # of each sequence's left context compute values never stored. A weight box past a tap's Cout rows reads the
    # next tap's rows (or zeros past the last): only output columns >= Cout see them, and those are never stored.
    # SPLIT_N: a program's columns are BLOCK_N + BLOCK_N2 (w2_desc's boxes), two accumulators fed by one input tile,
    # so a Cout that is no power of two (96 = 64 + 32, 192 = 128 + 64) multiplies no masked columns.
    t0 = tl.program_id(0) * BLOCK_T
    n0 = tl.program_id(1) * (BLOCK_N + BLOCK_N2 if SPLIT_N else BLOCK_N)
    b = tl.program_id(2)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_T, BLOCK_N2), dtype=tl.float32)          # (unused, and compiled away, without SPLIT_N)
    for it in range(0, KSIZE * NK):
        j = it // NK
        k0 = (it - j * NK) * BLOCK_K
        a = x_desc.load([b, t0 + j * DILATION, k0]).reshape(BLOCK_T, BLOCK_K)
        w = w_desc.load([j * COUT + n0, k0])
        if DOT_IN_FP32:                        # the interpreter's dot does not take bf16 operands
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
        if SPLIT_N:
            w2 = w2_desc.load([j * COUT + n0 + BLOCK_N, k0])
            if DOT_IN_FP32:
                w2 = w2.to(tl.float32)
            acc2 = tl.dot(a, tl.trans(w2), acc2, input_precision=DOT_PRECISION)
    tt = (t0 + tl.arange(0, BLOCK_T)).to(tl.int64)
    if FLAT:                            # each row's own sequence; rows past the tensor get T, and are not stored
        b = tt // T_IN
        tt = tl.where(tt < ROWS_IN, tt - b * T_IN, T)
    _tma_epilogue(acc, n0, tt, b, bias_ptr, a_ptr, inv_ptr, res_ptr, a2_ptr, inv2_ptr, raw_ptr, out_ptr, T, COUT,
                  res_sb, res_st, raw_sb, raw_st, out_sb, out_st, HAS_BIAS, SNAKE, RESIDUAL, ACTIVATE, RAW_OUT,
                  PRECISE, BLOCK_N)
    if SPLIT_N:
        _tma_epilogue(acc2, n0 + BLOCK_N, tt, b, bias_ptr, a_ptr, inv_ptr, res_ptr, a2_ptr, inv2_ptr, raw_ptr,
                      out_ptr, T, COUT, res_sb, res_st, raw_sb, raw_st, out_sb, out_st, HAS_BIAS, SNAKE, RESIDUAL,
                      ACTIVATE, RAW_OUT, PRECISE, BLOCK_N2)


@triton.jit
def _tma_epilogue(acc, n0, tt, b, bias_ptr, a_ptr, inv_ptr, res_ptr, a2_ptr, inv2_ptr, raw_ptr, out_ptr, T, COUT,
                  res_sb, res_st, raw_sb, raw_st, out_sb, out_st, HAS_BIAS: tl.constexpr, SNAKE: tl.constexpr,
                  RESIDUAL: tl.constexpr, ACTIVATE: tl.constexpr, RAW_OUT: tl.constexpr, PRECISE: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """The TMA kernel's epilogue of one accumulator, columns n0 .. n0 + BLOCK_N of rows tt of sequence b (one, or
    one a row)."""
    cols = n0 + tl.arange(0, BLOCK_N)
    col_ok = cols < COUT
    dtype = out_ptr.dtype.element_ty
    h = bias_snake_epilogue(acc, cols, col_ok, bias_ptr, a_ptr, inv_ptr, dtype, HAS_BIAS, SNAKE, PRECISE)
    mask = (tt < T)[:, None] & col_ok[None, :]
    residual_activation_store(h, mask, b.to(tl.int64), tt, cols, col_ok, res_ptr, res_sb, res_st, a2_ptr, inv2_ptr,
                              raw_ptr, raw_sb, raw_st, out_ptr, out_sb, out_st, dtype, RESIDUAL, ACTIVATE, RAW_OUT,
                              PRECISE)


def _cfg(block_t: int, block_n: int, block_k: int, warps: int, stages: int, maxnreg: int | None = None) -> dict:
    """A launch config; maxnreg caps the registers a thread (ptxas), e.g. 128 so that two 8-warp blocks fit an SM
    (benchmarks/scripts/conv_occupancy.py: 128 x 128 tiles take 157 (fp32) / 170 (bf16) registers uncapped)."""
    cfg = dict(BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return cfg if maxnreg is None else {**cfg, "maxnreg": maxnreg}


# (cin, cout, k, dtype) -> launch config: the fastest of the candidates for each of the real-size decoder's shapes
# in a 16-stream x 25-frame call, the serving codec batch, on an H200 (benchmarks/scripts/tune_causal_conv.py,
# benchmarks/results/h200/2026-12-02-session15/call2; fp16: call3): the candidates include 128 x 128 tiles with
# registers capped at 128 (two 8-warp blocks an SM). bf16 gained 14.03 -> 12.62 ms a call; fp32 stayed within noise
# (16.94 -> 16.99; 768 k=1 and 96 k=7 changed). Other shapes: `launch_config`'s rule.
TUNED: dict = {
    (768, 768, 7, torch.float32): _cfg(128, 128, 64, 8, 3), (768, 768, 1, torch.float32): _cfg(128, 64, 32, 4, 4),
    (384, 384, 7, torch.float32): _cfg(128, 128, 64, 8, 3), (384, 384, 1, torch.float32): _cfg(64, 128, 32, 4, 4),
    (192, 192, 7, torch.float32): _cfg(128, 64, 32, 4, 4), (192, 192, 1, torch.float32): _cfg(128, 64, 32, 4, 4),
    (96, 96, 7, torch.float32): _cfg(128, 128, 32, 8, 3, 128), (96, 96, 1, torch.float32): _cfg(64, 128, 32, 4, 4),
    (96, 1, 7, torch.float32): _cfg(128, 16, 32, 4, 4),
    (768, 768, 7, torch.bfloat16): _cfg(128, 128, 64, 8, 3, 128),
    (768, 768, 1, torch.bfloat16): _cfg(64, 128, 64, 4, 4),
    (384, 384, 7, torch.bfloat16): _cfg(128, 128, 64, 8, 3, 128),
    (384, 384, 1, torch.bfloat16): _cfg(128, 128, 64, 8, 3, 128),
    (192, 192, 7, torch.bfloat16): _cfg(128, 64, 64, 4, 4), (192, 192, 1, torch.bfloat16): _cfg(128, 64, 64, 4, 4),
    (96, 96, 7, torch.bfloat16): _cfg(128, 128, 64, 8, 3, 128),
    (96, 96, 1, torch.bfloat16): _cfg(128, 128, 64, 8, 3, 128),
    (96, 1, 7, torch.bfloat16): _cfg(128, 16, 64, 4, 4),
    # fp16 (the codec's default on a GPU, codec_precision.py): session 15 call 3, the call 10.41 -> 9.94 ms against
    # bf16's configs; unlike bf16 its 128 x 128 tiles need no spill (compile_check)
    **{(c, c, k, torch.float16): _cfg(128, 128, 64, 8, 3, 128) for c in (768, 384, 192) for k in (7, 1)},
    (96, 96, 7, torch.float16): _cfg(128, 128, 32, 8, 4), (96, 96, 1, torch.float16): _cfg(128, 128, 32, 8, 4),
    (96, 1, 7, torch.float16): _cfg(128, 16, 64, 4, 4),
}


def launch_config(cin: int, cout: int, dtype: torch.dtype, k: int) -> dict:
    """Tile sizes for a [rows, cin] x [cin, cout] implicit GEMM: 128 rows; the widest of 128 / 64 output channels
    that divides cout (96 -> one masked 128 tile); k blocks of 32 (fp32) / 64 (bf16, fp16) channels."""
    if (cin, cout, k, dtype) in TUNED:
        return TUNED[(cin, cout, k, dtype)]
    if dtype == torch.float16 and (cin, cout, k, torch.bfloat16) in TUNED:
        # bf16's config where fp16 has none of its own: the same element size and tensor-core rate
        return TUNED[(cin, cout, k, torch.bfloat16)]
    if cout % 128 == 0 or cout < 128:
        block_n = max(16, min(128, triton.next_power_of_2(cout)))
    else:
        block_n = 64 if cout % 64 == 0 else 128
    block_k = max(16, min(32 if dtype == torch.float32 else 64, triton.next_power_of_2(cin)))
    return _cfg(128, block_n, block_k, 8, 3)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A conv weight [Cout, Cin, k] as the kernel reads it: [k, Cout, Cin], contiguous."""
    return weight.permute(2, 0, 1).contiguous()


def _unit_channel_stride(t: torch.Tensor) -> bool:
    return t.stride(-1) == 1 or t.shape[-1] == 1


def supported(x: torch.Tensor) -> bool:
    """Whether the channels-last stack can take the decoder input x [B, C, T] (it makes its own [B, T, C] rows, so
    x's layout does not matter): fp32 / bf16 / fp16, and no autograd graph to record (the kernels have no backward)."""
    return x.dim() == 3 and x.dtype in _DTYPES and not (torch.is_grad_enabled() and x.requires_grad)


@triton.jit
def _overlap_add_kernel(g_ptr, bias_ptr, tail_ptr, y_ptr, a_ptr, inv_ptr, act_ptr, ROWS, T, C, OV, tail_sb, act_sb,
                        S: tl.constexpr, K: tl.constexpr, HAS_TAIL: tl.constexpr, ACTIVATE: tl.constexpr,
                        PRECISE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_Q: tl.constexpr):
    # A tile of input rows r = b * T + t; per row its S output rows, flattened as q = j * C + c (contiguous in g's
    # row of K * C values and in y's row of S * C): no per-element 64-bit division.
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    q = tl.arange(0, BLOCK_Q)
    c = q % C
    j = q // C
    q_ok = q < S * C
    mask = (r < ROWS)[:, None] & q_ok[None, :]
    dtype = y_ptr.dtype.element_ty
    r64 = r.to(tl.int64)
    y = tl.load(g_ptr + (r64 * (K * C))[:, None] + q[None, :], mask=mask, other=0.0).to(tl.float32)
    y = round_to(y + tl.load(bias_ptr + c, mask=q_ok, other=0.0).to(tl.float32)[None, :], dtype)
    t = r % T
    spill_q = (j < OV)[None, :]
    spill = tl.load(g_ptr + ((r64 - 1) * (K * C) + S * C)[:, None] + q[None, :],
                    mask=mask & spill_q & (t > 0)[:, None], other=0.0).to(tl.float32)
    if HAS_TAIL:                                    # the previous call's spill, [B, C, OV] (any batch stride)
        b = (r // T).to(tl.int64)
        spill += tl.load(tail_ptr + (b * tail_sb)[:, None] + (c * OV + j)[None, :],
                         mask=mask & spill_q & (t == 0)[:, None], other=0.0).to(tl.float32)
    y = tl.where(spill_q, round_to(y + spill, dtype), y)
    tl.store(y_ptr + (r64 * (S * C))[:, None] + q[None, :], y.to(dtype), mask=mask)
    if ACTIVATE:                                    # the next layer's SnakeBeta, into its buffer's rows
        a = tl.load(a_ptr + c, mask=q_ok, other=0.0).to(tl.float32)[None, :]
        inv = tl.load(inv_ptr + c, mask=q_ok, other=0.0).to(tl.float32)[None, :]
        b = (r // T).to(tl.int64)
        act_rows = b * act_sb + (r64 - b * T) * (S * C)
        tl.store(act_ptr + act_rows[:, None] + q[None, :], snake(y, a, inv, dtype, PRECISE).to(dtype), mask=mask)


def overlap_add_channels_last(g: torch.Tensor, bias: torch.Tensor, stride: int, tail: torch.Tensor | None,
                              activation: tuple[torch.Tensor, torch.Tensor] | None = None,
                              activated_out: torch.Tensor | None = None) -> torch.Tensor:
    """A transposed convolution's output rows from its GEMM: g [B, T, k, C] contiguous (input row t's contribution
    to output rows t*stride + j, j < k), bias [C], tail [B, C, k - stride] (the previous call's spill, or None) ->
    y [B, T * stride, C] with y[t*s + j] = g[t, j] + bias (+ g[t-1, s + j], or the tail at t = 0, for j < k - s):
    one pass, rounded where the separate torch adds round (conv_transpose_gemm.py).
    activation (a, inv) [C] with activated_out [B, T * stride, C] (each sequence's rows contiguous, e.g. the rows of
    a buffer after the next convolution's left context): SnakeBeta(y) is stored there too, in the same pass, with
    the convolutions' epilogue sin (`epilogue_sin_mode`: sin.approx on a GPU where the products are inexact)."""
    bsz, t, k, c = g.shape
    overlap = k - stride
    if not g.is_contiguous() or not 0 <= overlap <= stride:
        raise ValueError(f"g must be contiguous [B, T, k, C] with stride <= k <= 2 * stride, got {tuple(g.shape)}")
    if bias.shape != (c,) or (tail is not None and tail.shape != (bsz, c, overlap)):
        raise ValueError(f"bias must be [{c}] and tail [{bsz}, {c}, {overlap}]")
    if (activation is None) != (activated_out is None) or activated_out is not None and (
            activated_out.shape != (bsz, t * stride, c) or activated_out.dtype != g.dtype
            or not _rows_contiguous(activated_out)):
        raise ValueError(f"activation needs activated_out [{bsz}, {t * stride}, {c}] {g.dtype} with each sequence's "
                         "rows contiguous, and the other way round")
    y = torch.empty((bsz, t * stride, c), dtype=g.dtype, device=g.device)
    rows = bsz * t
    if y.numel():
        block_q = triton.next_power_of_2(stride * c)
        block_r = max(1, 4096 // block_q)
        if tail is not None and tail[0].numel() and not tail[0].is_contiguous():
            tail = tail.contiguous()
        # (the pool's gathered state is a batch-strided view: each row's [C, OV] is contiguous, the rows are not)
        a, inv = (x.contiguous() for x in activation) if activation is not None else (bias, bias)  # not read else
        act = activated_out if activated_out is not None else y                                  # not written else
        _overlap_add_kernel[(triton.cdiv(rows, block_r),)](
            g, bias.contiguous(), tail if tail is not None else g, y, a, inv, act, rows, t, c, overlap,
            tail.stride(0) if tail is not None else 0, act.stride(0),
            S=stride, K=k, HAS_TAIL=tail is not None and overlap > 0, ACTIVATE=activation is not None,
            PRECISE=epilogue_sin_mode(g.is_cuda, g.dtype, _dot_precision(g)), BLOCK_R=block_r, BLOCK_Q=block_q,
            num_warps=8 if block_r * block_q >= 4096 else 4, enable_fp_fusion=False)
    return y


def _dot_precision(x: torch.Tensor) -> str:
    if x.dtype == torch.float32 and x.is_cuda and torch.backends.cudnn.allow_tf32:
        return "tf32"
    return "ieee"


def checked_outputs(x: torch.Tensor, shape: tuple, out: torch.Tensor | None, residual: torch.Tensor | None,
                    raw_out: torch.Tensor | None, activation) -> torch.Tensor:
    """A convolution epilogue's tensors checked against its output `shape` (x's dtype and device, a unit channel
    stride; raw_out only with an activation) -> `out`, a new tensor when None."""
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    for name, given in (("out", out), ("residual", residual), ("raw_out", raw_out)):
        if given is not None and (given.shape != shape or not _unit_channel_stride(given) or given.dtype != x.dtype
                                  or given.device != x.device):
            raise ValueError(f"{name} must be {shape} {x.dtype} on {x.device} with a unit channel stride")
    if raw_out is not None and activation is None:
        raise ValueError("raw_out is the value before `activation`: it needs one")
    return out


def conv1d_channels_last(x: torch.Tensor, weight_packed: torch.Tensor, bias: torch.Tensor | None, dilation: int = 1,
                         snake_terms: tuple[torch.Tensor, torch.Tensor] | None = None,
                         residual: torch.Tensor | None = None, tma: bool | None = None, *,
                         activation: tuple[torch.Tensor, torch.Tensor] | None = None, out: torch.Tensor | None = None,
                         raw_out: torch.Tensor | None = None) -> torch.Tensor:
    """Valid convolution over channels-last rows: x [B, T + (k-1)*dilation, Cin] (already left-padded, unit channel
    stride), weight_packed [k, Cout, Cin] (`pack_weight`), bias [Cout] -> [B, T, Cout] (a new contiguous tensor, or
    written into `out`: [B, T, Cout] with a unit channel stride, e.g. the rows of a buffer after the next layer's
    left context). snake_terms (a, inv) [Cout]: SnakeBeta applied to the biased output; residual [B, T, Cout] (unit
    channel stride): added next. activation (a, inv) [Cout]: the next layer's SnakeBeta applied last, so the output
    is that layer's input (its own pass saved; with the epilogue's sin, `epilogue_sin_mode`); raw_out [B, T, Cout]:
    also gets the value before `activation` (a residual unit's output is both the next unit's residual and its
    activated input). tma: operand tiles through TMA descriptors where the tensors allow (`tma_fits`); None (the
    default): `tma_by_default`, i.e. CONV_TMA for fp16 CUDA tensors only; True asks for it in any dtype."""
    bsz, rows_in, cin = x.shape
    k, cout, wcin = weight_packed.shape
    if wcin != cin or not _unit_channel_stride(x) or not weight_packed.is_contiguous():
        raise ValueError(f"x {tuple(x.shape)} (unit channel stride) and a contiguous [k, Cout, {cin}] weight needed")
    t = rows_in - (k - 1) * dilation
    if t < 0:
        raise ValueError(f"{rows_in} input rows hold no output of a {k}-tap, dilation-{dilation} convolution")
    out = checked_outputs(x, (bsz, t, cout), out, residual, raw_out, activation)
    if out.numel() == 0:
        return out
    cfg = launch_config(cin, cout, x.dtype, k)
    precision = _dot_precision(x)
    a, inv = snake_terms if snake_terms is not None else (x, x)          # not read without SNAKE
    res = residual if residual is not None else out                     # not read without RESIDUAL
    a2, inv2 = activation if activation is not None else (x, x)         # not read without ACTIVATE
    raw = raw_out if raw_out is not None else out                       # not written without RAW_OUT
    # what both kernels take alike: the epilogue, the dot's precision, the tiles and the launch options
    common = dict(KSIZE=k, DILATION=dilation, HAS_BIAS=bias is not None, SNAKE=snake_terms is not None,
                  RESIDUAL=residual is not None, ACTIVATE=activation is not None, RAW_OUT=raw_out is not None,
                  PRECISE=epilogue_sin_mode(x.is_cuda, x.dtype, precision),
                  DOT_PRECISION=precision, DOT_IN_FP32=not x.is_cuda, BLOCK_T=cfg["BLOCK_T"], BLOCK_N=cfg["BLOCK_N"],
                  BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                  enable_fp_fusion=False)              # SnakeBeta's rounded steps stay separate operations
    bias_arg = bias if bias is not None else x
    tiling = tma_tiling(x, t, cfg["BLOCK_T"]) if (tma_by_default(x.is_cuda, x.dtype) if tma is None else tma) \
        and tma_fits(x, weight_packed) else None
    if tiling is not None:
        _conv_tma(x, weight_packed, bias_arg, (a, inv, res, a2, inv2, raw, out), common, flat=tiling == "flat")
        return out
    grid = (triton.cdiv(bsz * t, cfg["BLOCK_T"]), triton.cdiv(cout, cfg["BLOCK_N"]))
    _conv_cl_kernel[grid](
        x, weight_packed, bias_arg, a, inv, res, a2, inv2, raw, out,
        bsz * t, t, cin, cout, triton.cdiv(cin, cfg["BLOCK_K"]), x.stride(0), x.stride(1), res.stride(0),
        res.stride(1), raw.stride(0), raw.stride(1), out.stride(0), out.stride(1), EVEN_K=cin % cfg["BLOCK_K"] == 0,
        **common, **_register_cap(cfg))
    return out


# The convolution's operand tiles through TMA descriptors (`_conv_cl_tma_kernel`) instead of pointer loads: on Hopper
# the copy engine fills shared memory and the warps only multiply. On by default for fp16 (the codec's GPU dtype)
# on CUDA devices of compute capability >= 9: the H200's codec call (16 streams, fp16) 5.39 -> 5.04 ms at 10 frames,
# 10.05 -> 9.53 at 25, the same at 1; served 0.6B c=64 694.4 -> 697.4 audio-s/s, within run-to-run spread
# (benchmarks/results/h200/2026-12-04-session27, call 2). Only fp16 was measured there, so fp32 / bf16 keep the
# pointer kernel unless a caller passes tma=True. VOXFLOW_CONV_TMA=0 turns the default off.
CONV_TMA = os.environ.get("VOXFLOW_CONV_TMA", "1") == "1"


def tma_by_default(is_cuda: bool, dtype: torch.dtype) -> bool:
    """conv1d_channels_last's choice when not told (tma=None): CONV_TMA, for fp16 CUDA tensors only (the one dtype
    measured faster with it); CPU tensors (the interpreter) and fp32 / bf16 take the pointer kernel."""
    return CONV_TMA and is_cuda and dtype == torch.float16


_HAS_TENSOR_DESCRIPTORS = importlib.util.find_spec("triton.tools.tensor_descriptor") is not None   # Triton >= 3.3


def tma_fits(x: torch.Tensor, weight_packed: torch.Tensor) -> bool:
    """Whether both operands can be TMA descriptors: a Triton that has them; for a CUDA tensor, a device with TMA
    (`_has_tma`: NVIDIA, compute capability >= 9, not ROCm; CPU tensors run the kernel in the interpreter);
    16-byte aligned bases and row strides (a descriptor's rule); and a batch the grid's third axis holds (65,535 at
    most). Any of the three dtypes fits: which ones take TMA without being asked is `tma_by_default`'s rule (fp16)."""
    size = x.element_size()
    return (_HAS_TENSOR_DESCRIPTORS and (not x.is_cuda or _has_tma(x.device)) and x.shape[0] <= 65535
            and x.data_ptr() % 16 == 0
            and weight_packed.data_ptr() % 16 == 0
            and all(st * size % 16 == 0 for st in (x.stride(0), x.stride(1), weight_packed.stride(1))))


def _has_tma(device: torch.device) -> bool:
    """TMA is NVIDIA Hopper's (compute capability 9) and later's; ROCm builds report AMD's gfx9 parts as
    capability 9.x but have no TMA. Elsewhere the pointer kernel runs."""
    if torch.version.hip is not None:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _major_capability(index) >= 9


def _tiles_waste_little(tiles: int, bsz: int, t: int, block_t: int) -> bool:
    """A TMA tiling of `tiles` row tiles costs at most 1/8 more than the pointer kernel's tiles over all B x T rows."""
    return 8 * tiles <= 9 * triton.cdiv(bsz * t, block_t)


def _sequence_tiles_waste_little(bsz: int, t: int, block_t: int) -> bool:
    """The TMA kernel tiles each sequence's rows apart (a box never spans two sequences): take it only where that
    wastes little (`_tiles_waste_little`: the low-rate layers' short sequences stay on the pointer kernel)."""
    return _tiles_waste_little(bsz * triton.cdiv(t, block_t), bsz, t, block_t)


# The TMA kernel also where a batch's sequences are too short for tiles of their own, with tiles across the
# sequences of a contiguous batch (`tma_tiling`'s "flat"): the low-rate layers' short sequences, e.g. the first
# upsampling convolution's 100 rows a sequence in a 25-frame call, which took the pointer kernel (325 us at 39% of
# the tensor cores' peak on an H100's 64 SMs, session 54). Off by default: session 55 timed it only together with
# two other codec switches (codec_waveform_cl.ONE_CHANNEL_KERNEL, which accounts for about all of their -0.17 ms a
# 25-frame call, and FIRST_CONV_CL); VOXFLOW_CONV_TMA_FLAT=1 turns it on.
CONV_TMA_FLAT = os.environ.get("VOXFLOW_CONV_TMA_FLAT", "0") == "1"


def tma_tiling(x: torch.Tensor, t: int, block_t: int) -> str | None:
    """How the TMA kernel tiles a convolution of x [B, T_in, Cin] to T output rows a sequence: "sequence" (tiles of
    one sequence's rows) where that wastes little (`_sequence_tiles_waste_little`); else, with CONV_TMA_FLAT, "flat"
    (tiles of the batch's rows in a row, each sequence's T_in - T context rows computed and dropped) where the
    sequences are contiguous and that costs at most 1/8 more tiles than the pointer kernel's; else None (the pointer
    kernel)."""
    bsz, rows_in = x.shape[:2]
    if _sequence_tiles_waste_little(bsz, t, block_t):
        return "sequence"
    if CONV_TMA_FLAT and (bsz == 1 or x.stride(0) == rows_in * x.stride(1)) \
            and _tiles_waste_little(triton.cdiv(bsz * rows_in, block_t), bsz, t, block_t):
        return "flat"
    return None


def takes_tma(x: torch.Tensor, weight_packed: torch.Tensor, t: int) -> bool:
    """Whether conv1d_channels_last, not told (tma=None), runs this convolution on the TMA kernel."""
    block_t = launch_config(x.shape[2], weight_packed.shape[1], x.dtype, weight_packed.shape[0])["BLOCK_T"]
    return tma_by_default(x.is_cuda, x.dtype) and tma_fits(x, weight_packed) and tma_tiling(x, t, block_t) is not None


def tma_descriptors(x: torch.Tensor, weight_packed: torch.Tensor, bt: int, bn: int, bn2: int, bk: int,
                    flat: bool = False) -> tuple:
    """The TMA convolutions' operand descriptors: x [B, T_in, Cin] in boxes of one sequence's bt rows x bk channels
    (flat: x as [1, B * T_in, Cin], its sequences contiguous, in boxes of any bt rows), the packed weight [k, Cout,
    Cin] as [k * Cout, Cin] rows in bn x bk boxes, and in bn2 x bk ones for a second accumulator (the first
    descriptor again when bn2 is 0)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    bsz, rows_in, cin = x.shape
    rows = weight_packed.shape[0] * weight_packed.shape[1]
    if flat:
        x_desc = TensorDescriptor(x, [1, bsz * rows_in, cin], [bsz * rows_in * x.stride(1), x.stride(1), 1],
                                  [1, bt, bk])
    else:
        x_desc = TensorDescriptor(x, [bsz, rows_in, cin], [x.stride(0), x.stride(1), 1], [1, bt, bk])
    w_desc = TensorDescriptor(weight_packed, [rows, cin], [cin, 1], [bn, bk])
    w2_desc = TensorDescriptor(weight_packed, [rows, cin], [cin, 1], [bn2, bk]) if bn2 else w_desc
    return x_desc, w_desc, w2_desc


def _conv_tma(x, weight_packed, bias, epilogue_tensors: tuple, common: dict, flat: bool = False) -> None:
    """`_conv_cl_tma_kernel` on conv1d_channels_last's operands (epilogue_tensors: a, inv, res, a2, inv2, raw, out
    as it passes them; `common`: the arguments both kernels take; flat: tiles across sequences, `tma_tiling`)."""
    a, inv, res, a2, inv2, raw, out = epilogue_tensors
    bsz, rows_in, cin = x.shape
    k, cout = weight_packed.shape[:2]
    t = out.shape[1]
    split = split_n_config(cin, cout, x.dtype, k)
    if split is not None:
        common = {**common, **split}            # its tiles, warps and stages over the one-tile config's
    bn2 = common.pop("BLOCK_N2", 0)             # the second accumulator's columns (0: none)
    bt, bn, bk = common["BLOCK_T"], common["BLOCK_N"], common["BLOCK_K"]
    x_desc, w_desc, w2_desc = tma_descriptors(x, weight_packed, bt, bn, bn2, bk, flat)
    grid = (triton.cdiv(bsz * rows_in, bt), triton.cdiv(cout, bn + bn2), 1) if flat else \
        (triton.cdiv(t, bt), triton.cdiv(cout, bn + bn2), bsz)
    # (no register cap: the tuned configs' maxnreg made ptxas spill here (16-216 bytes a thread, sm_90), while
    # uncapped the kernel takes <= 128 registers anyway: compile_check)
    _conv_cl_tma_kernel[grid](
        x_desc, w_desc, w2_desc, bias, a, inv, res, a2, inv2, raw, out, t, rows_in, bsz * rows_in, cout,
        triton.cdiv(cin, bk), res.stride(0), res.stride(1), raw.stride(0), raw.stride(1), out.stride(0),
        out.stride(1), **common, SPLIT_N=bn2 > 0, BLOCK_N2=bn2 or 16,    # (16: a dummy width, compiled away)
        FLAT=flat)


# The TMA kernel's columns split in two accumulators where Cout is no power of two, fp16 only (the codec's GPU
# dtype): 96 = 64 + 32 and 192 = 128 + 64 channels, where one 128-column tile (96) or two (192 -> 256) multiply 25%
# masked columns (and 288 = 2 x (128 + 16) instead of 3 x 128). Session 46 on an H100
# (benchmarks/results/h100/2026-12-06-session46), 16 streams x 25 frames, ms a call, one tile -> split, the same bits:
# 96 k=7 0.374 -> 0.322, 96 k=1 0.197 -> 0.177, 192 k=7 0.336 -> 0.290, but 192 k=1 0.133 -> 0.153 (left on one
# tile); the 16-stream 25-frame codec call on 64 SMs 12.09 -> 11.51 ms; served 0.6B c=64 offline, alternating on one
# machine, 745.3 -> 749.0 audio-s/s (means of four; every split run above every one-tile run). On by default;
# VOXFLOW_CONV_SPLIT_N=0 turns it off.
CONV_SPLIT_N = os.environ.get("VOXFLOW_CONV_SPLIT_N", "1") == "1"
SPLIT_N_TUNED: dict = {
    (96, 96, 7, torch.float16): dict(_cfg(128, 64, 32, 8, 4), BLOCK_N2=32),
    (96, 96, 1, torch.float16): dict(_cfg(128, 64, 32, 8, 4), BLOCK_N2=32),
    (192, 192, 7, torch.float16): dict(_cfg(128, 128, 64, 8, 3), BLOCK_N2=64),
    # the last block's transposed convolution in its sub-pixel form: 192 -> 3 x 96 = 288 = 2 x (128 + 16)
    (192, 288, 2, torch.float16): dict(_cfg(128, 128, 64, 8, 3), BLOCK_N2=16),
}


def split_n_config(cin: int, cout: int, dtype: torch.dtype, k: int) -> dict | None:
    """The TMA kernel's two-accumulator config for this shape (CONV_SPLIT_N on), else None."""
    return SPLIT_N_TUNED.get((cin, cout, k, dtype)) if CONV_SPLIT_N else None


def _register_cap(cfg: dict) -> dict:
    """The launch option capping registers, when the config sets one (not on the interpreter, which has none)."""
    return {"maxnreg": cfg["maxnreg"]} if "maxnreg" in cfg and not triton_interpreting() else {}


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# The SnakeBeta in a convolution's epilogue with the hardware's sin.approx.f32 instead of libdevice's sinf, where
# the convolution is inexact anyway: TF32 products (~5e-4 relative), or bf16 / fp16, whose inputs, output and every
# SnakeBeta step are rounded to 8 (11) bits. sin.approx's absolute error is ~1e-6 for |x| < 100 pi (PTX ISA) and grows
# with |x| beyond (its argument scaling: ~|x| * 6e-8, 6e-5 at 1000) - still below TF32's, bf16's and fp16's errors.
# The epilogue is compute-bound on sinf's range reduction (session 14 call 3: SnakeBeta adds 19% to the 96- and
# 192-channel k=7 convolutions in fp32, up to 52% in bf16). H200, 16 x 25-frame shapes (call 6): fp32 k=7 at 96 /
# 192 channels 0.959 -> 0.807 / 0.831 -> 0.723 ms (outputs within 1.4e-6), bf16 0.930 -> 0.788 / 0.598 -> 0.415 at
# 384 (outputs equal); the codec's TF32 / bf16 streaming SNR against fp32 unchanged (46.3 / 28.1 dB).
# VOXFLOW_CONV_FAST_SIN=0: libdevice's sinf everywhere.
FAST_EPILOGUE_SIN = os.environ.get("VOXFLOW_CONV_FAST_SIN", "1") == "1"


def epilogue_sin_mode(is_cuda: bool, dtype: torch.dtype, dot_precision: str) -> int:
    """snake()'s PRECISE for a convolution's epilogue: 0 on the interpreter, 2 (sin.approx) with FAST_EPILOGUE_SIN
    where the products are inexact (TF32, bf16 or fp16), else 1 (libdevice sinf, torch's bits)."""
    if not is_cuda:
        return 0
    return 2 if FAST_EPILOGUE_SIN and (dtype in (torch.bfloat16, torch.float16) or dot_precision == "tf32") else 1


def _rows_contiguous(t: torch.Tensor) -> bool:
    """Each sequence's [T, C] rows one contiguous block (a batch stride may differ)."""
    return _unit_channel_stride(t) and (t.stride(1) == t.shape[2] or t.shape[1] == 1)


def snake_channels_last(x: torch.Tensor, a: torch.Tensor, inv: torch.Tensor, out: torch.Tensor | None = None
                        ) -> torch.Tensor:
    """SnakeBeta over channels-last rows: x [B, T, C] (each sequence's rows contiguous), a / inv [C] -> a new
    contiguous tensor, or written into `out` ([B, T, C], each sequence's rows contiguous: e.g. the rows of a buffer
    after a convolution's left context)."""
    bsz, t, c = x.shape
    if out is None:
        out = torch.empty((bsz, t, c), dtype=x.dtype, device=x.device)
    elif out.shape != x.shape or not _rows_contiguous(out) or out.dtype != x.dtype:
        raise ValueError(f"out must be {tuple(x.shape)} {x.dtype} with each sequence's rows contiguous")
    if not _rows_contiguous(x):
        raise ValueError("x needs each sequence's [T, C] rows contiguous")
    if out.numel():
        block = 1024
        _snake_cl_kernel[(triton.cdiv(t * c, block), bsz)](
            x, a.contiguous(), inv.contiguous(), out, t * c, c, x.stride(0), out.stride(0),
            PRECISE=x.is_cuda, BLOCK=block, num_warps=4, enable_fp_fusion=False)
    return out
