"""The one interface the API layer uses to talk to an engine, in-process or in its own process.

    client = InProcessEngineClient(core)        # or ProcessEngineClient(factory)
    await client.start()
    async for out in client.generate(request):  # AudioChunk..., then exactly one FinalRecord
        ...
    await client.shutdown(drain=True)

Contract (both implementations):
- `generate` yields the request's chunks in order and ends with exactly one `FinalRecord`.
  * Bad input (the core's `add_request` raised ValueError) -> a FinalRecord with reason ERROR and the
    ValueError's message, as the first and only output; other requests are not disturbed.
  * The engine dies mid-stream -> FinalRecord(ERROR, error="engine died: ...") (`ENGINE_DIED` prefix).
  * `abort(request_id)` -> FinalRecord(ABORTED); `shutdown(drain=False)` -> FinalRecord(ABORTED) for all.
  * The engine is dead, not started or shutting down -> `generate` raises `EngineUnavailableError` before
    anything is yielded (fail fast: the API answers 503 before sending any audio).
  * The consumer stops iterating early (client gone) -> the request is aborted in the engine when the
    generator is closed. `async for ... break` closes it soon after through asyncio's async-generator
    finaliser; wrap it in `contextlib.aclosing(...)` to abort at once.
- `health()` -> {"alive": bool, "in_flight": int, "stats": dict | None, "error": str | None}; never raises.

This module also holds the client-side plumbing both implementations share: the per-request output queues
(`RequestStreams`) and the generate/abort/shutdown logic; a subclass only moves commands to the engine and
outputs back (`_submit`, `_send_abort`, `_engine_call`, `_stop`) and reports a dead engine (`_engine_died`).
All of it runs on the event loop's thread; engine threads / sockets hand outputs over with `_route_outputs`.
"""
from __future__ import annotations

import abc
import asyncio
from typing import Any, AsyncIterator, Iterable

from .request import AudioChunk, FinalRecord, FinishReason, SpeechRequest

EngineOutput = AudioChunk | FinalRecord
ENGINE_DIED = "engine died"


class EngineUnavailableError(RuntimeError):
    """The engine cannot take requests: not started, shutting down, shut down or dead (message says which)."""


class EngineStartupError(RuntimeError):
    """The engine could not be built (the message carries the engine's own error) or did not get ready."""


async def wait_within(awaitable, timeout: float | None):
    """asyncio.wait_for that never swallows the caller's cancellation (before Python 3.12 wait_for does when
    the inner future completes in the same turn, which turns a cancelled poller into an endless one)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        raise asyncio.TimeoutError
    return task.result()


class RequestStreams:
    """Per-request asyncio queues of outputs. A stream closes when its FinalRecord is routed (or when it is
    closed explicitly); anything routed to a closed stream is dropped, which is what makes "exactly one
    FinalRecord" hold when several parties end a request at once (engine, abort, death, shutdown)."""

    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[EngineOutput]] = {}
        self._empty = asyncio.Event()
        self._empty.set()

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._queues

    def __len__(self) -> int:
        return len(self._queues)

    def open(self, request_id: str) -> asyncio.Queue[EngineOutput]:
        if request_id in self._queues:
            raise KeyError(request_id)
        q: asyncio.Queue[EngineOutput] = asyncio.Queue()
        self._queues[request_id] = q
        self._empty.clear()
        return q

    def route(self, out: EngineOutput) -> None:
        q = self._queues.get(out.request_id)
        if q is None:
            return                      # consumer gone or request already ended: drop
        q.put_nowait(out)
        if isinstance(out, FinalRecord):
            self._remove(out.request_id)

    def close(self, request_id: str) -> bool:
        """Forget a stream without a record (its consumer left). True if it was still open."""
        if request_id not in self._queues:
            return False
        self._remove(request_id)
        return True

    def finish_all(self, reason: FinishReason, error: str | None = None, error_kind: str | None = None) -> None:
        for rid in list(self._queues):
            self.route(FinalRecord(request_id=rid, reason=reason, error=error, error_kind=error_kind))

    async def wait_empty(self) -> None:
        await self._empty.wait()

    def _remove(self, request_id: str) -> None:
        del self._queues[request_id]
        if not self._queues:
            self._empty.set()


