"""A valid 1-D convolution to ONE output channel over channels-last rows, in Triton: the codec decoder's last layer
(96 channels -> the waveform, k=7).

Why: causal_conv.py's implicit GEMM runs it as a tensor-core tile of 16 output columns of which one is stored: in a
16-stream, 25-frame fp16 codec call on 64 H100 SMs it took 0.31 ms (~3% of the call's kernel time) to read its
147 MB input, ~0.5 TB/s (benchmarks/results/h100/2026-12-05-session41/call4). The layer is a dot product of each
output row's k input rows with the weight: here a program loads its rows' k shifted [BLOCK_T, C] blocks (the
overlapping rows come from L1 / L2, so DRAM sees the input about once), multiplies them by the weight's taps in
fp32 and sums each row.

Numerics: fp32 products and sums (in another order than the tensor-core kernel's), rounded where torch would store:
the bias-less convolution to the activation dtype, then + bias rounded again (causal_conv.py's rounding points).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels.rms_norm import round_to

MAX_CHANNELS = 256          # one block of channels a row
# Rows a program, warps: 64 x 128 channels on 8 warps, 54 registers a thread on sm_90 (compile_check; 128 rows on 4
# warps spilled). Not tuned on a GPU yet.
BLOCK_T = 64
NUM_WARPS = 8


@triton.jit
def _conv_to_one_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, T, C, x_sb, x_st, out_sb,
                        KSIZE: tl.constexpr, DILATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(1).to(tl.int64)
    tt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cc = tl.arange(0, BLOCK_C)
    row_ok = tt < T
    col_ok = cc < C
    mask = row_ok[:, None] & col_ok[None, :]
    rows = x_ptr + b * x_sb + tt.to(tl.int64)[:, None] * x_st + cc[None, :]
    acc = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for j in tl.static_range(KSIZE):            # each tap's row sums at once: only one [BLOCK_T, C] block is live
        x = tl.load(rows + j * DILATION * x_st, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + j * C + cc, mask=col_ok, other=0.0).to(tl.float32)
        acc += tl.sum(x * w[None, :], axis=1)
    dtype = out_ptr.dtype.element_ty
    y = round_to(acc, dtype)
    if HAS_BIAS:
        y = round_to(y + tl.load(bias_ptr).to(tl.float32), dtype)
    tl.store(out_ptr + b * out_sb + tt, y.to(dtype), mask=row_ok)


def packed_taps(weight: torch.Tensor) -> torch.Tensor:
    """A conv weight [1, C, k] as the kernel reads it: [k, C], contiguous."""
    if weight.dim() != 3 or weight.shape[0] != 1:
        raise ValueError(f"a [1, C, k] weight needed, got {tuple(weight.shape)}")
    return weight[0].t().contiguous()


def supported(x: torch.Tensor) -> bool:
    """x [B, rows, C] with a unit channel stride and C <= MAX_CHANNELS."""
    return x.dim() == 3 and x.stride(2) == 1 and 1 <= x.shape[2] <= MAX_CHANNELS


def conv_to_one_channel(x: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor | None, dilation: int = 1
                        ) -> torch.Tensor:
    """Valid convolution of x [B, T + (k-1)*dilation, C] (unit channel stride, already left-padded) with taps
    [k, C] (`packed_taps`) and bias [1] -> [B, T, 1] in x's dtype."""
    bsz, rows_in, c = x.shape
    k = taps.shape[0]
    if not supported(x) or taps.shape != (k, c) or not taps.is_contiguous():
        raise ValueError(f"x {tuple(x.shape)} (unit channel stride, <= {MAX_CHANNELS} channels) and contiguous "
                         f"[k, {c}] taps needed, got {tuple(taps.shape)}")
    t = rows_in - (k - 1) * dilation
    if t < 0:
        raise ValueError(f"{rows_in} input rows hold no output of a {k}-tap, dilation-{dilation} convolution")
    out = torch.empty(bsz, t, 1, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    _conv_to_one_kernel[(triton.cdiv(t, BLOCK_T), bsz)](
        x, taps, bias if bias is not None else taps, out, t, c, x.stride(0), x.stride(1), out.stride(0),
        KSIZE=k, DILATION=dilation, HAS_BIAS=bias is not None, BLOCK_T=BLOCK_T,
        BLOCK_C=triton.next_power_of_2(c), num_warps=NUM_WARPS,
        enable_fp_fusion=False)       # no fma contraction: the products and sums stay as written
    return out
