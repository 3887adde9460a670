"""Zeroed int32 counters for kernels whose last-arriving program finishes a reduction (split-K style): each
program adds 1 after storing its partial, the one that sees the others all in combines the partials, and resets
the counter to 0 for the next launch. One buffer per (kernel kind, device, size), made on first use (normally the
warm-up call before a CUDA-graph capture, so a captured graph holds its address); launches of one kind must not
overlap on two streams (the engine runs each kind on one stream).
"""
from __future__ import annotations

import torch

_COUNTERS: dict = {}


def arrival_counters(kind: str, device: torch.device, n: int) -> torch.Tensor:
    """int32 [n] zeros for kernels of `kind`, kept (each launch leaves them at 0 again)."""
    key = (kind, str(device), n)
    counters = _COUNTERS.get(key)
    if counters is None:
        counters = _COUNTERS[key] = torch.zeros(n, dtype=torch.int32, device=device)
    return counters
