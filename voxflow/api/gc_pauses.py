"""The API process's garbage-collector pauses: `voxflow_api_gc_pause_seconds{generation}`.

Why: Python's cyclic collector stops the process while it scans a generation, and a full (generation 2) collection
scans every tracked object the process holds: FastAPI, pydantic, the encoders, the app. Everything the event loop
does waits meanwhile: the engine's replies, every stream's chunks, new requests. Session 58 (1.7B c=16 over HTTP on
an H100) saw a stall of that size: the loop's 10 ms timer woke 50-100 ms late once, and the twelve requests that
arrived then all took ~106 ms to their first audio instead of ~50 (their engine intake 61 ms); on the model-less
serving path full collections stopped the process ~98 ms each (benchmarks/results/cpu/2026-12-07-session58-api-gc/).
The engine process freezes
its startup objects for the same reason (voxflow/engine/gc_freeze.py), and `voxflow serve`'s API process does too,
as its server starts (uvicorn_server.py), so later collections scan only what requests create.

Cost of the watch: one callback on each collection (two perf_counter reads and, at its end, a histogram observe).
"""
from __future__ import annotations

import gc
import time
from typing import Callable


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

