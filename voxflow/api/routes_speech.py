"""POST /v1/audio/speech: OpenAI speech with the vLLM-Omni extensions; whole files, chunked audio, or SSE.

Response modes (schemas.SpeechRequestBody.mode):
- "file"  (no stream fields): the whole encoded file, Content-Type of the format.
- "audio" (`stream_format: "audio"`): HTTP/1.1 chunked bytes as the engine produces them, in every format
          (wav with a 0xFFFFFFFF-sized header, mp3/opus/aac/flac incremental); the first bytes leave as soon as the
          first chunk is decoded.
- "sse"   (`stream_format: "sse"`, or legacy `stream: true` alone): `speech.audio.delta` events (base64 `audio`,
          `response_format`), then `speech.audio.done` with usage, or `speech.audio.error`.

Everything that can fail does so before the status line: validation (400 naming the field, 404 unknown model /
voice), admission (a place in the server-wide FIFO of admission.py for a slot of settings.max_concurrent_requests,
waited for up to settings.admission_wait_s, then 429; 503 when the engine is unavailable or its queue is full; both
with Retry-After), and the engine's own validation (the first engine output is awaited before
answering: a ValueError there comes back as a FinalRecord(ERROR) and becomes a 400 with its message). After the
first byte, a failure can only be signalled in-band (SSE error event) or by cutting the connection (raw audio:
the chunked body never completes). A client that goes away closes the engine iterator: the request is aborted
and counted as 499, whenever it leaves: while the first output is awaited (a whole file's only chunk comes at
its end), while it waits for an admission slot, while the rest of a whole file is collected, or while a stream is
sent.
A `Server-Timing` header says where the first audio's time went inside the server (SpeechJob.server_timing).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from typing import AsyncIterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..engine.client import ENGINE_DIED, EngineUnavailableError
from ..engine.request import AudioChunk, FinalRecord, FinishReason
from .admission import Abandoned, AdmissionRefused
from .errors import APIError
from .request_trace import job_record
from .schemas import SpeechPlan, SpeechRequestBody, plan_speech
from .state import AppState, get_state

log = logging.getLogger(__name__)
router = APIRouter()

RETRY_AFTER_BUSY_S = 1
RETRY_AFTER_UNAVAILABLE_S = 5


@router.post("/v1/audio/speech")
async def create_speech(body: SpeechRequestBody, request: Request):
    return await speak(body, request)


async def speak(body: SpeechRequestBody, request: Request, arrived: float | None = None):
    """The response to a speech request (every route that speaks: this one, the ElevenLabs-style ones): planned
    (`plan_speech`), admitted, then a whole file or a stream as the body's mode asks."""
    arrived = time.monotonic() if arrived is None else arrived
    state = get_state(request)
    check_loaded(state)
    plan = await plan_speech(state, body)
    try:
        job = await SpeechJob.start(state, plan, arrived, request.receive)
    except ClientGone:                  # nobody reads the answer; the job has been closed as 499
        return Response(status_code=499)
    if plan.mode == "file":
        return await job.whole_file(request)
    return job.stream_response()


# ---------------------------------------------------------------------------------------- admission
def check_loaded(state: AppState) -> None:
    """503 with Retry-After while the model loads (the app answers before it is ready)."""
    if not state.model_info:
        _reject(state, "unavailable")
        raise APIError(503, "the model is still loading; retry later", retry_after=RETRY_AFTER_UNAVAILABLE_S)


def _reject(state: AppState, reason: str, count: int = 1) -> None:
    if state.metrics is not None:
        state.metrics.rejected.labels(reason=reason).inc(count)


