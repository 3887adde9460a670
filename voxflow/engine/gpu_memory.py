"""The engine's whole GPU footprint, and a cap on it (`EngineConfig.gpu_memory_limit_bytes`).

PyTorch's counters see only its caching allocator: `max_memory_allocated` (tensors) is what earlier results reported
as peak memory, yet the allocator reserves more than it hands out (blocks cached for reuse, CUDA-graph pools), and
the CUDA context, the kernels' modules and the graph executables live outside it. What a user sizing a GPU needs is
the process's total, so the stats report it: device memory in use (the driver's free/total; on a GPU this process
has alone, that is this process) and the peak total, taken as the allocator's peak reservation plus what lies
outside the allocator now (the context and modules, which only grow).

The cap: the allocator's share is set to the limit less what is outside it when the engine starts
(`torch.cuda.set_per_process_memory_fraction`; past it the allocator first frees its cache, then raises
out-of-memory). What the context adds later (kernel modules, graph executables) is not capped but is counted in the
reported total, so a run shows whether it stayed under.
"""
from __future__ import annotations

import torch


def _snapshot(device: torch.device) -> tuple[int, int, int]:
    """(device memory in use, the part of it the caching allocator did not reserve, the device's total), from one
    driver query."""
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    return used, max(0, used - torch.cuda.memory_reserved(device)), total


def outside_allocator_bytes(device: torch.device) -> int:
    """Device memory in use that the caching allocator did not reserve: the CUDA context, loaded kernel modules,
    graph executables, libraries' own buffers (startup records it after each stage: where it grows)."""
    return _snapshot(device)[1]


def room_within(device: torch.device, limit_bytes: int) -> int:
    """Bytes still free under limit_bytes (device memory in use counted against it; >= 0): what a KV pool sized
    from free memory may take when a cap is set."""
    return max(0, limit_bytes - _snapshot(device)[0])


def footprint(device: torch.device) -> dict:
    """Bytes: device_used (the driver's total - free), outside_allocator (device_used - the allocator's
    reservation), peak_reserved, and peak_total = peak_reserved + outside_allocator."""
    used, outside, _ = _snapshot(device)
    peak_reserved = torch.cuda.max_memory_reserved(device)
    return {"gpu_memory_used_bytes": used, "gpu_memory_outside_allocator_bytes": outside,
            "peak_gpu_memory_reserved_bytes": peak_reserved, "peak_gpu_memory_total_bytes": peak_reserved + outside}


def memory_stats(device: torch.device) -> dict:
    """What the engine reports (startup and stats): the allocator's own peak of tensors and reservation now, and
    the footprint."""
    return {"peak_gpu_memory_bytes": torch.cuda.max_memory_allocated(device),
            "gpu_memory_reserved_bytes": torch.cuda.memory_reserved(device), **footprint(device)}


def limit_allocator(device: torch.device, limit_bytes: int) -> int:
    """Cap the caching allocator so that it plus what is already outside it stays within limit_bytes; returns the
    allocator's budget in bytes. Raises ValueError when the limit does not even cover what is outside it."""
    if device.type != "cuda":
        raise ValueError(f"gpu_memory_limit_bytes needs a CUDA device (the engine runs on {device})")
    _, outside, total = _snapshot(device)                  # creates the context if it is not there yet
    budget = limit_bytes - outside
    if budget <= 0:
        raise ValueError(f"gpu_memory_limit_bytes={limit_bytes} is below what the CUDA context already uses "
                         f"({outside} bytes)")
    index = device.index if device.index is not None else torch.cuda.current_device()    # the call needs one
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), index)
    return budget
