"""The CUDA stream the engine's talker work runs on (prompt builds, prefill, decode steps, graph captures).

By default the current stream. With `EngineConfig.talker_high_priority` it is a stream of the highest priority the
device offers: the codec decodes on its own stream (priority 0, the lowest, as every default stream), and on the
H200 its large convolution kernels took every SM while the next talker step's small kernels waited: at c=64, 47 of
453 steps took 15-45 ms instead of 7 (session-7 step trace), and the talker and codec times added up instead of
overlapping. A higher-priority stream's thread blocks are scheduled first whenever SMs free up, so the talker step
keeps its pace and the codec fills the rest of the GPU.

EngineCore's constructor and its GPU entry points (add_request, abort, create_voice, step) run under this stream;
`shutdown`, `stats`, `info` and `has_work` queue no GPU work (they read host state, or wait on events). Anything else
that touches the engine's tensors must order itself after them (the codec runner waits on the caller's current
stream, which is this one inside a step; slot buffers dropped by a growth record it: qwen3_tts/slots.py).
"""
from __future__ import annotations

import contextlib
import functools

import torch


def talker_stream(device: torch.device, high_priority: bool) -> torch.cuda.Stream | None:
    """A highest-priority stream on a CUDA device (None: keep the current stream), ordered after the work already
    queued on the current stream (the weights were loaded there)."""
    if not high_priority or device.type != "cuda":
        return None
    _, greatest = torch.cuda.Stream.priority_range()
    stream = torch.cuda.Stream(device, priority=greatest)
    stream.wait_stream(torch.cuda.current_stream(device))
    return stream


def stream_context(stream: torch.cuda.Stream | None):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def on_engine_stream(method):
    """Run an EngineCore method on the engine's talker stream (`self._stream`; a no-op when it is None)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with stream_context(getattr(self, "_stream", None)):
            return method(self, *args, **kwargs)
    return wrapper
