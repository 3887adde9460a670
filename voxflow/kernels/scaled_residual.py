"""x + scale * y with a per-channel scale (a LayerScale'd branch added to its residual stream), in one pass.

The codec's frame-rate transformer adds each attention and MLP output to its residual stream through a LayerScale:
two element-wise launches a branch in PyTorch (the multiply, the add), 32 of a codec call's ~290. Here one.

Numerics: the reference's two rounded operations, scale * y rounded to the dtype, then x + that rounded, fp32
arithmetic in between and no fma contraction: the same bits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels.rms_norm import round_to

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _scaled_residual_kernel(x_ptr, y_ptr, scale_ptr, out_ptr, N, C, BLOCK: tl.constexpr):
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = e < N
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + e, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + e, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(scale_ptr + e % C, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + e, round_to(x + round_to(s * y, dtype), dtype).to(dtype), mask=mask)


def supported(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor) -> bool:
    """x and y contiguous, of one shape, dtype and device; scale [C] (x's last dimension) in that dtype; no autograd
    graph to record."""
    return (x.shape == y.shape and x.dim() >= 1 and x.is_contiguous() and y.is_contiguous() and x.dtype in _DTYPES
            and y.dtype == x.dtype == scale.dtype and scale.shape == (x.shape[-1],) and x.device == y.device
            == scale.device and not (torch.is_grad_enabled() and any(t.requires_grad for t in (x, y, scale))))


def scaled_residual(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x + scale * y (scale broadcast over the last dimension) -> a new tensor like x."""
    out = torch.empty_like(x)
    if out.numel():
        block = 1024
        _scaled_residual_kernel[(triton.cdiv(x.numel(), block),)](
            x, y, scale.contiguous(), out, x.numel(), x.shape[-1], BLOCK=block, num_warps=4,
            enable_fp_fusion=False)
    return out
