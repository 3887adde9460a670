"""A CUDA stream whose kernels may use only part of the GPU's SMs (a CUDA green context), for the codec.

Why: on the H200 the codec's convolutions and the talker's per-frame step do not overlap. A codec call's kernels
fill every SM with thread blocks, and each of the talker step's ~800 small kernels waits for SMs to free up, so
at c=64 the six steps after a 64 x 25-frame codec launch took 125 ms instead of 6 x 7 (session-8 step trace); a
higher stream priority did not change that (it orders waiting blocks, it cannot take back an SM). A green context
confines the codec to `num_sms` SMs: the rest are always free for the talker, which still uses every SM when the
codec is idle. The codec then runs beside the talker, somewhat slower than with the whole GPU.

The partition comes from the CUDA driver API (CUDA 12.4+ drivers) through ctypes, so it does not depend on the
PyTorch version's beta green-context bindings; the stream is handed to PyTorch as an ExternalStream and works
with `torch.cuda.stream(...)` and CUDA graph capture like any other stream. Memory is shared with the primary
context (green contexts partition SMs, not memory). Contexts and streams live as long as the process: there is
one codec per engine process.
"""
from __future__ import annotations

import ctypes
import logging

import torch

log = logging.getLogger(__name__)

_CU_DEV_RESOURCE_TYPE_SM = 1
# Split so that the partition can run thread-block clusters of the largest size the hardware allows: Hopper's
# TF32 / bf16 cuBLAS GEMMs launch clusters, and on a partition split with the default flags (0) the codec's first
# TF32 GEMM failed with CUBLAS_STATUS_EXECUTION_FAILED (session 8, H200) while plain fp32 ones ran.
SPLIT_MAX_CLUSTER = 0x2
_CU_GREEN_CTX_DEFAULT_STREAM = 0x1
_CU_STREAM_NON_BLOCKING = 0x1
# CUdevResource is {type (4 bytes), 92 bytes of padding, a union whose first member is the SM resource's smCount,
# ...}; its size grew between CUDA versions, so every struct the driver fills gets a zeroed buffer larger than any.
_RESOURCE_BYTES = 1024
_SM_COUNT_OFFSET = 96

_keep_alive: list = []          # green contexts behind live streams: never destroyed while the process runs


class SMPartitionError(RuntimeError):
    pass


def _driver():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise SMPartitionError(f"cannot load the CUDA driver (libcuda.so.1): {e}") from e


def _call(lib, name: str, *args) -> None:
    fn = getattr(lib, name, None)
    if fn is None:
        raise SMPartitionError(f"this CUDA driver has no {name} (green contexts need a CUDA 12.4+ driver)")
    rc = fn(*args)
    if rc != 0:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(rc, ctypes.byref(msg))
        raise SMPartitionError(f"{name} failed: CUDA error {rc} ({(msg.value or b'?').decode()})")


def check_num_sms(num_sms: int) -> None:
    """Reject a nonsensical SM count before anything is loaded (the device's own limits are checked later)."""
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1:
        raise ValueError(f"codec_sms must be a positive number of SMs, got {num_sms!r}")


def partitioned_stream(device: torch.device, num_sms: int, split_flags: int = SPLIT_MAX_CLUSTER
                       ) -> tuple[torch.cuda.Stream, int]:
    """A stream on `device` confined to a partition of at least `num_sms` SMs; returns it and the partition's
    actual SM count (the driver rounds up to its granularity, e.g. 8 SMs on Hopper). `split_flags`: the driver's
    CU_DEV_SM_RESOURCE_SPLIT_* flags (benchmarks/scripts/probe_sm_partition.py tries others)."""
    check_num_sms(num_sms)
    if device.type != "cuda":
        raise ValueError(f"codec_sms partitions a GPU's SMs; the codec runs on {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).multi_processor_count
    if num_sms >= total:
        raise ValueError(f"codec_sms={num_sms} leaves no SM to the talker: this GPU has {total}")
    torch.cuda.init()                                   # the primary context exists before the green one
    lib = _driver()
    dev = ctypes.c_int()
    _call(lib, "cuDeviceGet", ctypes.byref(dev), index)
    whole = ctypes.create_string_buffer(_RESOURCE_BYTES)
    _call(lib, "cuDeviceGetDevResource", dev, whole, _CU_DEV_RESOURCE_TYPE_SM)
    part = ctypes.create_string_buffer(_RESOURCE_BYTES)
    rest = ctypes.create_string_buffer(_RESOURCE_BYTES)
    groups = ctypes.c_uint(1)
    _call(lib, "cuDevSmResourceSplitByCount", part, ctypes.byref(groups), whole, rest, split_flags, num_sms)
    if groups.value != 1:
        raise SMPartitionError(f"could not carve {num_sms} SMs out of {total}")
    got = ctypes.c_uint.from_buffer(part, _SM_COUNT_OFFSET).value
    if not num_sms <= got < total:
        raise SMPartitionError(f"asked for {num_sms} SMs of {total}, the driver's partition has {got}")
    desc = ctypes.c_void_p()
    _call(lib, "cuDevResourceGenerateDesc", ctypes.byref(desc), part, 1)
    green = ctypes.c_void_p()
    _call(lib, "cuGreenCtxCreate", ctypes.byref(green), desc, dev, _CU_GREEN_CTX_DEFAULT_STREAM)
    raw = ctypes.c_void_p()
    _call(lib, "cuGreenCtxStreamCreate", ctypes.byref(raw), green, _CU_STREAM_NON_BLOCKING, 0)
    _keep_alive.append((green, raw))
    log.info("codec stream confined to %d of %d SMs (green context)", got, total)
    return torch.cuda.ExternalStream(raw.value, device=torch.device("cuda", index)), got
