"""One WebSocket speech session (StreamSession) of routes_ws.py's protocol, which that module's docstring describes:
a receive loop taking text, a sentence splitter, sentences generated a few at a time under the server's admission,
and one send loop giving their audio back in sentence order. routes_ws_elevenlabs.py builds its sessions on it."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import uuid
from dataclasses import dataclass, field, replace

from fastapi import WebSocket, WebSocketDisconnect

from voxflow.engine.client import EngineUnavailableError
from voxflow.engine.request import AudioChunk, FinishReason, SpeechRequest

from .errors import APIError
from .routes_speech import admit, release
from .text_split import SentenceSplitter
from .ws_config import SessionConfig, build_config

log = logging.getLogger(__name__)

CONFIG_TIMEOUT_S = 10.0
MAX_CONFIG_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_MESSAGE_BYTES = 128 * 1024
MAX_IN_FLIGHT = 4                    # sentences of one session generating at once
MAX_SENTENCE_CHARS = 400
ADMIT_WAIT_S = 60.0                  # a sentence waits this long for a server-wide slot before it is refused
_END = object()


# ---- the session -------------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Job:
    utterance: int
    index: int
    text: str
    request: SpeechRequest
    cfg: SessionConfig
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    error: str | None = None
    task: asyncio.Task | None = None
    tracker: object | None = None       # metrics.RequestTracker: TTFP, underruns, status, as HTTP requests
    refused: bool = False               # refused by the server's concurrency limit (counted as rejected, as a 429)
    submitted: float = 0.0              # loop time the sentence was accepted: its admission wait counts from here


@dataclass
class _UtteranceDone:
    utterance: int
    total: int


class _Close:
    pass


def wav_header(data_bytes: int, sample_rate: int) -> bytes:
    """44-byte RIFF header of a mono 16-bit PCM WAV holding `data_bytes` bytes of samples."""
    return (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data_bytes))


class StreamSession:
    def __init__(self, ws: WebSocket, state):
        self.ws, self.state, self.settings = ws, state, state.settings
        self.cfg: SessionConfig | None = None
        self.splitter: SentenceSplitter | None = None
        self.outq: asyncio.Queue = asyncio.Queue()
        self.jobs: set[_Job] = set()
        self.slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.send_lock = asyncio.Lock()
        self.utterance = 0
        self.sentence = 0                 # next sentence index in the current utterance
        self.utterance_chars = 0
        self.utterance_open = False
        self.pending = 0                  # jobs created but not yet fully sent
        self.closed = False
        self.idle_timeout_s = float(self.settings.ws_idle_timeout_s)

    # ---- sending ---------------------------------------------------------------------------------------------
    async def send_json(self, obj: dict) -> None:
        async with self.send_lock:
            await self.ws.send_text(json.dumps(obj, ensure_ascii=False))

    async def send_bytes(self, data: bytes) -> None:
        async with self.send_lock:
            await self.ws.send_bytes(data)

    async def error(self, message: str, **extra) -> None:
        with contextlib.suppress(Exception):
            await self.send_json({"type": "error", "message": message, **extra})

    # ---- lifecycle -------------------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.ws.accept()
        recv_task = asyncio.create_task(self._receive_loop())
        send_task = asyncio.create_task(self._send_loop())
        try:
            done, _ = await asyncio.wait({recv_task, send_task}, return_when=asyncio.FIRST_COMPLETED)
            if recv_task in done and not recv_task.exception() and recv_task.result() != "disconnect":
                self.outq.put_nowait(_Close())          # let the sender finish what was flushed
                await asyncio.wait({send_task})
                await self._close(1000)
            else:
                failed = next((t for t in done if t.exception() is not None), None)
                if failed is not None and isinstance(failed.exception(), WebSocketDisconnect):
                    pass                                # the client left while audio was being sent: not a failure
                elif failed is not None:
                    log.warning("ws session failed: %r", failed.exception())
                    await self.error("internal error; closing the session")
                    await self._close(1011)
        finally:
            for t in (recv_task, send_task):
                t.cancel()
            for job in list(self.jobs):
                if job.task is not None:
                    job.task.cancel()                   # aborts the engine request (generate's finally)
            # asyncio.wait, not gather: should this task itself be cancelled meanwhile (the server cancelling the
            # handler as the client leaves, as Starlette's TestClient does), gather would raise the CancelledError of
            # a child cancelled above instead of this task's own, and the canceller (an anyio cancel scope) would not
            # recognise it as its own and let it escape the scope; wait re-raises this task's own cancellation.
            tasks = {recv_task, send_task, *(j.task for j in self.jobs if j.task is not None)}
            await asyncio.wait(tasks)
            for t in tasks:
                if not t.cancelled():
                    t.exception()                       # retrieved: a failure that mattered was handled above
            for job in self.jobs:
                # Sentences never (fully) sent: their generation had ended (or had been refused) before the session
                # did, so no cancellation closed their record: they are the client's disconnects (no-op if closed).
                if job.tracker is not None:
                    job.tracker.finish(499, "client_disconnect")

    async def _close(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                await self.ws.close(code)

    # ---- receiving -------------------------------------------------------------------------------------------
    async def _receive_loop(self) -> str:
        """Returns "disconnect", "close" (session.close) or "timeout"."""
        recv: asyncio.Future | None = None
        try:
            while True:
                if recv is None:
                    recv = asyncio.ensure_future(self.ws.receive())
                timeout = CONFIG_TIMEOUT_S if self.cfg is None else self.idle_timeout_s
                done, _ = await asyncio.wait({recv}, timeout=timeout)
                if not done:
                    if self.cfg is not None and self.pending > 0:
                        continue                          # audio still coming: not idle
                    await self.error("timeout waiting for session.config" if self.cfg is None
                                     else f"idle timeout: no message for {timeout:g} s", code="timeout")
                    return "timeout"
                message, recv = recv.result(), None
                if message.get("type") == "websocket.disconnect":
                    return "disconnect"
                if await self._handle(message) == "close":
                    return "close"
        finally:
            if recv is not None:
                recv.cancel()

    async def _json_message(self, message: dict, limit: int) -> tuple[dict, int] | None:
        """A received frame as a JSON object and its text's length, or None once the client has been told what was
        wrong with it (binary, over `limit` bytes, not JSON, not an object)."""
        text = message.get("text")
        if text is None:
            if message.get("bytes") is not None:
                await self.error("binary messages are not accepted; send JSON text messages")
            return None
        if len(text) > limit:
            await self.error(f"message too large (limit {limit} bytes)")
            return None
        try:
            msg = json.loads(text)
        except (ValueError, RecursionError):      # RecursionError: nesting deeper than the interpreter's stack
            await self.error("invalid JSON message")
            return None
        if not isinstance(msg, dict):
            await self.error("messages must be JSON objects")
            return None
        return msg, len(text)

    async def _handle(self, message: dict) -> str | None:
        parsed = await self._json_message(message, MAX_CONFIG_MESSAGE_BYTES)
        if parsed is None:
            return None
        msg, size = parsed
        kind = msg.get("type")
        if kind != "session.config" and size > MAX_MESSAGE_BYTES:
            await self.error(f"message too large (limit {MAX_MESSAGE_BYTES} bytes; only session.config may be "
                             "larger)")
            return None
        if kind == "session.config":
            await self._configure(msg)
        elif kind == "session.close":
            if self.utterance_open:         # closing says the text is complete: speak the rest, not drop it
                self._input_done()
            return "close"
        elif kind not in ("input.text", "input.done"):
            await self.error(f"unknown message type {kind!r}")
        elif self.cfg is None:
            await self.error(f"expected session.config first, got {kind!r}")
        elif kind == "input.text":
            await self._input_text(msg)
        else:
            self._input_done()
        return None

    async def _configure(self, msg: dict) -> None:
        if self.utterance_open:
            await self.error("session.config cannot change while an utterance is in progress; send input.done "
                             "first")
            return
        try:
            cfg = await build_config(msg, self.state)
        except (ValueError, APIError, EngineUnavailableError) as e:     # ConfigError is a ValueError
            await self.error(f"invalid session.config: {getattr(e, 'message', None) or e}",
                             param=getattr(e, "param", None))
            return
        self.cfg = cfg
        max_chars = min(MAX_SENTENCE_CHARS, int(self.settings.max_input_chars))
        self.splitter = SentenceSplitter(cfg.split_granularity, max_sentence_chars=max_chars)

    async def _input_text(self, msg: dict) -> None:
        text = msg.get("text")
        if not isinstance(text, str):
            await self.error("input.text needs a string field 'text'")
            return
        limit = int(self.settings.ws_max_text_chars)
        if self.utterance_chars + len(text) > limit:
            await self.error(f"text limit exceeded: at most {limit} characters per utterance; this piece was "
                             "dropped", code="text_limit")
            return
        self.utterance_chars += len(text)
        if text:
            self.utterance_open = True
        for sentence in self.splitter.feed(text):
            self._submit(sentence)

    def _input_done(self) -> None:
        for sentence in self.splitter.flush():
            self._submit(sentence)
        self.outq.put_nowait(_UtteranceDone(self.utterance, self.sentence))
        self.utterance += 1
        self.sentence = 0
        self.utterance_chars = 0
        self.utterance_open = False

    def _submit(self, sentence: str) -> None:
        """Start generating a sentence now; the sender plays it in order."""
        request = replace(self.cfg.template, text=sentence, request_id=f"ws-{uuid.uuid4().hex}",
                          sampling=replace(self.cfg.template.sampling),
                          streaming=replace(self.cfg.template.streaming))
        job = _Job(self.utterance, self.sentence, sentence, request, self.cfg,
                   submitted=asyncio.get_running_loop().time())
        if self.state.metrics is not None:
            job.tracker = self.state.metrics.track(streaming=True)
        self.sentence += 1
        self.pending += 1
        self.jobs.add(job)
        job.task = asyncio.create_task(self._generate(job))
        self.outq.put_nowait(job)

    async def _admit(self, job: _Job) -> None:
        """Take one of the server-wide slots (shared with HTTP requests) in the admission FIFO, waiting up to
        ADMIT_WAIT_S for it, or raise admit's 429 APIError. An accepted sentence cannot be retried by the protocol,
        so it waits rather than fails at once. The wait counts from the sentence's acceptance, not from its turn:
        N queued sentences wait ADMIT_WAIT_S in all, not N times that. This session's sentences are admitted in
        their order (the sender plays them in order: a later one admitted first would only delay the earlier): their
        tasks start in sentence order, pass the FIFO semaphore `slots` in it, and nothing awaits between that and
        their place in the FIFO queue."""
        await admit(self.state, deadline=job.submitted + ADMIT_WAIT_S, retryable=False)

    async def _generate(self, job: _Job) -> None:
        admitted = False
        try:
            async with self.slots:
                # Sentences count against the server-wide limit like HTTP requests (a session cannot flood it).
                try:
                    await self._admit(job)
                    admitted = True
                except APIError as e:
                    job.error, job.refused = e.message, True
                    if job.tracker is not None:
                        job.tracker.discard()
                    return
                async with contextlib.aclosing(self.state.engine.generate(job.request)) as outputs:
                    async for out in outputs:
                        if isinstance(out, AudioChunk):
                            if out.pcm:
                                job.queue.put_nowait(out.pcm)
                        elif out.reason in (FinishReason.ERROR, FinishReason.ABORTED):
                            job.error = out.error or f"generation {out.reason.value}"
        except EngineUnavailableError as e:
            job.error = f"engine unavailable: {e}"
        except asyncio.CancelledError:
            job.error = "cancelled"
            if job.tracker is not None:
                job.tracker.finish(499, "client_disconnect")
            raise
        except Exception as e:                            # never let one sentence take the session down
            log.exception("ws sentence generation failed")
            job.error = f"internal error: {type(e).__name__}"
        finally:
            if admitted:
                release(self.state)
            job.queue.put_nowait(_END)

    # ---- sending, in order -----------------------------------------------------------------------------------
    async def _send_loop(self) -> None:
        while True:
            item = await self.outq.get()
            if isinstance(item, _Close):
                return
            if isinstance(item, _UtteranceDone):
                await self._send_utterance_done(item)
                continue
            status, reason = 499, "client_disconnect"   # how a record still open after sending is closed
            try:
                await self._send_job(item)
            except (WebSocketDisconnect, OSError, asyncio.CancelledError):
                raise                                   # the client left while it was being sent
            except Exception:
                status, reason = 500, "error"
                raise
            finally:
                self.pending -= 1
                self.jobs.discard(item)
                if item.tracker is not None:            # (a no-op when _send_job closed it)
                    item.tracker.finish(status, reason)

    async def _send_utterance_done(self, item: _UtteranceDone) -> None:
        await self.send_json({"type": "session.done", "utterance_index": item.utterance,
                              "total_sentences": item.total})

    async def _send_job(self, job: _Job) -> None:
        """A sentence's audio as it comes, framed; its record closed (tracker) once it is all sent."""
        cfg = job.cfg
        ids = {"utterance_index": job.utterance, "sentence_index": job.index}
        await self.send_json({"type": "audio.start", **ids, "sentence_text": job.text,
                              "format": cfg.response_format, "sample_rate": cfg.sample_rate, "channels": 1})
        total, parts = 0, []
        while True:
            piece = await job.queue.get()
            if piece is _END:
                break
            if cfg.stream_audio:
                await self.send_bytes(piece)
                total += len(piece)
                if job.tracker is not None:
                    job.tracker.sent(len(piece) / (2 * cfg.sample_rate))      # s16 mono
            else:
                parts.append(piece)
        if not cfg.stream_audio and job.error is None:
            data = b"".join(parts)
            if cfg.response_format == "wav":
                data = wav_header(len(data), cfg.sample_rate) + data
            await self.send_bytes(data)
            total = len(data)
            if job.tracker is not None:
                job.tracker.sent(len(b"".join(parts)) / (2 * cfg.sample_rate))
        if job.tracker is not None:
            job.tracker.finish(200 if job.error is None else 500, "error" if job.error else "eos")   # (refused: done)
        if job.error is not None:
            await self.error(f"generation failed for sentence {job.index}: {job.error}", **ids,
                             partial_audio=total > 0)
        await self.send_json({"type": "audio.done", **ids, "total_bytes": total, "error": job.error is not None})
