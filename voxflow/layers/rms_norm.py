"""RMSNorm with the reference numerics of Qwen3 / Qwen3-TTS.

The statistics and the normalisation run in fp32 whatever the activation dtype; the result is cast back
to the input dtype *before* the weight multiply. Doing the multiply in fp32 (or casting after it) gives
different bf16 results, and the code predictor is known to be sensitive to such drift.

On CUDA (kernel switch on) the fused Triton kernel of voxflow/kernels/rms_norm.py computes the same thing in
one launch; everywhere else the torch code below runs unchanged.
"""
from __future__ import annotations

import torch
from torch import nn

from voxflow.kernels import use_kernels


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_kernels(x):
        from voxflow.kernels import rms_norm as fused   # imported lazily: CPU runs never load Triton code
        if fused.supported(x, weight):
            return fused.rms_norm(x, weight, eps)
    in_dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(in_dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the residual add fused into the norm where the kernel runs.

    The decoder layers use it for each residual add and the norm after it: the post-attention one, and the MLP's
    into the next layer's input norm or the stack's final norm (a + b == b + a: the residual is unchanged).
    scale [N]: the branch x goes through a LayerScale first (the codec's transformer): scale * x is added.
    """
    if use_kernels(x):
        from voxflow.kernels import rms_norm as fused
        if fused.supported(x, weight, residual, scale):
            return fused.add_rms_norm(x, residual, weight, eps, scale)
    summed = (x if scale is None else scale * x) + residual
    return rms_norm(summed, weight, eps), summed


class RMSNorm(nn.Module):
    """Normalises over the last dimension; state dict: `weight`."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
