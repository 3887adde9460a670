"""The torch reference of the skinny decode GEMM (voxflow/kernels/skinny_linear.py), shared by its CPU and GPU
tests: the unfused expression the kernel replaces, in the same dtype, plus an fp32 result and an error scale."""
from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-6


def reference(x, w, *, bias=None, residual=None, norm_weight=None, gated=False):
    """(same-dtype result, fp32 result from the same-dtype GEMM input, the element-wise error scale)."""
    if norm_weight is not None:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)
        a = norm_weight * x32.to(x.dtype)
    elif gated:
        gate, up = x.chunk(2, dim=-1)
        a = F.silu(gate) * up
    else:
        a = x
    y = F.linear(a, w, bias)                     # the bias inside the GEMM's epilogue: one rounding
    y32 = F.linear(a.float(), w.float(), bias.float() if bias is not None else None)
    scale = a.float().abs() @ w.float().abs().t()
    if bias is not None:
        scale = scale + bias.float().abs()
    if residual is not None:
        y, y32, scale = residual + y, residual.float() + y32, scale + residual.float().abs()
    return y, y32, scale