async def admit(state: AppState, *, deadline: float | None = None, receive=None, retryable: bool = True,
                counts_for: int = 1, no_deadline: bool = False) -> None:
    """Take one of the server-wide slots (state.admission), waiting for it in the shared FIFO until `deadline`
    (loop time; None: settings.admission_wait_s from now), or raise 429 with Retry-After, counted as one rejection
    (or as `counts_for`: a batch refused as a whole, each of its items a request of its own). `receive` (an HTTP
    request's, its body read) is watched while waiting: ClientGone when the client leaves. retryable=False: a
    request its client cannot send again (a WebSocket sentence, its text accepted): never refused for a full
    queue (Admission.acquire's bounded=False), and its refusal carries no retry advice. no_deadline: waits as long
    as the queue ahead of it takes and is never refused for a full queue either (a batch's later item, its batch
    already running: routes_batch.py); only a shutdown refuses it.
    Returning means the slot is the caller's (no await after it was granted); it goes back with `release`."""
    admission = state.admission
    if admission.try_acquire():                     # the usual case: no task, no timer
        return
    loop = asyncio.get_running_loop()
    if no_deadline:
        deadline = None
    elif deadline is None:
        deadline = loop.time() + max(0.0, float(state.settings.admission_wait_s))
    gone = asyncio.ensure_future(wait_disconnect(receive)) if receive is not None else None
    try:
        await admission.acquire(1, deadline, abandon=gone, bounded=retryable and not no_deadline)
    except AdmissionRefused as e:
        if e.reason == "closing":
            _reject(state, "unavailable", counts_for)
            hint = "; retry on another instance or later" if retryable else ""
            raise APIError(503, f"the server is shutting down{hint}", code="server_shutting_down",
                           retry_after=RETRY_AFTER_UNAVAILABLE_S) from None
        _reject(state, "concurrency", counts_for)
        hint = "; retry later" if retryable else ""
        raise APIError(429, f"too many concurrent requests: {e}{hint}", code="rate_limit_exceeded",
                       retry_after=RETRY_AFTER_BUSY_S) from None
    except Abandoned:
        raise ClientGone from None
    finally:
        if gone is not None:        # not awaited: an await here could be cancelled after the slot was granted
            gone.cancel()
            if gone.done() and not gone.cancelled():
                gone.exception()    # a receive that failed is a client gone, not an error to log


def release(state: AppState) -> None:
    state.admission.release(1)


def engine_error(state: AppState, final: FinalRecord) -> APIError:
    """An engine FinalRecord that arrived before any audio, as the HTTP error to answer with (by its
    error_kind; engines that do not set it are judged by the message)."""
    msg = final.error or final.reason.value
    kind = getattr(final, "error_kind", None)
    if kind is None:
        low = msg.lower()
        kind = ("engine_died" if msg.startswith(ENGINE_DIED) or "shut down" in low
                else "overloaded" if "queue" in low and "full" in low else "invalid_request")
    if final.reason is FinishReason.ABORTED or kind == "engine_died":
        _reject(state, "unavailable")
        return APIError(503, f"the engine cannot take requests now ({msg}); retry later",
                        retry_after=RETRY_AFTER_UNAVAILABLE_S)
    if kind == "overloaded":
        _reject(state, "queue_full")
        return APIError(503, f"server busy: {msg}; retry later", code="queue_full", retry_after=RETRY_AFTER_BUSY_S)
    if kind == "invalid_request":                       # the engine's validation (a ValueError there)
        return APIError(400, msg, param=_field_named(msg), code="invalid_value")
    return APIError(500, f"synthesis failed: {msg}", code="internal_error")


def _field_named(message: str) -> str | None:
    """The request field an engine's validation message is about when it starts with its name (e.g. "temperature
    must be > 0 ..."): the engine knows no HTTP fields, but its checks of sampling options use the same names."""
    word = message.split(" ", 1)[0]
    return word if word in SpeechRequestBody.model_fields else None


