"""Triton kernels compiled by the engine: at startup (the startup record's `triton_compiles`) and while it serves.

Why: a kernel specialization that startup's capture and warm-up did not meet (a new shape or constexpr on an eager
path) compiles on first use, on the engine thread, and every stream stalls meanwhile: ~0.3-1.5 s a kernel, the same
order as the one 307 ms prefill step of session 63's j_5 run (0.6B c=64 on an H100, TTFP p99 408 ms), whose cause
its trace could not name. With this watch the step trace says how many kernels a step compiled and for how long
(`compiles`, `compile_ms`), /health's engine stats keep the count and the kernels' names, and the first compile of
each kernel while serving is logged as a warning.

How: Triton calls `triton.knobs.compilation.listener` at the end of each `triton.compile`, a compile or a load from
its disk cache (`cache_hit`), with the compile's own timings. One module-level listener is installed once per
process (chained to any listener set before it) and forwards to every live watch: tests and tools build several
engines in one process. A Triton without the knob (older than ~3.5), or none at all (a CPU-only install): the watch
reports itself unavailable and counts nothing.
"""
from __future__ import annotations

import collections
import logging
import threading
import weakref

log = logging.getLogger(__name__)

_watches: "weakref.WeakSet[KernelCompileWatch]" = weakref.WeakSet()
_lock = threading.Lock()
_installed: bool | None = None          # None: not tried yet; False: this Triton has no compilation listener


def _listener_knobs():
    try:
        from triton import knobs
    except Exception:                    # no Triton, or one that fails to import on this machine
        return None
    compilation = getattr(knobs, "compilation", None)
    return compilation if compilation is not None and hasattr(compilation, "listener") else None


def _install() -> bool:
    global _installed
    with _lock:
        if _installed is None:
            compilation = _listener_knobs()
            if compilation is None:
                _installed = False
            else:
                previous = compilation.listener

                def listener(**event):
                    for watch in list(_watches):
                        try:
                            watch.on_compile(**event)
                        except Exception:       # counting must never fail a compile
                            log.exception("counting a Triton compile failed")
                    if previous is not None:
                        previous(**event)

                compilation.listener = listener
                _installed = True
        return _installed


class KernelCompileWatch:
    """Counts the Triton compiles (and disk-cache loads) of this process from `start()` on; `serving()` marks the
    end of startup: later compiles are the ones a request waited for."""

    def __init__(self):
        self.available = False
        self.compiles = 0                # compiled, not found in Triton's disk cache
        self.cache_loads = 0             # found in the disk cache (still a first use in this process)
        self.seconds = 0.0               # Triton's own timings of those compiles and loads
        self.at_startup: dict | None = None          # snapshot() at serving(): the startup record's
        self._startup_counts = (0, 0, 0.0)           # the same, unrounded: what stats() subtracts
        self.while_serving: collections.Counter[str] = collections.Counter()
        self.warned: list[str] = []      # the kernels this watch logged a warning for, in order
        self._serving = False
        self._lock = threading.Lock()

    def start(self) -> "KernelCompileWatch":
        self.available = _install()
        if self.available:
            _watches.add(self)
        return self

    def stop(self) -> None:
        _watches.discard(self)

    def on_compile(self, *, metadata: dict, times, cache_hit: bool, **_) -> None:
        name = str(metadata.get("name", "?"))
        seconds = getattr(times, "total", 0) / 1e6          # CompileTimes: microseconds
        with self._lock:
            if cache_hit:
                self.cache_loads += 1
            else:
                self.compiles += 1
            self.seconds += seconds
            if not self._serving:
                return
            first = name not in self.while_serving
            self.while_serving[name] += 1
            if first:
                self.warned.append(name)
        if first:
            log.warning("Triton %s kernel %s while serving (%.0f ms): a shape that startup's capture and warm-up "
                        "did not cover; every stream waited for it", "loaded" if cache_hit else "compiled", name,
                        seconds * 1e3)

    def serving(self) -> None:
        """Startup is over: what was counted so far is startup's (`at_startup`)."""
        with self._lock:
            self.at_startup = self.snapshot()
            self._startup_counts = (self.compiles, self.cache_loads, self.seconds)
            self._serving = True

    def snapshot(self) -> dict:
        return {"compiles": self.compiles, "cache_loads": self.cache_loads, "seconds": round(self.seconds, 3)}

    def stats(self) -> dict:
        """/health: the compiles since startup, and the kernels they were (most first)."""
        if not self.available:
            return {"available": False}
        compiles, cache_loads, seconds = self._startup_counts
        return {"compiles": self.compiles - compiles, "cache_loads": self.cache_loads - cache_loads,
                "seconds": round(self.seconds - seconds, 3), "kernels": dict(self.while_serving.most_common(16))}
