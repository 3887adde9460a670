"""SwiGLU feed-forward block of Qwen3: down(silu(gate(x)) * up(x)), no biases.

On CUDA (kernel switch on) gate and up are one GEMM over a fused weight (fused_linear.py) and silu(gate) * up is
one Triton kernel reading the two halves of its output (voxflow/kernels/silu_mul.py, same rounding); everywhere
else the torch expression runs unchanged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from voxflow.kernels import use_kernels
from voxflow.layers.fused_linear import fuse_weights, kept_fused


class SwiGLU(nn.Module):
    """State dict: `gate_proj.weight`, `up_proj.weight`, `down_proj.weight`."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self._gate_up = fuse_weights([self.gate_proj, self.up_proj])   # made here: see Qwen3Attention._qkv

    def fused_groups(self) -> dict[str, list[nn.Linear]]:
        """Fused weight attribute -> the Linears whose weights are views of it (fused_linear.cast_fused_groups)."""
        return {"_gate_up": [self.gate_proj, self.up_proj]}

    def fused_gate_up(self) -> torch.Tensor | None:
        """The fused gate|up weight (fused again if a weight was replaced since; None while a CUDA graph is being
        captured then)."""
        self._gate_up = kept_fused(self._gate_up, [self.gate_proj, self.up_proj])
        return self._gate_up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_kernels(x):
            fused = self.fused_gate_up()
            if fused is not None:
                gate_up = F.linear(x, fused)
                i = self.gate_proj.out_features
                gate, up = gate_up[..., :i], gate_up[..., i:]
            else:
                gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down(gate, up)

    def down(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """down_proj(silu(gate) * up)."""
        if use_kernels(gate):
            from voxflow.kernels import silu_mul as fused   # imported lazily: CPU runs never load Triton code
            if fused.supported(gate, up):
                return self.down_proj(fused.silu_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)
