"""A CUDA stream whose kernels may use only some of the GPU's SMs (a CUDA green context), for the codec.

Why: the codec's kernels are large (whole-GPU convolutions and GEMMs of ms each at high batch) while a talker step is a
chain of ~1,000 small dependent kernels. Sharing every SM, each small kernel waits for codec blocks to drain, so the
two streams cost their sum (H200, 1.7B, c=64: talker 6.0 + codec 2.9 ms of kernels, 9.5 ms a step; a high-priority
talker stream changed nothing: running blocks are never preempted). Confined to a subset of SMs, the codec can
never occupy the others, where the talker's kernels start at once.

Green contexts need a PyTorch built with them and a recent driver; their Python API is beta and has changed between
releases, so anything unexpected falls back to a plain stream, with the reason kept for the startup report.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class SMLimitedStream:
    """`.stream`: the stream to run on; `.num_sms`: its SM limit, or None with `.fallback_reason` set."""

    def __init__(self, device: torch.device, num_sms: int | None):
        device = torch.device(device)
        self.num_sms: int | None = None
        self.fallback_reason: str | None = None
        self._context = None                # the green context lives as long as its stream is used
        if num_sms is not None:
            try:
                self.stream = self._green_stream(device, num_sms)
                self.num_sms = num_sms
                return
            except Exception as e:          # noqa: BLE001 - beta API: fall back, and say why
                self.fallback_reason = f"{type(e).__name__}: {e}"
                log.warning("codec stream not limited to %d SMs (%s): using a plain stream", num_sms,
                            self.fallback_reason)
        self.stream = torch.cuda.Stream(device)

    def _green_stream(self, device: torch.device, num_sms: int) -> torch.cuda.Stream:
        total = torch.cuda.get_device_properties(device).multi_processor_count
        if not 1 <= num_sms < total:
            raise ValueError(f"num_sms must lie in [1, {total}) on this GPU, got {num_sms}")
        from torch.cuda import green_contexts
        if not getattr(green_contexts, "SUPPORTED", True):
            raise RuntimeError("this PyTorch build has no green contexts")
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._context = green_contexts.GreenContext.create(num_sms=num_sms, device_id=index)
        if not hasattr(self._context, "Stream"):
            raise RuntimeError("this PyTorch's GreenContext has no Stream()")
        return self._context.Stream()
