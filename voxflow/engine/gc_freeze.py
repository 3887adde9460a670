"""Keep what an engine built at startup out of Python's cyclic garbage collector.

An engine holds hundreds of thousands of long-lived objects (modules, parameters, graphs, tokenizer tables). A
full collection scans all of them, and it runs in the middle of whichever step allocated the object that tipped the
generation counters: tens of milliseconds at once, every so often. Frozen after startup (gc.freeze), they move to
the permanent generation: collections scan only what requests create. The serving process does this after its
engine is built (process.py), and so do the offline benchmark and the profiling script, so that they measure the
engine the server runs; `voxflow serve`'s API process does it once its server is up (api/uvicorn_server.py). Not
done by EngineCore itself: it is process-wide, and tests build many engines in one process. (A step trace's first
record holds this collection in its gc_ms: it runs after the engine, and its trace, are built.)
"""
from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    gc.collect()
    gc.freeze()
