"""A decode step whose results the host has not read yet (the engine reads them one step late).

After launching step N the engine copies what the host needs (finished / EOS flags, a few bytes per request) into
pinned memory with a non-blocking copy and records an event; the frames themselves stay on the device (cloned out
of the graph's output buffer, which the next replay overwrites) and go to the codec from there, as soon as the step
is queued (the codec's stream waits for the event). The engine then
launches step N + 1 before it reads step N's flags, so the GPU always has the next step queued while the host does
its bookkeeping: it waits for step N only while step N + 1 already runs.

Consequence: a request that finished at step N is decoded once more at step N + 1; that extra frame is discarded
(the model tolerates decoding a finished slot), and KV/slot/codec resources are released when the flags are read.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .model_api import DecodeOutput


class FlagBuffers:
    """Two pinned host buffers used alternately (the host reads one while the next step's copy fills the other)."""

    def __init__(self, max_batch: int, device: torch.device):
        self.device = torch.device(device)
        pin = self.device.type == "cuda"
        # [batch, 2]: the first n rows are contiguous, so the device-to-host copy stays asynchronous (a copy into
        # a strided pinned view goes through a temporary and blocks the host until the GPU is done).
        self._bufs = [torch.zeros(max_batch, 2, dtype=torch.bool, pin_memory=pin) for _ in range(2)]
        self._flip = 0

    def launch(self, seqs: list, out: DecodeOutput) -> "InflightDecode":
        n = len(seqs)
        host = self._bufs[self._flip][:n]
        self._flip ^= 1
        frames = out.frames.clone()
        cuda = self.device.type == "cuda"
        host.copy_(out.flag_pairs(), non_blocking=cuda)
        event = None
        if cuda:
            # Recorded after the clone: the codec stream waits on this event before it reads `frames`.
            event = torch.cuda.Event()
            event.record()
        return InflightDecode(seqs, frames, host, event)


@dataclass
class InflightDecode:
    seqs: list                      # the engine's per-request records, in batch order
    frames: torch.Tensor            # [B, 16] on the device (a copy: the graph's buffer is reused)
    flags: torch.Tensor             # [B, 2] pinned host: finished, eos (valid once `event` completed)
    event: "torch.cuda.Event | None"
    owners: list | None = None      # per row: the request its frame went to the codec for, or None (not queued)

    def wait(self) -> tuple[list[bool], list[bool]]:
        if self.event is not None:
            self.event.synchronize()
        return self.flags[:, 0].tolist(), self.flags[:, 1].tolist()