# ---------------------------------------------------------------------------------------- one request
class SpeechJob:
    """One request: its admission slot, the engine iterator, its first output, metrics, and the single cleanup.
    `holds_slot`: the job owns one admission slot, given back by close()."""

    def __init__(self, state: AppState, plan: SpeechPlan, arrived: float):
        self.state, self.plan = state, plan
        self.holds_slot = False
        self.tracker = state.metrics.track(streaming=plan.mode != "file", arrived_at=arrived)
        self.gen = None
        self.first: AudioChunk | FinalRecord | None = None
        self.final: FinalRecord | None = None
        self.closed = False
        self.encoder = None
        self.arrived_at = arrived
        self.submitted_at: float | None = None      # handed to the engine
        self.first_out_at: float | None = None      # its first output reached this process
        self.final_in_at: float | None = None       # its final record did (request_trace.py)
        self.closed_at: float | None = None
        self.status: int | None = None              # as closed

    @classmethod
    async def start(cls, state: AppState, plan: SpeechPlan, arrived: float, receive=None) -> "SpeechJob":
        """Admit, submit and await the first engine output (see `wait_for_slot`, `begin`)."""
        job = cls(state, plan, arrived)
        await job.wait_for_slot(receive)
        await job.begin(receive)
        return job

    async def wait_for_slot(self, receive=None) -> None:
        """Take a server-wide slot (`admit`). Refused: its 429 APIError, counted as a rejection only, as before it
        could wait. The client leaving meanwhile (ClientGone) or the server stopping the handler: closed as 499,
        as a request that left while it ran."""
        try:
            await admit(self.state, receive=receive)
        except APIError:
            self.discard()
            raise
        except BaseException:
            await self.close(499, "client_disconnect")
            raise
        self.holds_slot = True

    def discard(self) -> None:
        """Refused admission: closed without counting as a request (the rejection was counted)."""
        self.closed = True
        self.tracker.discard()

    async def begin(self, receive=None) -> None:
        """Submit and await the first engine output; the admission slot is already this job's. `receive` (the
        ASGI receive of the request, its body read) is watched meanwhile: a whole-file request's first output is
        all its audio, so without the watch a client that left would keep the engine generating for nobody.
        ClientGone when it left; any failure (APIError, ClientGone, cancellation) closes the job first."""
        state, plan = self.state, self.plan
        try:
            self.gen = state.engine.generate(plan.request).__aiter__()
            try:
                self.submitted_at = time.monotonic()    # generate() submits on its first step
                first = self.gen.__anext__()
                self.first = await (until_disconnect(first, receive) if receive is not None else first)
                self.first_out_at = time.monotonic()
                if isinstance(self.first, FinalRecord):
                    self.final_in_at = self.first_out_at
            except EngineUnavailableError as e:
                _reject(state, "unavailable")
                raise APIError(503, f"the engine cannot take requests now ({e}); retry later",
                               retry_after=RETRY_AFTER_UNAVAILABLE_S) from None
            if isinstance(self.first, FinalRecord) and self.first.reason not in (FinishReason.EOS,
                                                                                  FinishReason.LENGTH):
                raise engine_error(state, self.first)
            self.encoder = plan.make_encoder()
        except BaseException as e:
            if isinstance(e, (ClientGone, asyncio.CancelledError)):    # client left / server stopping the handler
                await self.close(499, "client_disconnect")
            else:
                await self.close(e.status if isinstance(e, APIError) else 500)
            raise

    async def outputs(self) -> AsyncIterator[AudioChunk | FinalRecord]:
        """The first output, then the rest; remembers the FinalRecord."""
        out = self.first
        while True:
            if isinstance(out, FinalRecord):
                self.final = out
                yield out
                return
            yield out
            out = await self.gen.__anext__()
            if isinstance(out, FinalRecord):
                self.final_in_at = time.monotonic()

    async def close(self, status: int, reason: str | None = None) -> None:
        """Abort the engine request if it still runs, free the admission slot, record metrics. Once."""
        if self.closed:
            return
        self.closed = True
        self.status, self.closed_at = status, time.monotonic()
        try:
            if self.gen is not None:
                await self.gen.aclose()             # unfinished: aborts the request in the engine
        finally:
            if self.encoder is not None and not self.encoder.finished:
                self.encoder.close()
            if reason is None and self.final is not None:
                reason = self.final.reason.value
            audio = self.final.usage.audio_seconds if self.final is not None else None
            self.tracker.finish(status, reason, audio_seconds=audio if status == 200 else None)
            if self.state.request_trace is not None:
                try:
                    self.state.request_trace.write(job_record(self))
                except Exception as e:      # a diagnostic: its failure never skips the release below
                    log.warning("request trace: %s: %s", type(e).__name__, e)
            if self.holds_slot:             # last: whoever sees the slot free sees this request's record closed
                self.holds_slot = False
                release(self.state)

    def server_timing(self) -> dict[str, str]:
        """A Server-Timing header splitting the first audio's time inside this server (ms): `api` (handler start
        to the engine), `engine` (to its first chunk; the engine stamps chunks with the same host clock) and
        `relay` (that chunk to this process). When the first chunk carries the engine's own split
        (live_request.TTFP_PARTS), `engine` is given as its parts instead: `intake` (handed over -> its prompt build
        starts: the transfer and the wait behind earlier arrivals' builds and steps), `prepare`,
        `queue_and_prefill`, `first_frame`, `first_chunk` (the same total). Whatever else a client measures went to
        HTTP and the client itself: `voxflow bench` records it per request to show where its TTFP goes."""
        first = self.first
        if not isinstance(first, AudioChunk) or self.submitted_at is None or self.first_out_at is None:
            return {}
        engine = first.emitted_at - self.submitted_at
        inside = list(first.ttfp_parts.items()) if first.ttfp_parts else []
        engine_parts = ([("intake", engine - sum(v for _, v in inside))] + inside) if inside else [("engine", engine)]
        parts = [("api", self.submitted_at - self.arrived_at), *engine_parts,
                 ("relay", self.first_out_at - first.emitted_at)]
        return {"Server-Timing": ", ".join(f"{name};dur={max(0.0, s) * 1e3:.2f}" for name, s in parts)}

    def usage(self) -> dict:
        u = self.final.usage if self.final is not None else None
        inp, out = (u.prompt_tokens, u.frames) if u is not None else (0, 0)
        return {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}

    # ---- whole file ------------------------------------------------------------------------------------------
    async def whole_file(self, request: Request) -> Response:
        try:
            data = await until_disconnect(self.file_data(), request.receive)
        except ClientGone:                                  # the client left first
            await self.close(499, "client_disconnect")      # (file_data did, unless cancelled before it ran)
            return Response(status_code=499)
        headers = {**self.plan.headers(self.encoder), **self.server_timing()}
        headers["X-Usage"] = json.dumps(self.usage(), separators=(",", ":"))
        return Response(data, media_type=self.encoder.content_type, headers=headers)

    async def file_data(self) -> bytes:
        """The rest of the audio, encoded as one file (after `begin`); the job is closed on every way out: 200 with
        the bytes, the error's status when it raises, 499 when cancelled (client gone, server stopping)."""
        try:
            pcm = await self._collect()
            if self.final.reason not in (FinishReason.EOS, FinishReason.LENGTH):   # e.g. the engine died
                err = engine_error(self.state, self.final)
                await self.close(err.status)
                raise err
            encoding = asyncio.ensure_future(asyncio.to_thread(lambda: self.encoder.feed(pcm) + self.encoder.finish()))
            try:
                data = await asyncio.shield(encoding)
            except asyncio.CancelledError:
                # A cancelled await does not stop the thread: closing the encoder (PyAV's container) under it would
                # free what it is encoding with (a segfault of the whole server: mp3, a client leaving mid-encode).
                # Let it end first; its result goes nowhere.
                with contextlib.suppress(BaseException):
                    await encoding
                raise
        except asyncio.CancelledError:
            await self.close(499, "client_disconnect")
            raise
        except BaseException as e:
            await self.close(e.status if isinstance(e, APIError) else 500, "error")
            raise
        self.tracker.sent(len(pcm) / self.plan.sample_rate)
        await self.close(200)
        return data

    async def _collect(self) -> np.ndarray:
        parts = []
        async for out in self.outputs():
            if isinstance(out, AudioChunk):
                parts.append(np.frombuffer(out.pcm, dtype="<f4"))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    # ---- streams ---------------------------------------------------------------------------------------------
    def stream_response(self) -> "EngineStreamResponse":
        if self.plan.mode == "sse":
            body, media_type = self._sse(), "text/event-stream"
            headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        else:
            body, media_type = self._audio(), self.encoder.content_type
            headers = {}
        headers.update(self.plan.headers(self.encoder))
        headers.update(self.server_timing())
        return EngineStreamResponse(body, media_type=media_type, headers=headers, job=self)

    async def _encoded(self) -> AsyncIterator[bytes]:
        """Encoded bytes per engine chunk (b"" allowed), then the encoder's tail; raises StreamFailed if the
        engine ends the request with an error after audio went out."""
        sr = self.plan.sample_rate
        async for out in self.outputs():
            if isinstance(out, AudioChunk):
                data = self.encoder.feed(np.frombuffer(out.pcm, dtype="<f4"))
                yield data
                self.tracker.sent(out.num_samples / sr)
            elif out.reason in (FinishReason.EOS, FinishReason.LENGTH):
                yield self.encoder.finish()
            else:
                raise StreamFailed(out.error or out.reason.value)

    async def _audio(self) -> AsyncIterator[bytes]:
        async for data in self._encoded():
            if data:
                yield data

    async def _sse(self) -> AsyncIterator[bytes]:
        fmt = self.plan.response_format
        try:
            async for data in self._encoded():
                if data:
                    yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode(),
                                     "response_format": fmt})
        except StreamFailed as e:
            yield sse_event({"type": "speech.audio.error",
                             "error": {"message": f"synthesis failed: {e}", "type": "server_error",
                                       "code": "generation_failed"}})
            return
        yield sse_event({"type": "speech.audio.done", "usage": self.usage()})


