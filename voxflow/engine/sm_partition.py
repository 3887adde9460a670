"""A CUDA stream whose kernels run on a fixed share of the GPU's SMs (a CUDA green context), for a stage that should
leave the rest of the GPU to another.

Why: the codec decodes on its own stream beside the talker, and its large convolution grids take every SM while the
talker's small per-frame kernels wait for one. At c=64 on an H200 the steps that also launch codec work took
10.6-11 ms against ~6 for the others (0.6B, session 20-21 step traces). A stream priority (the talker ahead) and a
capped convolution grid did not help (sessions 8, 11, 21): a running block keeps its SM until it ends. A green
context confines the codec's blocks to its SMs, so the talker always finds the others free. The trade: the codec
takes longer per call on fewer SMs. H200 session 22 call 2 (0.6B c=64, one machine): the whole GPU 656 audio-s/s,
96 SMs 681, 64 SMs 698, 48 SMs 663, 32 SMs 640. "auto" (EngineConfig's default) takes half the SMs, 64 of 132
(call 3: 0.6B c=64 664 -> 694, 1.7B c=64 601 -> 634 audio-s/s against the whole GPU; c=1 unchanged).

The talker keeps the whole GPU. Confining it to the SMs the codec leaves (a second green context from one driver
split, so that its blocks never wait on the codec's SMs) was measured slower, because its step time follows its SM
count: 0.6B c=64 steps without codec work took 5.83 ms on 132 SMs, 7.22 on 84, 7.74 on 68 and 9.29 on 52, and the
runs gave 687 (this default) against 616 / 589 / 505 audio-s/s (H200 session 23 call 4; the code is in c9bf07d).

The driver rounds a partition up to its granularity (8 SMs on Hopper: 60 asked run on 64). PyTorch exposes green
contexts from 2.9 when built against CUDA >= 12.8. Where there are none (or the driver refuses one), an asked count
is an error, never a silent fallback; "auto" falls back to the whole GPU with a warning: a default must not stop a
server. "auto" is also the whole GPU on GPUs of fewer than AUTO_MIN_SMS SMs: the share was measured on an H200 only,
and on a small GPU half the SMs may be too few for the codec's work (32 of 132 already lost: 640 audio-s/s).
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

AUTO_SHARE = 0.5      # of the GPU's SMs for "auto" (the best of 32/48/64/96 of 132 measured, above)
GRANULARITY = 8       # SMs: the driver's partition step on Hopper; "auto" rounds down to it
AUTO_MIN_SMS = 100    # "auto" partitions GPUs of at least this many SMs (H100 / H200: 114-132), else the whole GPU

# Every green context made, kept to the end of the process. A tensor marked with record_stream for a partitioned
# stream (the codec runner marks the caller's frame tensors it reads there) records an event on that stream when it
# is freed; if the stream's context was destroyed first (its runner collected before the tensor), the caching
# allocator aborts the process ("CUDA error: context is destroyed": H200 session 24 call 3, tune_causal_conv.py's
# frames freed after their runner). One context per partitioned runner: a server makes one, a GPU test session a
# few dozen, so none is released. (Not reused between runners: that sharing has not been run on a GPU.)
_LIVE_CONTEXTS: list = []


class SMPartitionError(RuntimeError):
    """A partition was asked for where green contexts are not available, or with an impossible size."""


def partitioned_stream(device: torch.device, num_sms: int) -> tuple[torch.cuda.Stream, object]:
    """(a stream on `device` whose kernels use at most `num_sms` SMs, the green context that owns it; the context
    also stays alive to the end of the process, see _LIVE_CONTEXTS)."""
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
    _LIVE_CONTEXTS.append(context)
    return context.Stream(), context


def check_setting(setting: int | str | None) -> None:
    """An SM setting is None (the whole GPU), "auto" or a positive count; anything else is a clear error early, on a
    CPU too, where no stream is made."""
    if setting is None or setting == "auto":
        return
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ValueError(f'an SM partition is None, "auto" or a number of SMs >= 1, not {setting!r}')


def auto_sms(total: int) -> int | None:
    """The "auto" share of a GPU with `total` SMs, rounded down to whole partition steps (64 of an H200's 132); None
    (the whole GPU) on a GPU of fewer than AUTO_MIN_SMS."""
    if total < AUTO_MIN_SMS:
        return None
    return int(total * AUTO_SHARE) // GRANULARITY * GRANULARITY


def stream_for(device: torch.device, setting: int | str | None) -> tuple[torch.cuda.Stream, object | None, int | None]:
    """(a stream on CUDA `device`, the green context owning it or None, its SMs or None for the whole GPU) for an SM
    setting: None, the whole GPU; a count, that partition or an SMPartitionError; "auto", the AUTO_SHARE partition
    where this PyTorch and driver make one, else the whole GPU (a warning): a default must not stop a server."""
    check_setting(setting)
    if setting is None:
        return _whole_gpu(device)
    if setting != "auto":
        stream, context = partitioned_stream(device, setting)
        return stream, context, setting
    total = torch.cuda.get_device_properties(device).multi_processor_count
    sms = auto_sms(total)
    if sms is None:
        log.info("codec_sms=auto: the whole GPU (%d SMs; partitions only from %d)", total, AUTO_MIN_SMS)
        return _whole_gpu(device)
    try:
        stream, context = partitioned_stream(device, sms)
    except torch.cuda.OutOfMemoryError:
        raise                                         # not a refusal of the partition: the caller must see it
    except RuntimeError as e:                         # SMPartitionError, or a driver that refuses the green context
        log.warning("codec_sms=auto: no SM partition, the whole GPU (%s)", e)
        return _whole_gpu(device)
    return stream, context, sms


def _whole_gpu(device: torch.device) -> tuple[torch.cuda.Stream, None, None]:
    return torch.cuda.Stream(device), None, None
