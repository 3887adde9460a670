"""How late the API process's event loop runs a timer: `voxflow_api_event_loop_lag_seconds`.

Why: every streamed chunk, every final record and every new request of the server goes through this one loop
(HTTP parsing and writes, the engine's ZeroMQ replies, the handlers), so a loop busy for milliseconds delays all
of them at once. A closed-loop 0.6B c=64 run over HTTP spent 6-11 ms in each of the two hops through it per request
(session 52, `voxflow/tools/http_turn.py`), against ~1.5 ms at c=8 on a model-less server: the watcher says whether
the loop itself is the queue. A sleep of `interval` seconds that wakes `lag` seconds late is one observation.

Cost: one wake-up per interval (10 ms by default: ~100 a second, a few us each). Lags under ~1 ms are the loop's
own timer granularity, not load.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

DEFAULT_INTERVAL_S = 0.01


async def watch_loop_lag(observe: Callable[[float], None], interval: float = DEFAULT_INTERVAL_S) -> None:
    """Until cancelled: sleep `interval` seconds on the running loop and report how late each wake-up came
    (seconds, >= 0) to `observe`."""
    if interval <= 0:
        raise ValueError(f"the loop-lag interval must be > 0 seconds, got {interval}")
    # time.perf_counter, not loop.time(): uvloop's clock counts whole milliseconds, which would skew its lags
    # against asyncio's in an A/B of the two
    while True:
        start = time.perf_counter()
        await asyncio.sleep(interval)
        observe(max(0.0, time.perf_counter() - start - interval))
