"""The codec's last convolution (Cin -> one channel, k taps) over channels-last rows, as a bandwidth-bound Triton
kernel: no tensor-core tile, each output sample a k x Cin dot product summed on the CUDA cores.

Why: on the implicit-GEMM kernel (causal_conv.py) this layer multiplies 16-column tiles of which one column is
real, and for 96 input channels its 64-channel k blocks load a third zeros: 273 us of a 16-stream 25-frame call
(768k rows x 96 channels, 1 GFLOP; H100, 64 SMs, benchmarks/results/h100/2026-12-06-session54), where reading its
147 MB of input once takes ~75 us. Here a program takes BLOCK_T output rows of one sequence and, per tap, loads
those rows shifted by the tap's offset in BLOCK_C-channel slices (96 = 3 x 32: nothing masked): the taps' loads of
one tile overlap, so the k-fold re-reads come from L1 / L2 and DRAM sees the input about once.

Numerics: products and sums in fp32 (bf16 / fp16 products are exact in fp32), the sum rounded to the activation
dtype as the stored convolution, then + bias rounded: the rounding points of conv1d_channels_last's epilogue. Only
the summation order differs from it (and from cuDNN): fp32 inputs are not reduced to TF32 here.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels.causal_conv import _DTYPES, _unit_channel_stride
from voxflow.kernels.rms_norm import round_to


@triton.jit
def _one_channel_conv_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, T, x_sb, x_st, out_sb, out_st,
                             CIN: tl.constexpr, KSIZE: tl.constexpr, DILATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                             EVEN_C: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(1).to(tl.int64)
    t0 = tl.program_id(0) * BLOCK_T
    cs = tl.arange(0, BLOCK_C)
    t = t0 + tl.arange(0, BLOCK_T)
    row_ok = (t < T)[:, None]
    # 32-bit offsets within the tile from one scalar base a (tap, slice): [BLOCK_T, BLOCK_C] tensors of 64-bit
    # pointers, one kept for each slice the loop unrolls, took 251 registers a thread
    offs = tl.arange(0, BLOCK_T)[:, None] * x_st + cs[None, :]
    base = x_ptr + b * x_sb + t0.to(tl.int64) * x_st
    # one [BLOCK_T, BLOCK_C] fp32 accumulator of products, reduced over channels once at the end
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in range(KSIZE):
        for c0 in range(0, CIN, BLOCK_C):
            tile = base + (j * DILATION * x_st + c0)
            if EVEN_C:
                xv = tl.load(tile + offs, mask=row_ok, other=0.0)
                wv = tl.load(w_ptr + j * CIN + c0 + cs)
            else:
                c_ok = c0 + cs < CIN
                xv = tl.load(tile + offs, mask=row_ok & c_ok[None, :], other=0.0)
                wv = tl.load(w_ptr + j * CIN + c0 + cs, mask=c_ok, other=0.0)
            acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    dtype = out_ptr.dtype.element_ty
    y = round_to(tl.sum(acc, axis=1), dtype)                        # the bias-less convolution, as stored
    if HAS_BIAS:
        y = round_to(y + tl.load(bias_ptr).to(tl.float32), dtype)
    tl.store(out_ptr + b * out_sb + t.to(tl.int64) * out_st, y.to(dtype), mask=t < T)


def channel_block(cin: int) -> tuple[int, bool]:
    """The channel slice a load takes: the widest of 64 / 32 / 16 that divides cin (96 -> 32, nothing masked),
    else 32 with the last slice masked -> (BLOCK_C, EVEN_C)."""
    for block in (64, 32, 16):
        if cin % block == 0:
            return block, True
    return 32, False


# (BLOCK_T, warps): the default launch. benchmarks/scripts/tune_one_channel_conv.py on an H100's 64 SMs (16 streams x
# 25 frames, session 55): 128 rows / 4 warps 160.4 us (920 GB/s of input), as fast as any (256 / 4: 159.3, but 72
# bytes of spill a thread, compile_check; 128 / 8: 167.0), against 291.7 us on the implicit GEMM.
LAUNCH = (128, 4)


def conv1d_to_one_channel(x: torch.Tensor, weight_packed: torch.Tensor, bias: torch.Tensor | None,
                          dilation: int = 1, launch: tuple[int, int] | None = None) -> torch.Tensor:
    """Valid convolution to one channel over channels-last rows: x [B, T + (k-1)*dilation, Cin] (already
    left-padded; each row's channels contiguous), weight_packed [k, 1, Cin] (causal_conv.pack_weight's layout),
    bias [1] or None -> [B, T, 1], a new contiguous tensor in x's dtype. launch: (BLOCK_T, warps), LAUNCH when
    None."""
    if x.dim() != 3 or x.dtype not in _DTYPES or not _unit_channel_stride(x):
        raise ValueError(f"x must be [B, T, Cin] fp32 / bf16 / fp16 with a unit channel stride, got "
                         f"{tuple(x.shape)} {x.dtype}")
    bsz, rows_in, cin = x.shape
    if weight_packed.dim() != 3 or weight_packed.shape[1:] != (1, cin) or not weight_packed.is_contiguous():
        raise ValueError(f"weight_packed must be a contiguous [k, 1, {cin}], got {tuple(weight_packed.shape)}")
    if bias is not None and bias.numel() != 1:
        raise ValueError(f"bias must hold one value, got {tuple(bias.shape)}")
    k = weight_packed.shape[0]
    t = rows_in - (k - 1) * dilation
    if t < 0:
        raise ValueError(f"{rows_in} input rows hold no output of a {k}-tap, dilation-{dilation} convolution")
    out = torch.empty((bsz, t, 1), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    block_t, warps = launch or LAUNCH
    block_c, even_c = channel_block(cin)
    _one_channel_conv_kernel[(triton.cdiv(t, block_t), bsz)](
        x, weight_packed, bias if bias is not None else weight_packed, out, t, x.stride(0), x.stride(1),
        out.stride(0), out.stride(1), CIN=cin, KSIZE=k, DILATION=dilation, HAS_BIAS=bias is not None, EVEN_C=even_c,
        BLOCK_T=block_t, BLOCK_C=block_c, num_warps=warps,
        enable_fp_fusion=True)          # (products added by FMA: exact fp16 / bf16 products either way; fp32 closer)
    return out
