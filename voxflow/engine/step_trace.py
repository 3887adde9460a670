"""Per-step trace of the engine loop, one JSON line per step (`EngineConfig.trace_steps` / `voxflow serve
--trace-steps PATH`): where a request's first-audio latency goes under load is a matter of which steps it waited
for and how long each took, which the summed counters of /health cannot show.

A line: {"step", "t" (monotonic s at the step's start), "ms" (host ms by phase of the step, as EngineCore.timings),
"decode" (rows), "prefill" (chunks), "prefill_tokens", "added" (requests queued since the previous step),
"prepare_ms" (host time spent building prompts since the previous step: a burst of arrivals is built in one batched
pass, counted once, failed requests included), "prepare_batches" (those passes), "codec_launched" (chunks started),
"chunks" (chunks out), "finished" (final records out), "codec_in_flight" (codec calls launched and not yet collected
at the step's end: on a GPU the codec may still be running while the next step runs), "codec_starved" (a first
chunk waited for a free codec state: codec_executor.py), "running", "waiting",
"capture_ms" (CUDA graphs captured during the step: talker and codec), "compiles" / "compile_ms" (Triton kernels
compiled or loaded from its disk cache during the step, and Triton's time for them: kernel_compiles.py),
"prefill_graph_runs" / "prefill_eager_runs" (how the step's prefill chunks ran: graph replays, eager forwards),
on a GPU "alloc_retries" / "cuda_mallocs" / "cuda_frees" (the caching allocator's retries after a failed cudaMalloc,
which free its cache and synchronize, and its device allocations and frees: gpu_memory.allocator_events) and
"stack_grown_bytes" (the driver's per-thread stack limit grown: its local memory resized, synchronously), each since
the previous line,
"gc_ms" (time in Python's garbage collector since the previous step: a collection pass over a serving process's heap
can take milliseconds)}.

With `profile_prepare` (`EngineConfig.trace_profile_prepare`, `voxflow serve --trace-profile-prepare`), building a
request's prompt (the model's `prepare` / `prepare_many`, on the engine thread) is also profiled with cProfile and
the statistics are written beside the trace at close, `PATH.prepare.pstats` (read them with `python -m pstats`): it
took 2.5-3.8 ms a request inside the serving engine against 0.9 ms alone on an H200. Off by default: the profiler
slows Python code, so a profiled run's prepare times and first packets read high.
"""
from __future__ import annotations

import contextlib
import cProfile
import json

from .gc_freeze import GcPauseWatch
from .gpu_memory import allocator_events, stack_limit_bytes


class StepTrace:
    def __init__(self, path: str, profile_prepare: bool = False):
        self._file = open(path, "a", buffering=1, encoding="utf-8")      # line-buffered: readable while serving
        self._added = 0
        self._prepare_s = 0.0
        self._prepare_batches = 0
        self._gc_s = 0.0
        self._on_gc = GcPauseWatch(self._add_gc)
        self._on_gc.install()
        self._path = path
        self._prepare_profile = cProfile.Profile() if profile_prepare else None

    @contextlib.contextmanager
    def profiling_prepare(self):
        if self._prepare_profile is None:
            yield
            return
        self._prepare_profile.enable()
        try:
            yield
        finally:
            self._prepare_profile.disable()

    def _add_gc(self, generation: int, seconds: float) -> None:
        self._gc_s += seconds

    def forget_gc(self) -> None:
        """Drop the collector time counted so far: startup's own (the serving process freezes its startup objects
        after the engine, and this trace, are built: gc_freeze.py), which is no step's."""
        self._gc_s = 0.0

    def note_added(self, added: int, prepare_seconds: float) -> None:
        """One prompt-building pass: `added` requests of it queued, `prepare_seconds` of host time."""
        self._added += added
        self._prepare_s += prepare_seconds
        self._prepare_batches += 1

    def write(self, record: dict) -> None:
        record.update(added=self._added, prepare_ms=round(self._prepare_s * 1e3, 3),
                      prepare_batches=self._prepare_batches, gc_ms=round(self._gc_s * 1e3, 3))
        self._added, self._prepare_s, self._prepare_batches, self._gc_s = 0, 0.0, 0, 0.0
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._on_gc.uninstall()
        self._file.close()
        if self._prepare_profile is not None and self._prepare_profile.getstats():
            self._prepare_profile.dump_stats(self._path + ".prepare.pstats")


class StallCounts:
    """A step line's counts since the previous line (the builds between steps included) of what stalls a step:
    Triton compiles (or disk-cache loads) and Triton's ms for them, how the step's prefill chunks ran (graph replays,
    eager forwards), and on CUDA the caching allocator's retries and device allocations and the driver's per-thread
    stack growth (each synchronous). Session 63's 307 ms prefill step prompted them. `kernel_compiles`: the engine's
    KernelCompileWatch; `prefill`: its PrefillDispatch."""

    def __init__(self, kernel_compiles, prefill, device):
        self.kernel_compiles, self.prefill, self.device = kernel_compiles, prefill, device
        self._seen = self.totals()                  # as of the last line (or startup)

    def totals(self) -> dict:
        """The cumulative counts (the allocator's and the stack's only on CUDA)."""
        w, p = self.kernel_compiles, self.prefill
        out = {"compiles": w.compiles + w.cache_loads, "compile_ms": w.seconds * 1e3,
               "prefill_graph_runs": p.graph_runs, "prefill_eager_runs": p.eager_runs}
        events = allocator_events(self.device)
        if events is not None:
            out.update(events)
            stack = stack_limit_bytes(self.device)
            if stack is not None:
                out["stack_grown_bytes"] = stack          # (the driver's per-thread stack only grows while serving)
        return out

    def since_last(self) -> dict:
        now, seen = self.totals(), self._seen
        self._seen = now
        return {k: round(v - seen.get(k, 0), 3) if isinstance(v, float) else v - seen.get(k, 0)
                for k, v in now.items()}