class EngineClient(abc.ABC):
    """Async facade over a synchronous EngineCore running elsewhere (a thread or a process)."""

    def __init__(self) -> None:
        self._streams = RequestStreams()
        self._started = False
        self._closing = False           # shutdown began: reject new requests
        self._down_reason: str | None = None   # set once the engine is gone (died or shut down)
        self._shut_down = asyncio.Event()
        self._model_info: dict = {}

    # ---- what a subclass provides ------------------------------------------------------------------------
    @abc.abstractmethod
    async def start(self) -> None:
        """Start the engine (thread / process); must be called on the loop that will use the client."""

    @abc.abstractmethod
    def _submit(self, request: SpeechRequest) -> None:
        """Hand a request to the engine (non-blocking)."""

    @abc.abstractmethod
    def _send_abort(self, request_id: str) -> None:
        """Tell the engine to abort (non-blocking; it answers with an ABORTED record if still running)."""

    @abc.abstractmethod
    async def _engine_call(self, method: str, args: list) -> Any:
        """Run CoreDriver.call(method, args) on the engine's thread / process and return its result; a
        ValueError there is raised here as ValueError (bad input), anything else as RuntimeError."""

    async def _engine_stats(self) -> dict:
        return await self._engine_call("stats", [])

    async def _load_model_info(self) -> None:
        """Called by start(): what the served model is (its core's info(); {} for cores without one)."""
        try:
            self._model_info = await self._engine_call("info", [])
        except (AttributeError, RuntimeError, ValueError):
            self._model_info = {}

    @abc.abstractmethod
    async def _stop(self) -> None:
        """Abort whatever the engine still runs, shut the core down and release the thread / process."""

    # ---- the interface -------------------------------------------------------------------------------------
    @property
    def model_info(self) -> dict:
        """name, family, task, sample_rate, voices, languages, supports_instructions (after start)."""
        return self._model_info

    async def create_voice(self, ref_audio: bytes, ref_text: str | None, x_vector_only: bool) -> dict:
        """A voice-clone prompt computed once by the engine (float32 mono PCM at the model rate in); plain data
        to store and send back as SpeechRequest.voice_clone_prompt. ValueError on bad input."""
        self._check_accepting()
        return await self._engine_call("create_voice", [ref_audio, ref_text, x_vector_only])

    @property
    def is_alive(self) -> bool:
        return self._started and self._down_reason is None

    async def generate(self, request: SpeechRequest) -> AsyncIterator[EngineOutput]:
        self._check_accepting()
        rid = request.request_id
        if rid in self._streams:
            yield FinalRecord(request_id=rid, reason=FinishReason.ERROR,
                              error=f"request id {rid!r} is already in flight")
            return
        queue = self._streams.open(rid)
        finished = False
        try:
            self._submit(request)
            while True:
                out = await queue.get()
                if isinstance(out, FinalRecord):
                    finished = True
                yield out
                if finished:
                    return
        finally:
            # Consumer left early (GeneratorExit / cancellation): stop the engine working for nobody.
            if not finished and self._streams.close(rid) and self.is_alive:
                self._send_abort(rid)

    async def abort(self, request_id: str) -> None:
        if self.is_alive and request_id in self._streams:
            self._send_abort(request_id)

    async def health(self, timeout: float = 5.0) -> dict:
        report = {"alive": self.is_alive, "in_flight": len(self._streams), "stats": None,
                  "error": self._down_reason}
        if not self.is_alive:
            if not self._started:
                report["error"] = "engine not started"
            return report
        try:
            report["stats"] = await wait_within(self._engine_stats(), timeout)
        except asyncio.TimeoutError:
            report["error"] = f"engine did not answer within {timeout} s"
        except Exception as e:          # stats failed, or the engine died while we asked
            report["alive"] = self.is_alive
            report["error"] = self._down_reason or f"stats failed: {type(e).__name__}: {e}"
        return report

    async def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """drain: reject new requests, let in-flight ones finish (up to `timeout` s, then abort the rest);
        else abort everything now. Idempotent."""
        if self._closing:
            await self._shut_down.wait()    # a second caller returns when the first one is done
            return
        self._closing = True
        try:
            await self._shutdown(drain, timeout)
        finally:
            self._shut_down.set()

    async def _shutdown(self, drain: bool, timeout: float | None) -> None:
        if drain and self.is_alive and len(self._streams):
            try:
                await wait_within(self._streams.wait_empty(), timeout)
            except asyncio.TimeoutError:
                pass
        self._streams.finish_all(FinishReason.ABORTED, "engine shut down")
        if not self._started:
            return
        try:
            await self._stop()              # also releases a dead engine's thread / process / sockets
        finally:
            if self._down_reason is None:
                self._down_reason = "engine shut down"

    async def __aenter__(self) -> "EngineClient":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown(drain=False)

    # ---- for subclasses ------------------------------------------------------------------------------------
    def _route_outputs(self, outputs: Iterable[EngineOutput]) -> None:
        for out in outputs:
            self._streams.route(out)

    def _engine_died(self, message: str) -> None:
        """The engine is gone unexpectedly: every in-flight request ends with an ERROR record, now."""
        if self._down_reason is not None:
            return
        self._down_reason = f"{ENGINE_DIED}: {message}"
        self._streams.finish_all(FinishReason.ERROR, self._down_reason, "engine_died")

    def _check_accepting(self) -> None:
        if not self._started:
            raise EngineUnavailableError("engine not started")
        if self._down_reason is not None:
            raise EngineUnavailableError(self._down_reason)
        if self._closing:
            raise EngineUnavailableError("engine is shutting down")
