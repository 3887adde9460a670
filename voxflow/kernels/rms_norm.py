"""Fused RMSNorm (and residual-add + RMSNorm) in one Triton kernel, with the reference numerics.

The torch reference (voxflow/layers/rms_norm.py) is ~7 kernels: cast, square, mean, add eps, rsqrt, scale,
cast back, weight multiply. Here one program normalises one row (the whole row sits in registers: hidden 2048
or head_dim 128), in the same order: fp32 statistics, x * rsqrt(mean(x^2) + eps) in fp32, rounded to the input
dtype, and only then multiplied by the weight in the output dtype (promote(x, weight), as `weight * y` gives).

Against the reference (tests/test_kernels_elementwise.py, tests/gpu/test_gpu_kernels_elementwise.py) the only
freedom left is the order of the fp32 sum of squares (a tree here, torch's own vectorised order there), which
moves the mean of squares by up to 2 ulp. Measured on an H200 (8192 random rows): width 128 bit-exact; widths
1024/2048 fp32 84% bit-equal and within 5 ulp (tests allow 8, ~1e-6 relative); bf16 all but a handful of
elements bit-equal, within 2 ulp (tests allow 2). The CPU interpreter gives about the same.

`round_to` lives here and is shared by the other element-wise kernels (rotary, silu_mul).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MAX_COLS = 32768     # whole row in registers; wider rows stay on the reference path


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """fp32 `x` rounded to DTYPE's precision (nearest, ties to even), still held as fp32.

    Kernels compute in fp32 and call this wherever torch would store an intermediate in the activation dtype,
    so the rounding steps match the reference. bf16 is rounded with integer arithmetic rather than `.to()`:
    it is exactly the round-to-nearest-even torch uses, and Triton's CPU interpreter truncates on `.to()`.
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        bits = (bits >> 16) << 16
        rounded = bits.to(tl.float32, bitcast=True)
        return tl.where(x != x, x, rounded)    # keep NaN a NaN (the carry could wrap its bits)
    elif DTYPE == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


MAX_ROW_FACTOR_WIDTH = 4096   # `row_factor` holds a whole row in registers


@triton.jit
def row_factor(row_ptr, width, inv_width, eps, BLOCK: tl.constexpr):
    """rsqrt(mean(x^2) + eps) of one row (fp32 statistics, the mean as sum * fl(1/width) like the kernel below and
    torch's CUDA mean): the factor of an RMSNorm folded into the GEMM that read the row (voxflow/layers/
    folded_norms.py). BLOCK >= width, a power of two."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(row_ptr + offs, mask=offs < width, other=0.0).to(tl.float32)
    return tl.math.rsqrt(tl.sum(x * x, axis=0) * inv_width + eps)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, scale_ptr,
                     x_row_stride, res_row_stride, out_row_stride, sum_row_stride,
                     n_cols, inv_n, eps,
                     HAS_RESIDUAL: tl.constexpr, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    in_dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        # x + residual in the activation dtype, as `x = x + attn(...)` computes it, before it is normalised.
        r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_SCALE:
            # a LayerScale'd branch: scale * x rounded first, as the separate multiply stores it
            x = round_to(tl.load(scale_ptr + cols, mask=mask, other=0.0).to(tl.float32) * x, in_dtype)
        x = round_to(x + r, in_dtype)
        tl.store(sum_ptr + row * sum_row_stride + cols, x.to(sum_ptr.dtype.element_ty), mask=mask)
    # torch's mean is sum * fl(1/n) on CUDA (sum / n on CPU); identical for the power-of-two widths we use.
    mean_sq = tl.sum(x * x, axis=0) * inv_n
    y = round_to(x * tl.math.rsqrt(mean_sq + eps), in_dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out_dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + row * out_row_stride + cols, round_to(y * w, out_dtype).to(out_dtype), mask=mask)


def supported(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None,
              scale: torch.Tensor | None = None) -> bool:
    """Whether the kernel computes exactly what the reference would for these inputs (else: use the reference).
    scale (with a residual): [N] in x's dtype, the branch x's LayerScale."""
    if x.dtype not in _DTYPES or weight.dtype not in _DTYPES or x.dim() == 0:
        return False
    if weight.shape != (x.shape[-1],) or weight.device != x.device or x.shape[-1] > _MAX_COLS:
        return False
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype
                                 or residual.device != x.device):
        return False
    if scale is not None and (residual is None or scale.shape != (x.shape[-1],) or scale.dtype != x.dtype
                              or scale.device != x.device):
        return False
    # No backward here: anything autograd must see goes through the reference.
    tensors = tuple(t for t in (x, weight, residual, scale) if t is not None)
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> a [rows, N] view with unit column stride (a copy only when no such view exists)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
            scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    summed = torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else None
    if x.numel() == 0:
        return out, summed
    x2 = _rows(x)
    r2 = _rows(residual) if residual is not None else x2
    s2 = summed.view(-1, n) if summed is not None else x2
    out2 = out.view(-1, n)
    block = triton.next_power_of_2(n)
    # 128 columns: one warp; 2048: eight. Latency-bound either way; more warps only idle.
    num_warps = max(1, min(8, block // 256))
    w = weight.contiguous()
    _rms_norm_kernel[(x2.shape[0],)](
        x2, r2, w, out2, s2, scale.contiguous() if scale is not None else w,     # (not read without HAS_SCALE)
        x2.stride(0), r2.stride(0), out2.stride(0), s2.stride(0),
        n, 1.0 / n, eps,
        HAS_RESIDUAL=residual is not None, HAS_SCALE=scale is not None, BLOCK=block, num_warps=num_warps,
        enable_fp_fusion=False)   # no fma contraction: the reference rounds every product
    return out, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of `x` (any leading shape, any strides); result is contiguous."""
    return _launch(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass; the sum is rounded to x's dtype as torch does. scale [N]:
    x is a LayerScale'd branch, scale * x (rounded) is what is added."""
    out, summed = _launch(x, residual, weight, eps, scale)
    return out, summed
