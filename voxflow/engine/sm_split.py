"""Two disjoint SM partitions of one GPU from one driver split (two CUDA green contexts): the codec's SMs and the
talker's, so that neither stage's blocks ever wait for an SM the other holds.

Why: sm_partition.py confines the codec to N SMs, but the talker still runs on the whole GPU: when the codec is
busy, a talker block may be placed on one of the codec's SMs and wait there behind its convolution blocks (0.6B
c=64 on an H200, session 23: steps that overlap codec work take 7.6-7.9 ms against 5.84 for the others). PyTorch's
GreenContext.create makes one partition at a time, each from the whole device, so two of them may share SMs. The
driver's split (cuDevSmResourceSplitByCount) returns a group of N SMs and the remainder, disjoint; each becomes a
green context with its own stream. Kernels captured into a CUDA graph on such a stream keep its partition on replay.

Experimental and off by default: `VOXFLOW_TALKER_SMS=rest` turns it on (the codec takes its `codec_sms` share from
the split, the talker the rest). It needs NVIDIA's driver API bindings, the `cuda-bindings` package.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .sm_partition import SMPartitionError

ENV = "VOXFLOW_TALKER_SMS"


def rest_enabled() -> bool:
    """Whether the talker is to run on the SMs the codec's partition leaves (`VOXFLOW_TALKER_SMS=rest`); any other
    value is an error rather than silently the whole GPU."""
    value = os.environ.get(ENV, "").strip().lower()
    if value not in ("", "rest", "none"):
        raise SMPartitionError(f'{ENV} is "rest" (the talker on the SMs the codec leaves) or unset, not {value!r}')
    return value == "rest"


@dataclass(frozen=True)
class Split:
    first: torch.cuda.Stream        # a stream on the group of `first_sms` SMs (the codec's)
    rest: torch.cuda.Stream         # a stream on the remaining `rest_sms` SMs (the talker's)
    first_sms: int
    rest_sms: int
    contexts: tuple                 # the two green contexts: alive as long as their streams are used


_splits: dict[tuple[int, int], Split] = {}
_split_stream_ids: set[int] = set()


def split(device: torch.device, first_sms: int) -> Split:
    """The split of CUDA `device` into `first_sms` SMs (rounded up by the driver to its granularity) and the rest;
    made once per (device, count), so the codec runner and the engine get the same two streams."""
    if device.type != "cuda":
        raise SMPartitionError(f"an SM split needs a CUDA device, not {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, int(first_sms))
    if key in _splits:
        return _splits[key]
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise SMPartitionError(f"{ENV}=rest needs NVIDIA's driver API bindings: pip install cuda-bindings") from e
    call = _Caller(driver)
    torch.cuda.init()                                       # the primary context first: PyTorch's allocations
    call("cuInit", 0)
    dev = call("cuDeviceGet", index)
    whole = call("cuDeviceGetDevResource", dev, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)
    groups, count, remaining = call("cuDevSmResourceSplitByCount", 1, whole, 0, int(first_sms))
    if count < 1 or remaining.sm.smCount < 1:
        raise SMPartitionError(f"the driver split {whole.sm.smCount} SMs into no group of {first_sms} and a rest")
    streams, contexts = [], []
    try:
        for resource in (groups[0], remaining):
            desc = call("cuDevResourceGenerateDesc", [resource], 1)
            contexts.append(call("cuGreenCtxCreate", desc, dev,
                                 driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
            handle = call("cuGreenCtxStreamCreate", contexts[-1], driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0)
            streams.append(torch.cuda.ExternalStream(int(handle), device=torch.device("cuda", index)))
    except SMPartitionError:
        for context in contexts:                # nothing half-made stays: a failed split leaves no green context
            driver.cuGreenCtxDestroy(context)
        raise
    made = _splits[key] = Split(streams[0], streams[1], int(groups[0].sm.smCount), int(remaining.sm.smCount),
                                tuple(contexts))
    _split_stream_ids.update(s.cuda_stream for s in streams)
    return made


def is_split_stream(stream: torch.cuda.Stream) -> bool:
    """Whether `stream` is one of a split's streams: CUDA graphs of its work must be captured on it (a capture on
    another stream would record the kernels outside the partition)."""
    return getattr(stream, "cuda_stream", None) in _split_stream_ids


class _Caller:
    """Calls a driver function by name; a result other than CUDA_SUCCESS raises SMPartitionError naming the call."""

    def __init__(self, driver):
        self.driver = driver

    def __call__(self, name: str, *args):
        err, *values = getattr(self.driver, name)(*args)
        if err != self.driver.CUresult.CUDA_SUCCESS:
            raise SMPartitionError(f"{name} failed: {getattr(err, 'name', err)}")
        return values[0] if len(values) == 1 else tuple(values)
