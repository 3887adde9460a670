"""Host data to the GPU without stalling the host on the GPU's queue.

`torch.tensor(ids, device="cuda")` or `cpu_tensor.to("cuda")` is a BLOCKING copy: PyTorch synchronises the current
stream after it, so the host waits for every kernel already queued there (on a serving engine: the decode step in
flight, 5-10 ms). Staged through pinned memory with `non_blocking=True` the copy is queued behind that work instead
and the host returns at once; the caching host allocator keeps the pinned block until the copy has run.
On a CPU device these are plain conversions.
"""
from __future__ import annotations

from typing import Sequence

import torch


def to_device(t: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`t` on `device` (and in `dtype`); a host tensor goes to a CUDA device through pinned memory, asynchronously."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.pin_memory().to(device, non_blocking=True)
    return t.to(device=device, dtype=dtype)


def tensor_to(values: Sequence, device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`torch.tensor(values, dtype=dtype, device=device)` without the blocking copy."""
    return to_device(torch.tensor(values, dtype=dtype), device)
