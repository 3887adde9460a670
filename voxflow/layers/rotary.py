"""Rotary position embedding (rotate-half convention, as in Qwen3).

The talker's config asks for an interleaved multimodal RoPE ("MRoPE", three position rows). Text-only
TTS always feeds three identical rows, so every frequency slot reads the same position and the result is
exactly this plain 1-D RoPE over the whole head dimension.

cos/sin are computed in fp32 (autocast off) and only then cast to the activation dtype, as the reference
does; computing them in bf16 loses precision at large positions.

On CUDA (kernel switch on) `apply_rotary` runs the one-launch Triton kernel of voxflow/kernels/rotary.py, which
keeps the reference's rounding order and so returns the same bits; everywhere else the torch code runs.
"""
from __future__ import annotations

import torch
from torch import nn

from voxflow.kernels import use_kernels


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    # Same expression order as the reference "default" RoPE init, so the fp32 values are bit-identical.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


class RotaryEmbedding(nn.Module):
    """Produces (cos, sin) of shape [B, S, head_dim] for integer positions [B, S].

    `inv_freq` is a non-persistent buffer: it is derived from the config and never in a checkpoint.
    """

    def __init__(self, head_dim: int, theta: float, max_positions: int | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.max_positions = max_positions
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta), persistent=False)
        self._tables: dict[tuple, torch.Tensor] = {}

    @torch.no_grad()
    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.is_cuda and self.max_positions:
            # On a GPU, a lookup into a table computed once (by the very same ops, so the same bits) costs one
            # gather (cos and sin side by side in one table) instead of ~7 kernels per call; the talker's decode
            # step calls this once, on its critical path at c=1 (two gathers there before: ~4 us with their gap).
            # Positions are < max_position_embeddings by construction (the engine's max_model_len is smaller).
            table = self._table(positions.device, dtype)
            if table is not None:
                return self.lookup(table, positions)
        return self._compute(positions, dtype)

    @staticmethod
    def lookup(table: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [*positions.shape, D] of a table [2 (cos, sin), P, D]: one gather, both contiguous."""
        both = table.index_select(1, positions.reshape(-1)).view(2, *positions.shape, table.shape[-1])
        return both[0], both[1]

    @torch.no_grad()
    def prefix(self, n: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [1, n, D] of positions 0..n-1: views of the GPU table when there is one (no kernel at all),
        else computed. For callers whose positions are the same small range every time (the code predictor)."""
        table = self._table(device, dtype) if device.type == "cuda" and self.max_positions else None
        if table is not None and n <= table[0].shape[0]:
            return table[0][None, :n], table[1][None, :n]
        return self._compute(torch.arange(n, device=device)[None], dtype)

    def _table(self, device: torch.device, dtype: torch.dtype):
        key = (str(device), dtype)
        if key not in self._tables:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return None                   # never allocate inside a graph capture: compute directly
            positions = torch.arange(self.max_positions, device=device)
            self._tables[key] = torch.stack(self._compute(positions, dtype))        # [2 (cos, sin), P, D]
        return self._tables[key]

    def _compute(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inv_freq.device.type == "meta":
            # Built on the meta device and loaded from a checkpoint: derived buffers are not loaded.
            self.inv_freq = rope_inv_freq(self.head_dim, self.theta).to(positions.device)
        inv_freq = self.inv_freq.to(positions.device)
        device_type = positions.device.type if positions.device.type != "mps" else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            # An outer product; a K=1 matmul and a broadcast multiply give the same fp32 numbers.
            freqs = positions.to(torch.float32)[..., None] * inv_freq.to(torch.float32)
            angles = torch.cat((freqs, freqs), dim=-1)
            cos, sin = angles.cos(), angles.sin()
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, Hq, S, D], k [B, Hkv, S, D]; cos/sin [B, S, D] (broadcast over heads)."""
    if use_kernels(q):
        from voxflow.kernels import rotary as fused   # imported lazily: CPU runs never load Triton code
        if fused.supported(q, k, cos, sin):
            return fused.apply_rotary(q, k, cos, sin)
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
