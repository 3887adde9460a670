"""Keep what an engine built at startup out of Python's cyclic garbage collector.

An engine holds hundreds of thousands of long-lived objects (modules, parameters, graphs, tokenizer tables). A
full collection scans all of them, and it runs in the middle of whichever step allocated the object that tipped the
generation counters: tens of milliseconds at once, every so often. Frozen after startup (gc.freeze), they move to
the permanent generation: collections scan only what requests create. The serving process does this after its
engine is built (process.py), and so do the offline benchmark and the profiling script, so that they measure the
engine the server runs; `voxflow serve`'s API process does it as its server starts (api/uvicorn_server.py). Not
done by EngineCore itself: it is process-wide, and tests build many engines in one process. Its collection runs
after the engine and its step trace are built: `freeze_core_startup` drops it from the trace's first step.
"""
from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    gc.collect()
    gc.freeze()


def freeze_core_startup(core) -> None:
    """freeze_startup_objects() for a built engine core, whose step trace (if any) then forgets that collection."""
    freeze_startup_objects()
    trace = getattr(core, "trace", None)
    if trace is not None:
        trace.forget_gc()
