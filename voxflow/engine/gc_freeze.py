"""Python's cyclic garbage collector in the serving processes: startup objects kept out of its scans, and a watch that
times its pauses.

An engine holds hundreds of thousands of long-lived objects (modules, parameters, graphs, tokenizer tables). A
full collection scans all of them, and it runs in the middle of whichever step allocated the object that tipped the
generation counters: tens of milliseconds at once, every so often. Frozen after startup (gc.freeze), they move to
the permanent generation: collections scan only what requests create. The serving process does this after its
engine is built (process.py), and so do the offline benchmark and the profiling script, so that they measure the
engine the server runs. Not done by EngineCore itself: it is process-wide, and tests build many engines in one
process. Its collection runs after the engine and its step trace are built: `freeze_core_startup` drops it from the
trace's first step.

`voxflow serve`'s API process freezes its own startup objects as its server starts (api/uvicorn_server.py): every
stream's chunks, the engine's replies and new requests wait while it collects. Session 58 (1.7B c=16 over HTTP on
an H100) saw one such stall: the event loop's 10 ms timer woke 50-100 ms late once, and the twelve requests that
arrived then took ~106 ms to their first audio instead of ~50; on the model-less serving path full collections
stopped that process ~98 ms each (benchmarks/results/cpu/2026-12-07-session58-api-gc/).

`GcPauseWatch` times each collection (gc.callbacks): the engine's step trace counts them per step (gc_ms), the API
process exports them as voxflow_api_gc_pause_seconds{generation}. Its cost: two perf_counter reads a collection
and the observer's call.
"""
from __future__ import annotations

import gc
import time
from typing import Callable


def freeze_startup_objects() -> None:
    gc.collect()
    gc.freeze()


def freeze_core_startup(core) -> None:
    """freeze_startup_objects() for a built engine core, whose step trace (if any) then forgets that collection."""
    freeze_startup_objects()
    trace = getattr(core, "trace", None)
    if trace is not None:
        trace.forget_gc()


class GcPauseWatch:
    """Times each collection of the cyclic collector (gc.callbacks) and hands (generation, seconds) to `observe`,
    from install() until uninstall()."""

    def __init__(self, observe: Callable[[int, float], None]):
        self.observe = observe
        self._start: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            seconds, self._start = time.perf_counter() - self._start, None
            self.observe(int(info.get("generation", -1)), seconds)

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
