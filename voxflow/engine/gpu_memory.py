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

import ctypes

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
    """What the engine reports (startup and stats): the allocator's own peak of tensors and reservation now, the
    footprint, and the allocator's retries and device allocations so far."""
    return {"peak_gpu_memory_bytes": torch.cuda.max_memory_allocated(device),
            "gpu_memory_reserved_bytes": torch.cuda.memory_reserved(device), **footprint(device),
            **(allocator_events(device) or {})}


def allocator_events(device: torch.device) -> dict | None:
    """The caching allocator's counts so far of what stalls the host beside a step (None off CUDA):
    `alloc_retries`, cudaMallocs that failed so that the allocator freed its cached blocks (synchronizing the
    device) and tried again, the sign of a step near the memory limit; `cuda_mallocs`, the device allocations
    themselves (cudaMalloc or cuMemMap, synchronous: none is expected once the graphs hold their pools); and
    `cuda_frees`. The nested form: no flattening of the ~100 other counters."""
    if device.type != "cuda":
        return None
    s = torch.cuda.memory_stats_as_nested_dict(device)
    return {"alloc_retries": int(s.get("num_alloc_retries", 0)), "cuda_mallocs": int(s.get("num_device_alloc", 0)),
            "cuda_frees": int(s.get("num_device_free", 0))}


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


# ---- the per-thread stack limit: the driver's local-memory reservation ------------------------------------------
# The driver reserves local memory once per context: the largest per-thread stack any launched kernel has needed,
# for every thread the GPU can hold at once (on an H200 132 SMs x 2,048 threads), and it never shrinks on its own.
# One kernel that needs ~5 KB a thread holds ~1.1 GiB from then on (session 20 call 1, the 0.6B engine: grown while
# the weights loaded and the codec's fp16 check ran). Setting the limit back releases it. PyTorch has no call for
# it, so the CUDA runtime PyTorch loaded is called directly (found in the process's memory map).
STACK_SIZE_LIMIT = 0            # cudaLimitStackSize
_runtime: list = []             # [the runtime library, or None where it cannot be found], once looked up


def _cudart():
    """PyTorch's CUDA runtime, as mapped into this process (the one whose current device PyTorch sets): the
    libcudart of PyTorch's CUDA major version where several are loaded."""
    if not _runtime:
        lib = None
        try:
            with open("/proc/self/maps") as f:
                paths = sorted({line.split()[-1] for line in f if "libcudart.so" in line})
            major = (torch.version.cuda or "").split(".")[0]
            # (the mapped file may be the versioned one a symlink names: libcudart.so.13.0.96)
            ours = [p for p in paths if major and p.rsplit("/", 1)[-1].startswith(f"libcudart.so.{major}")] or paths
            if ours:
                lib = ctypes.CDLL(ours[0])
                lib.cudaDeviceGetLimit.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
                lib.cudaDeviceGetLimit.restype = ctypes.c_int
                lib.cudaDeviceSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
                lib.cudaDeviceSetLimit.restype = ctypes.c_int
        except (OSError, AttributeError):
            lib = None
        _runtime.append(lib)
    return _runtime[0]


def stack_limit_bytes(device: torch.device) -> int | None:
    """`device`'s per-thread stack limit, or None where there is none to read (not a CUDA device, or the CUDA
    runtime cannot be reached)."""
    lib = _cudart() if device.type == "cuda" else None
    if lib is None:
        return None
    value = ctypes.c_size_t()
    with torch.cuda.device(device):          # the runtime's limits are its current device's
        rc = lib.cudaDeviceGetLimit(ctypes.byref(value), STACK_SIZE_LIMIT)
    return value.value if rc == 0 else None


def set_stack_limit_bytes(device: torch.device, value: int) -> bool:
    """Set `device`'s per-thread stack limit (the driver resizes its local-memory reservation to it); True when it
    was set. Only before CUDA graphs are captured: graphs captured before hold the old reservation (a replay after
    the reset failed with an unspecified launch failure, session 20 call 1)."""
    lib = _cudart()
    if lib is None:
        return False
    with torch.cuda.device(device):
        return lib.cudaDeviceSetLimit(STACK_SIZE_LIMIT, value) == 0


def shrink_stack_to(device: torch.device, value: int | None) -> dict | None:
    """Put `device`'s stack limit back to `value` (read before a one-off step that grew it) when it grew; returns
    what was done for the startup record ({"from", "to", "freed_bytes"}), None when nothing was."""
    if value is None or device.type != "cuda":
        return None
    grown = stack_limit_bytes(device)
    if grown is None or grown <= value:
        return None
    torch.cuda.synchronize(device)
    before = outside_allocator_bytes(device)
    if not set_stack_limit_bytes(device, value):
        return None
    return {"from": grown, "to": value, "freed_bytes": before - outside_allocator_bytes(device)}
