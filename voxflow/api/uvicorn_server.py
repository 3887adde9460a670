"""The uvicorn server `voxflow serve` runs: uvicorn's own, plus the admission queue closed when a shutdown begins and
the process's startup objects frozen out of the garbage collector's scans as it starts (engine/gc_freeze.py says
why)."""
from __future__ import annotations

import asyncio
import gc
import logging

import uvicorn

from voxflow.engine.gc_freeze import freeze_startup_objects

log = logging.getLogger(__name__)


class ShutdownAwareServer(uvicorn.Server):
    """uvicorn's server that closes the app's admission queue (admission.py) the moment a shutdown begins: uvicorn
    lets open connections finish before the app's lifespan hears of it, so a request queued for a slot would
    otherwise wait out its admission wait and could even start generating during the drain. `stop()` is the same
    for serve's own reasons to stop (the engine died or failed to start)."""

    def __init__(self, config: uvicorn.Config, admission, *, freeze_gc: bool = True):
        super().__init__(config)
        self.admission = admission
        self.freeze_gc = freeze_gc
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        if self.freeze_gc:
            # The app is built (what requests share); its lifespan, which starts the GC pause watch (app.py),
            # has not run yet, so this collection is not counted as a serving pause.
            freeze_startup_objects()
            log.debug("froze %d startup objects out of the collector's scans", gc.get_freeze_count())
        await super().startup(sockets)

    def handle_exit(self, sig, frame) -> None:       # SIGINT / SIGTERM (from the signal handler)
        super().handle_exit(sig, frame)
        self._close_admission()

    def stop(self) -> None:
        """Any thread: stop as a signal would."""
        self.should_exit = True
        self._close_admission()

    def _close_admission(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.admission.close)
