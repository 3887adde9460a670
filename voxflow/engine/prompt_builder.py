"""Arrivals' prompts built on a thread of their own, beside the step loop (`EngineConfig.background_builds`).

Why: a prompt build (tokenizer, checks, prefix-cache keys, embedding gathers: the model's `prepare_many`) is host
work, ~0.3-0.4 ms a request on the H100 / H200 hosts, and in the closed-loop bench a wave's replacements arrive
together: built on the engine thread between steps, 259-287 ms a 640-request 0.6B c=64 run on the H200 (session 45's
traces), while the GPU had only the last rows' decode queued (session 41's wave-end timeline) and the rows waited
for their builds. Here the engine thread hands a burst over and goes on stepping; the builder runs while that thread
waits on the GPU (`Event.synchronize` releases the GIL), and the step after a build lands admits its requests.

GPU order: a build's kernels and copies go to the builder's own stream (on a GPU); the engine's stream waits for
the build's event before it admits the requests, and every tensor of a `PreparedRequest` is recorded on the engine's
stream, so that its memory is not handed back to the builder's stream while the engine's queued work still reads it.
`lock` is held while a build runs: the engine takes it for anything else that touches the model's build-side state
(`create_voice`: the voice caches, the kept text rows).

Threads: the engine thread calls `submit`, `take`, `pending` and `close`; the builder thread only runs builds. A build
that raises anything but a ValueError (which `prepare_requests` keeps per request) is an engine bug: `take` raises it
on the engine thread, as the inline build would have.
"""
from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from .engine_stream import stream_context
from .model_api import prepare_requests

# The engine thread, back from a wait on the GPU, needs the GIL that a build may hold: Python hands it over at the
# holder's next switch-interval check, 5 ms by default (most of a step); at this interval the step loop waits at most
# ~0.5 ms for it. It changes nothing while one thread runs alone.
SWITCH_INTERVAL_S = 0.0005


@dataclass
class Build:
    """One burst, built: `results[i]` is `requests[i]`'s PreparedRequest or ValueError."""
    requests: list
    results: list | None
    error: BaseException | None            # the build raised (a bug): re-raised by `take`
    seconds: float                          # the build's own time (host)
    event: Any = None                       # recorded on the builder's stream after the build (GPU)


class PromptBuilder:
    def __init__(self, model, device: torch.device):
        self.model = model
        self.lock = threading.Lock()
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)        # (process-wide: this engine's process or thread)
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._cond = threading.Condition()
        self._jobs: collections.deque[list] = collections.deque()
        self._done: collections.deque[Build] = collections.deque()
        self._pending = 0                   # requests submitted and not taken yet
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="voxflow-prompt-builder", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return self._pending

    def submit(self, requests: list) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the prompt builder is closed")
            self._jobs.append(requests)
            self._pending += len(requests)
            self._cond.notify_all()

    def take(self, block: bool = False) -> list[Build]:
        """The builds that have landed, oldest first (block: wait for one when some are pending and none has)."""
        with self._cond:
            while block and not self._done and self._pending and not self._closed:
                self._cond.wait()
            out = list(self._done)
            self._done.clear()
            self._pending -= sum(len(b.requests) for b in out)
        for b in out:
            if b.error is not None:
                raise b.error
        return out

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                requests = self._jobs.popleft()
            build = self._build(requests)
            with self._cond:
                self._done.append(build)
                self._cond.notify_all()

    def _build(self, requests: list) -> Build:
        started = time.perf_counter()
        try:
            with self.lock, torch.no_grad(), stream_context(self._stream):
                results = prepare_requests(self.model, requests)
                event = None
                if self._stream is not None:
                    event = torch.cuda.Event()
                    event.record(self._stream)
            return Build(requests, results, None, time.perf_counter() - started, event)
        except BaseException as e:          # handed to the engine thread, raised there
            return Build(requests, None, e, time.perf_counter() - started)


def hand_over(build: Build, stream) -> None:
    """Make `build`'s tensors safe to use on `stream` (the engine's current stream): the stream waits for the build's
    GPU work, and each tensor's memory stays the engine's until the stream's work queued so far is done."""
    if build.event is None:
        return
    stream.wait_event(build.event)
    for result in build.results:
        for t in _tensors(result):
            if t.is_cuda:
                t.record_stream(stream)


def _tensors(obj, seen=None):
    """Every tensor inside a dataclass / list / tuple / dict tree (a PreparedRequest and its model state)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name), seen)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x, seen)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x, seen)
