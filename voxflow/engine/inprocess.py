"""Run an EngineCore on a background thread of this process (tests, offline synthesis, notebooks).

The engine side of both clients is `CoreDriver`: the only code that touches the (single-threaded) core. It
turns a bad request into an ERROR record, answers an abort with an ABORTED record, and forwards only
outputs of requests it still considers live, so each accepted request gets exactly one FinalRecord from
here whatever the core does after an abort. The engine process (`process.py`) runs the same driver.

Threading: the core lives on the engine thread. The event loop posts commands to a deque and sets an event;
the thread steps while the core has work and sleeps on the event when idle; outputs of one step go back to
the loop in one `call_soon_threadsafe`.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
import traceback
from typing import Any, Callable

from .client import EngineClient, EngineOutput
from .core_driving import add_to_core, arrivals_while_waiting, early_outputs, refusal_kind
from .request import FinalRecord, FinishReason, SpeechRequest

log = logging.getLogger(__name__)


class CoreDriver:
    """Owns an EngineCore (add_request / abort / step / has_work / stats / shutdown) on one thread."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.live: set[str] = set()
        config = getattr(core, "config", None)
        self.add_seconds = getattr(config, "add_seconds_per_step", None)
        self.idle_spin = (getattr(config, "idle_spin_ms", 0.0) or 0.0) / 1e3
        self.intake = bool(getattr(config, "intake_while_waiting", False))     # lend `arrivals` to the core's steps
        self.last_work = time.monotonic()

    def idle_poll_timeout(self, now: float) -> float | None:
        """How long an idle loop may block waiting for a command, in seconds: 0 (poll and come back) within
        `EngineConfig.idle_spin_ms` of the last work, else None (until one comes). Spinning keeps the engine's core
        out of its sleep states, so a request arriving shortly after the last one does not pay the wake-up; it
        costs one core while it lasts. Only the engine process spins (engine/process.py): the in-process driver's
        thread shares the GIL with the event loop."""
        return 0.0 if now - self.last_work < self.idle_spin else None

    def may_take_more(self, since: float) -> bool:
        """Whether to take another command before the next step (`since`: time.monotonic() after the last one).

        Optional pacing (`EngineConfig.add_seconds_per_step`, off by default): while streams run, the prompt builds
        of a burst of arrivals are spread over steps: new requests are taken until that much time went to them
        since the last step, the rest wait in the queue (nothing is lost or reordered). On an H200 a wave of 16-64
        arrivals took 45-115 ms of prompt builds in one go (session-6 step trace), stalling every running stream.
        Pacing at 4 ms measured (1.7B, HTTP, session 7): c=16 TTFP p50 / p99 138 / 154 -> 105 / 145 ms, but c=64
        446.1 -> 406.5 audio-s/s and p99 326 -> 413 ms (more, smaller prefill steps): off unless asked for."""
        return (self.add_seconds is None or not self.core.has_work()
                or time.monotonic() - since < self.add_seconds)

    def batches_adds(self) -> bool:
        """Whether to hand every add waiting now to `add_many` as one batch (the loops below collect them): yes
        unless pacing is on while streams run, where requests are taken one at a time against the time budget
        (`may_take_more`); an idle core takes the whole burst, as `may_take_more` does."""
        return self.add_seconds is None or not self.core.has_work()

    def add(self, request: SpeechRequest) -> list[EngineOutput]:
        return self.add_many([request])

    def add_many(self, requests: list[SpeechRequest]) -> list[EngineOutput]:
        """Requests that arrived together, their prompts built in one batched pass (`EngineCore.add_requests`);
        an ERROR record for each one refused, as if they had been added one by one (an id repeated in the batch
        splits it there: the repeat is judged after the first is in)."""
        outs, batch, ids = [], [], set()
        for request in requests:
            rid = request.request_id
            if rid in ids:
                outs += self._add_batch(batch)
                batch, ids = [], set()
            if rid in self.live:
                outs.append(FinalRecord(request_id=rid, reason=FinishReason.ERROR,
                                        error=f"request id {rid!r} is already in flight"))
            else:
                batch.append(request)
                ids.add(rid)
        return outs + self._add_batch(batch)

    def _add_batch(self, batch: list[SpeechRequest]) -> list[EngineOutput]:
        if not batch:
            return []
        errors = add_to_core(self.core, batch)
        outs = []
        for request, error in zip(batch, errors):
            rid = request.request_id
            if error is None:
                self.live.add(rid)
            else:
                outs.append(FinalRecord(request_id=rid, reason=FinishReason.ERROR,
                                        error=str(error) or type(error).__name__, error_kind=refusal_kind(error)))
        return outs

    def abort(self, request_id: str) -> list[EngineOutput]:
        if request_id not in self.live:
            return []                   # finished already, or never accepted
        self.live.discard(request_id)
        self.core.abort(request_id)
        return [FinalRecord(request_id=request_id, reason=FinishReason.ABORTED)]

    def has_work(self) -> bool:
        return self.core.has_work()

    def step(self, emit: Callable[[list[EngineOutput]], None] | None = None,
             arrivals: Callable[[], None] | None = None) -> list[EngineOutput]:
        """The core's step; its outputs for requests still live. `emit`: where the outputs the core has ready
        before the step ends go at once (EngineConfig.emit_while_waiting; a core without `emit_early` ignores it).
        `arrivals`: what the core may call while it waits for the GPU to take in the requests that arrived meanwhile
        (EngineConfig.intake_while_waiting, else not lent: the engine process's loop reads its socket's adds into
        `add_many`)."""
        self.last_work = time.monotonic()
        with contextlib.ExitStack() as lent:
            if emit is not None:
                lent.enter_context(early_outputs(self.core, lambda outs: emit(self._live_outputs(outs))))
            if arrivals is not None and self.intake:
                lent.enter_context(arrivals_while_waiting(self.core, arrivals))
            return self._live_outputs(self.core.step())

    def _live_outputs(self, outputs: list[EngineOutput]) -> list[EngineOutput]:
        outs = []
        for out in outputs:
            if out.request_id not in self.live:
                continue                # aborted meanwhile: its ABORTED record has been sent
            if isinstance(out, FinalRecord):
                self.live.discard(out.request_id)
            outs.append(out)
        return outs

    def stats(self) -> dict:
        return self.core.stats()

    # Read-only or self-contained requests the API may make of the core besides generating speech.
    CALLS = ("stats", "info", "create_voice")

    def call(self, method: str, args: list) -> Any:
        if method not in self.CALLS:
            raise ValueError(f"unknown engine call {method!r}")
        if method == "stats":
            return self.stats()
        return getattr(self.core, method)(*args)

    def stop(self) -> list[EngineOutput]:
        outs = []
        for rid in list(self.live):
            outs += self.abort(rid)
        self.core.shutdown()
        return outs


