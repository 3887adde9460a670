"""SwiGLU feed-forward block of Qwen3: down(silu(gate(x)) * up(x)), no biases.

On CUDA (kernel switch on) silu(gate) * up is one Triton kernel (voxflow/kernels/silu_mul.py, same rounding);
everywhere else the torch expression runs unchanged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from voxflow.kernels import use_kernels


class SwiGLU(nn.Module):
    """State dict: `gate_proj.weight`, `up_proj.weight`, `down_proj.weight`."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if use_kernels(gate):
            from voxflow.kernels import silu_mul as fused   # imported lazily: CPU runs never load Triton code
            if fused.supported(gate, up):
                return self.down_proj(fused.silu_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)
