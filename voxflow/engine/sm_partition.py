"""A CUDA stream whose kernels run on a fixed share of the GPU's SMs (a CUDA green context), for a stage that should
leave the rest of the GPU to another.

Why: the codec decodes on its own stream beside the talker, and its large convolution grids take every SM while the
talker's small per-frame kernels wait for one. At c=64 on an H200 the steps that also launch codec work took
10.6-11 ms against ~6 for the others (0.6B, session 20-21 step traces). A stream priority (the talker ahead) and a
capped convolution grid did not help (sessions 8, 11, 21): a running block keeps its SM until it ends. A green
context confines the codec's blocks to its SMs, so the talker always finds the others free. Off by default: an
experiment until an H200 A/B shows the trade (the codec on fewer SMs takes longer per call) pays.

The driver rounds a partition to its granularity (8 SMs on Hopper). PyTorch exposes green contexts from 2.9 when
built against CUDA >= 12.8; elsewhere asking for a partition is an error, not a silent fallback.
"""
from __future__ import annotations

import torch


class SMPartitionError(RuntimeError):
    """A partition was asked for where green contexts are not available, or with an impossible size."""


def partitioned_stream(device: torch.device, num_sms: int) -> tuple[torch.cuda.Stream, object]:
    """(a stream on `device` whose kernels use at most `num_sms` SMs, the green context that owns it: keep it alive
    as long as the stream is used)."""
    if device.type != "cuda":
        raise SMPartitionError(f"an SM partition needs a CUDA device, not {device}")
    total = torch.cuda.get_device_properties(device).multi_processor_count
    if not 0 < num_sms < total:
        raise SMPartitionError(f"an SM partition takes 1..{total - 1} of this GPU's {total} SMs, not {num_sms}")
    green = getattr(torch.cuda, "GreenContext", None)
    if green is None or not getattr(torch.cuda.green_contexts, "SUPPORTED", False):
        raise SMPartitionError(f"this PyTorch ({torch.__version__}) has no CUDA green contexts: no SM partition")
    index = device.index if device.index is not None else torch.cuda.current_device()
    context = green.create(num_sms=num_sms, device_id=index)
    if not hasattr(context, "Stream"):
        raise SMPartitionError(f"this PyTorch's ({torch.__version__}) green contexts make no streams: no SM partition")
    return context.Stream(), context