class StreamFailed(Exception):
    """The engine ended a request with an error after its response had started."""


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def sse_event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def wait_disconnect(receive) -> None:
    """Returns when the client has gone (the request body has been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(awaitable, receive):
    """The result of `awaitable`, unless the client disconnects first: then `awaitable` is cancelled (an engine
    iterator's step: cancelling it aborts the engine request) and ClientGone is raised."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:                                                # also when this task is cancelled: leave nothing running
        if not work.done():
            work.cancel()
        gone.cancel()
        await asyncio.gather(work, gone, return_exceptions=True)
    if work.cancelled():
        raise ClientGone
    return work.result()


class EngineStreamResponse(Response):
    """A chunked response fed by a SpeechJob. Unlike Starlette's StreamingResponse it always watches for the
    client leaving (also while waiting for the engine's next chunk) and always closes the job: the engine request
    is aborted however the response ends (disconnect, error, cancellation)."""

    def __init__(self, body: AsyncIterator[bytes], *, media_type: str, headers: dict, job: SpeechJob):
        self.body_iterator = body
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(wait_disconnect(receive))
        status, reason, error = 200, None, None
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
            if pump.done() and not pump.cancelled() and pump.exception() is None:
                pass                                                # complete
            elif pump.done() and not pump.cancelled() and not isinstance(pump.exception(), OSError):
                error = pump.exception()
                status, reason = 500, "error"
            else:
                status, reason = 499, "client_disconnect"
        except BaseException:                                       # our task was cancelled (server stopping)
            status, reason = 499, "client_disconnect"
            raise
        finally:
            for task in (pump, gone):
                task.cancel()
            await asyncio.gather(pump, gone, return_exceptions=True)
            await self.body_iterator.aclose()
            await self.job.close(status, reason)
        # Ending without the final empty body (returning, or raising) makes the server close the connection
        # without the chunked terminator: the client sees a truncated body, not a complete short file.
        if isinstance(error, StreamFailed):
            log.warning("speech stream %s failed after it started: %s", self.job.plan.request.request_id, error)
        elif error is not None:
            raise error

    async def _pump(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
