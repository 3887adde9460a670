"""One JSON line per finished speech request (`voxflow serve --trace-requests PATH`): where a request's time went
between the client, this API process and the engine, on one clock.

Every time is `time.monotonic()` (CLOCK_MONOTONIC on Linux) of the process that took it: this one (`api_*`) or the
engine process (`engine_*`, carried by its outputs), which read the same clock on one host; `voxflow bench` records
each request's send on it too (`RequestRecord.sent_clock_s`). `python -m voxflow.tools.http_turn` joins the three
to split a closed-loop run's turnover (a request's end -> its replacement's prompt build) hop by hop; the engine's
step trace (`--trace-steps`) holds the same runs' steps.

Lines come from the HTTP speech and batch routes' jobs (routes_speech.SpeechJob), written as each closes: refused
ones too once a job was made (e.g. the engine's 400), none for a request refused before (its body's validation, the
admission queue's 429, a server still loading) nor for WebSocket sentences.

Fields: id, status, mode ("audio": streamed, "sse", "file"), api_arrived (the handler began), api_submitted
(handed to the engine), api_first_out (its first output reached this process), api_final_in (its final record
did), api_closed (the response is over and the job closed); engine_arrived (its prompt built and queued),
engine_prepare (seconds the build took, when it made a first chunk), engine_first_chunk (its first chunk left the
engine's step), engine_finished (its final record did); audio_s. A time this request never reached is null.
The file grows by ~0.5 KB a request: a diagnosis switch, not one to leave on.
"""
from __future__ import annotations

import json

from voxflow.engine.request import AudioChunk, FinalRecord


class RequestTrace:
    """Appends one line a request to `path`; line-buffered, so a line is on disk once written (a few microseconds
    a request: the trace is for diagnosis, off by default)."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "a", buffering=1)    # (written and closed on the event loop's thread only)

    def write(self, record: dict) -> None:
        if not self._file.closed:                   # (a request draining after the app's lifespan closed it)
            self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


def _round(t: float | None) -> float | None:
    return None if t is None else round(t, 6)


def job_record(job) -> dict:
    """The trace line of a closed routes_speech.SpeechJob."""
    first = job.first
    final = job.final if job.final is not None else first if isinstance(first, FinalRecord) else None
    chunk = first if isinstance(first, AudioChunk) else None
    parts = (final.ttfp_parts if final is not None else None) or (chunk.ttfp_parts if chunk is not None else None)
    return {
        "id": job.plan.request.request_id, "status": job.status, "mode": job.plan.mode,
        "api_arrived": _round(job.arrived_at), "api_submitted": _round(job.submitted_at),
        "api_first_out": _round(job.first_out_at), "api_final_in": _round(job.final_in_at),
        "api_closed": _round(job.closed_at),
        "engine_arrived": _round(final.arrived_at) if final is not None and final.arrived_at else None,
        "engine_prepare": _round(parts.get("prepare")) if parts else None,
        "engine_first_chunk": _round(chunk.emitted_at) if chunk is not None else None,
        "engine_finished": _round(final.finished_at) if final is not None else None,
        "audio_s": _round(final.usage.audio_seconds) if final is not None else None,
    }