class InProcessEngineClient(EngineClient):
    def __init__(self, engine_core: Any) -> None:
        super().__init__()
        self._driver = CoreDriver(engine_core)
        self._commands: collections.deque[tuple] = collections.deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="voxflow-engine", daemon=True)
        self._started = True
        self._thread.start()
        await self._load_model_info()

    # ---- loop side ---------------------------------------------------------------------------------------
    def _post(self, *command: Any) -> None:
        self._commands.append(command)
        self._wake.set()

    def _submit(self, request: SpeechRequest) -> None:
        self._post("add", request)

    def _send_abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    async def _engine_call(self, method: str, args: list) -> Any:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._post("call", (fut, method, args))
        return await asyncio.wrap_future(fut)

    async def _stop(self) -> None:
        # Joining (not waiting for an answer) cannot hang on a thread that died meanwhile.
        self._post("stop", None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    # ---- engine thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        d = self._driver
        try:
            while True:
                since = time.monotonic()
                while self._commands and d.may_take_more(since):
                    cmd, arg = self._commands.popleft()
                    if cmd == "add":
                        batch = [arg]           # and the adds right behind it: one batched prompt build
                        while d.batches_adds() and self._commands and self._commands[0][0] == "add":
                            batch.append(self._commands.popleft()[1])
                        self._emit(d.add_many(batch))
                    elif cmd == "abort":
                        self._emit(d.abort(arg))
                    elif cmd == "call":
                        fut, method, args = arg
                        _settle(fut, lambda: d.call(method, args))
                    elif cmd == "stop":
                        self._emit(d.stop())
                        return
                if d.has_work():
                    # (no early outputs here: polling while the GPU runs would take the GIL from the event loop's
                    # thread every ~0.1 ms; the engine process and the offline runners take them)
                    self._emit(d.step())
                elif not self._commands:
                    # No lost wake-up: a command posted after the check above has set the event.
                    self._wake.wait()
                    self._wake.clear()
        except BaseException as e:
            log.exception("engine thread died")
            message = f"{type(e).__name__}: {e}"
            self._to_loop(self._engine_died, message)
            self._fail_pending(message)
            try:
                self._driver.core.shutdown()    # best effort: free what it holds
            except BaseException:
                log.warning("core.shutdown() after a crash failed:\n%s", traceback.format_exc())

    def _emit(self, outputs: list[EngineOutput]) -> None:
        if outputs:
            self._to_loop(self._route_outputs, outputs)

    def _to_loop(self, fn: Callable, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:            # loop closed: nobody is listening any more
            pass

    def _fail_pending(self, message: str) -> None:
        # A health() waiting for stats must not wait for its timeout on a dead thread.
        while self._commands:
            cmd, arg = self._commands.popleft()
            if cmd == "call" and not arg[0].done():
                arg[0].set_exception(RuntimeError(f"engine died: {message}"))


def _settle(fut: concurrent.futures.Future, fn: Callable[[], Any]) -> None:
    if not fut.set_running_or_notify_cancel():
        return                          # its health() call timed out: setting a result now would raise
    try:
        fut.set_result(fn())
    except Exception as e:              # a failing call is reported to its caller, it does not kill the engine
        fut.set_exception(e)
