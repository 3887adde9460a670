"""RMSNorm with the reference numerics of Qwen3 / Qwen3-TTS.

The statistics and the normalisation run in fp32 whatever the activation dtype; the result is cast back
to the input dtype *before* the weight multiply. Doing the multiply in fp32 (or casting after it) gives
different bf16 results, and the code predictor is known to be sensitive to such drift.
"""
from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    in_dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(in_dtype)


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
