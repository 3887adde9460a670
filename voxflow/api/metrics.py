"""Prometheus metrics of the API server (own registry; served at GET /metrics).

Definitions follow shared/reference/benchmarking.md, server side, with the same meaning for streaming and
non-streaming requests:

    voxflow_audio_ttfp_seconds            request arrival -> first audio-bearing bytes handed to the socket
                                          (non-streaming: the whole file, so TTFP = E2E there)
    voxflow_e2e_request_latency_seconds   request arrival -> last byte handed to the socket
    voxflow_audio_rtf                     E2E / audio duration (lower is better; < 1 = faster than real time)
    voxflow_audio_duration_seconds        audio per successful request (samples / sample rate)
    voxflow_audio_seconds_total           audio generated (rate() = audio-s per s)
    voxflow_audio_underrun_seconds        streams only: worst simulated-player deficit of the request, with the
                                          player started at the first audio packet t0: before packet i (sent at
                                          t_i) deficit_i = (t_i - t0) - audio seconds already sent
    voxflow_stream_underruns_total        streams only: packets that arrived after the audio sent before them had
                                          finished playing (deficit_i > 0)
    voxflow_audio_continuity_ok_total     streams whose worst deficit stayed <= threshold_ms (100, 200)
    voxflow_requests_total{status}        speech requests answered, by HTTP status
    voxflow_requests_finished_total{reason}  eos | length | aborted | error | client_disconnect
    voxflow_requests_rejected_total{reason}  admission rejections: concurrency (429) | queue_full | unavailable (503)
    voxflow_api_requests_in_flight        speech requests running now: holding one of the server-wide slots
                                          (admission.py; at most max_concurrent_requests; a batch item and a
                                          WebSocket sentence count as one each)
    voxflow_api_requests_waiting          speech requests queued for a slot (admission.py's FIFO)
    voxflow_api_event_loop_lag_seconds    how late the API process's event loop ran a periodic timer (loop_lag.py;
                                          every request's HTTP and engine hops wait behind a busy loop)
    voxflow_api_gc_pause_seconds{generation}  the API process's garbage-collector pauses (engine/gc_freeze.py): the
                                          whole process, event loop included, stops for each
    voxflow_num_requests_running / _waiting, voxflow_kv_cache_usage_ratio, voxflow_engine_*  engine stats, read
                                          from the engine at scrape time

Route code uses one `RequestTracker` per request (`metrics.track(streaming=...)`).
"""
from __future__ import annotations

import time

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

disable_created_metrics()      # no *_created series: they double the exposition and nobody graphs them

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
                   20.0, 30.0, 60.0, 120.0)
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)
DURATION_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
LOOP_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
UNDERRUN_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
CONTINUITY_THRESHOLDS_MS = (100, 200)
ENGINE_COUNTERS = ("finished", "aborted", "errors", "preemptions", "steps",
                   "codec_nonfinite_chunks",       # chunks whose NaN samples the codec zeroed (codec_runner.py)
                   "prompt_tokens", "prompt_tokens_cached")   # prompt positions admitted / found in the prefix cache
# The engine's GPU footprint (engine/gpu_memory.py; absent on a CPU): name -> (stats key, help).
ENGINE_MEMORY = {
    "gpu_memory_used_bytes": ("gpu_memory_used_bytes", "GPU memory in use on the engine's device (driver's view)"),
    "gpu_memory_peak_total_bytes": ("peak_gpu_memory_total_bytes", "The engine's peak GPU footprint: its "
                                    "allocator's peak reservation plus the CUDA context, modules and graphs"),
    "gpu_allocator_retries": ("alloc_retries", "cudaMallocs that failed so that the engine's caching allocator "
                              "freed its cache (synchronizing the GPU) and retried: a step near the memory limit"),
}


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.ttfp = Histogram("voxflow_audio_ttfp_seconds", "Request arrival to first audio bytes sent",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("voxflow_e2e_request_latency_seconds", "Request arrival to last byte sent",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("voxflow_audio_rtf", "E2E latency / audio duration (lower is better)",
                             buckets=RTF_BUCKETS, registry=r)
        self.duration = Histogram("voxflow_audio_duration_seconds", "Audio duration per successful request",
                                  buckets=DURATION_BUCKETS, registry=r)
        self.audio_seconds = Counter("voxflow_audio_seconds", "Audio generated, seconds", registry=r)
        self.underrun = Histogram("voxflow_audio_underrun_seconds", "Worst simulated-player deficit per stream",
                                  buckets=UNDERRUN_BUCKETS, registry=r)
        self.underruns = Counter("voxflow_stream_underruns", "Stream packets sent after the audio before them "
                                 "had finished playing", registry=r)
        self.continuity_ok = Counter("voxflow_audio_continuity_ok", "Streams whose worst deficit stayed within "
                                     "the threshold", ["threshold_ms"], registry=r)
        self.requests = Counter("voxflow_requests", "Speech requests answered, by HTTP status", ["status"],
                                registry=r)
        self.finished = Counter("voxflow_requests_finished", "Speech requests finished, by reason", ["reason"],
                                registry=r)
        self.rejected = Counter("voxflow_requests_rejected", "Admission rejections (429/503)", ["reason"],
                                registry=r)
        self.in_flight = Gauge("voxflow_api_requests_in_flight", "Speech requests running (holding an admission "
                               "slot)", registry=r)
        self.api_waiting = Gauge("voxflow_api_requests_waiting", "Speech requests queued for an admission slot",
                                 registry=r)
        self.loop_lag = Histogram("voxflow_api_event_loop_lag_seconds", "How late the API process's event loop ran "
                                  "a periodic timer", buckets=LOOP_LAG_BUCKETS, registry=r)
        self.gc_pause = Histogram("voxflow_api_gc_pause_seconds", "The API process's garbage-collector pauses, by "
                                  "generation collected", ["generation"], buckets=GC_PAUSE_BUCKETS, registry=r)
        self.running = Gauge("voxflow_num_requests_running", "Requests decoding in the engine", registry=r)
        self.waiting = Gauge("voxflow_num_requests_waiting", "Requests queued in the engine", registry=r)
        self.kv_usage = Gauge("voxflow_kv_cache_usage_ratio", "Fraction of KV-cache blocks in use", registry=r)
        self.engine_up = Gauge("voxflow_engine_up", "1 when the engine answers", registry=r)
        self.engine_counters = {name: Gauge(f"voxflow_engine_{name}", f"Engine counter '{name}' (since start)",
                                            registry=r) for name in ENGINE_COUNTERS}
        self.engine_memory: dict[str, Gauge] = {}       # made when an engine first reports them (a GPU engine)
        # engine/kernel_compiles.py: each stalled every stream; made when an engine reports them (Triton present)
        self.kernel_compiles: Gauge | None = None
        for t in CONTINUITY_THRESHOLDS_MS:
            self.continuity_ok.labels(threshold_ms=str(t))
        for reason in ("concurrency", "queue_full", "unavailable"):
            self.rejected.labels(reason=reason)

    def track(self, *, streaming: bool, arrived_at: float | None = None) -> "RequestTracker":
        return RequestTracker(self, streaming, time.monotonic() if arrived_at is None else arrived_at)

    def observe_admission(self, admission) -> None:
        """Copy the admission's counts (admission.Admission) into the gauges."""
        self.in_flight.set(admission.running)
        self.api_waiting.set(admission.waiting)

    def observe_engine(self, health: dict) -> None:
        """Copy the engine's stats (EngineClient.health()) into the gauges."""
        stats = health.get("stats") or {}
        self.engine_up.set(1 if health.get("alive") and health.get("stats") is not None else 0)
        for key, gauge in (("running", self.running), ("waiting", self.waiting), ("kv_usage", self.kv_usage)):
            if isinstance(stats.get(key), (int, float)):
                gauge.set(stats[key])
        for name, gauge in self.engine_counters.items():
            if isinstance(stats.get(name), (int, float)):
                gauge.set(stats[name])
        for name, (key, text) in ENGINE_MEMORY.items():
            if isinstance(stats.get(key), (int, float)):
                if key not in self.engine_memory:
                    self.engine_memory[key] = Gauge(f"voxflow_{name}", text, registry=self.registry)
                self.engine_memory[key].set(stats[key])
        compiles = stats.get("kernels_compiled_while_serving") or {}
        if isinstance(compiles.get("compiles"), int):
            if self.kernel_compiles is None:
                self.kernel_compiles = Gauge("voxflow_engine_kernel_compiles_while_serving", "Triton kernels the "
                                             "engine compiled or loaded from Triton's disk cache after its startup "
                                             "(a shape its warm-up missed: every stream waited)",
                                             registry=self.registry)
            self.kernel_compiles.set(compiles["compiles"] + compiles.get("cache_loads", 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTracker:
    """One request's timings. Call `sent(audio_seconds)` each time audio bytes go to the socket (in order),
    `finish(status, reason)` once at the end (idempotent)."""

    def __init__(self, metrics: Metrics, streaming: bool, arrived_at: float) -> None:
        self.m, self.streaming, self.arrived_at = metrics, streaming, arrived_at
        self.first_at: float | None = None
        self.audio_sent = 0.0
        self.worst_deficit = 0.0
        self.underruns = 0
        self.done = False

    def sent(self, audio_seconds: float, now: float | None = None) -> None:
        if audio_seconds <= 0:
            return
        now = time.monotonic() if now is None else now
        if self.first_at is None:
            self.first_at = now
            self.m.ttfp.observe(now - self.arrived_at)
        else:
            deficit = (now - self.first_at) - self.audio_sent
            if deficit > 0:
                self.underruns += 1
                self.worst_deficit = max(self.worst_deficit, deficit)
        self.audio_sent += audio_seconds

    def discard(self) -> None:
        """The request was refused before it ran (counted where it was refused, as an HTTP 429 is): it counts
        nowhere else. Idempotent, and a no-op after finish."""
        self.done = True

    def finish(self, status: int, reason: str | None = None, audio_seconds: float | None = None) -> None:
        """status: the HTTP status answered; reason: eos | length | aborted | error | client_disconnect;
        audio_seconds: the request's audio (default: what was sent)."""
        if self.done:
            return
        self.done = True
        m = self.m
        m.requests.labels(status=str(status)).inc()
        if reason is not None:
            m.finished.labels(reason=reason).inc()
        audio = self.audio_sent if audio_seconds is None else audio_seconds
        if audio > 0:
            m.audio_seconds.inc(audio)
        if status != 200 or reason not in ("eos", "length"):
            return
        e2e = time.monotonic() - self.arrived_at
        m.e2e.observe(e2e)
        m.duration.observe(audio)
        if audio > 0:
            m.rtf.observe(e2e / audio)
        if self.streaming and self.first_at is not None:
            m.underrun.observe(self.worst_deficit)
            if self.underruns:
                m.underruns.inc(self.underruns)
            for t in CONTINUITY_THRESHOLDS_MS:
                if self.worst_deficit <= t / 1000.0:
                    m.continuity_ok.labels(threshold_ms=str(t)).inc()
