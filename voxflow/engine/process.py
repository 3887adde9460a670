"""Run the EngineCore in its own process (serving): the model's weights and CUDA context live only there.

    client = ProcessEngineClient(factory)   # factory: picklable, zero-argument, returns an EngineCore;
    await client.start()                    #   called inside the engine process (e.g. partial(build, config))

Transport: one ZeroMQ DEALER (engine) / ROUTER (client) pair over ipc:// in a private temp dir; every frame
is one msgpack message (`wire.py`), a list headed by its kind:
    client -> engine: ["add", request] ["abort", request_id] ["call", token, method, args] ["stop"] ["bye"]
    engine -> client: ["ready", info] ["startup_error", summary, traceback] ["out", [output, ...]]
                      ["result", token, value | None, error | None, error kind | None]
                      ["died", summary, traceback] ["stopped"]
The engine binds nothing: it connects, and its "ready" tells the ROUTER its address, so nothing the client
sends can be lost to a connection not yet made.

Crash detection does not depend on the engine saying goodbye: the client watches the process's sentinel
(readable when it exits, whatever killed it). When the engine dies of an exception it sends "died" with the
traceback and waits for "bye" before exiting, so its message is read before its exit is noticed. The engine
in turn watches its parent's sentinel and exits if the API process disappears (no orphaned GPU holder).
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import traceback
import weakref
from typing import Any, Callable

import zmq
import zmq.asyncio

from . import wire
from .client import EngineClient, EngineStartupError, wait_within
from .gc_freeze import freeze_core_startup
from .request import SpeechRequest

log = logging.getLogger(__name__)

_BYE_WAIT_S = 10.0         # engine's last words: how long to wait for the client to acknowledge them


# ================================ engine process ==========================================================
def run_engine_process(factory: Callable[[], Any], address: str) -> None:
    """Entry point of the engine process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the API process's to handle; it stops us
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 0)                  # never block the step loop on a slow reader
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 2000)               # flush the last outputs before exiting
    sock.connect(address)
    try:
        try:
            core = factory()
        except BaseException as e:
            _last_words(sock, "startup_error", e)
            return
        # Everything built so far (weights, graphs, tokenizer, caches) lives as long as the process: out of the
        # garbage collector's sight, so that a collection while serving scans only what requests create.
        freeze_core_startup(core)
        startup = getattr(core, "startup", None)        # graph capture seconds, peak GPU memory, KV pool ...
        sock.send(wire.pack(["ready", {"pid": os.getpid(), "startup": startup}]))
        from .inprocess import CoreDriver           # (here, not at the top: the API process imports this module
        driver = CoreDriver(core)                   # for its client, and inprocess brings torch with the engine)
        try:
            _serve(sock, driver)
        except BaseException as e:
            _last_words(sock, "died", e)
            try:
                core.shutdown()
            except BaseException:
                pass
    finally:
        sock.close()
        ctx.term()


def _serve(sock: zmq.Socket, driver) -> None:          # driver: inprocess.CoreDriver
    """Busy while the core has work (poll without waiting between steps), asleep in poll() when idle (after
    polling without sleeping for `EngineConfig.idle_spin_ms` since the last work, when that is set)."""
    parent = multiprocessing.parent_process()
    parent_fd = parent.sentinel if parent is not None else None
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if parent_fd is not None:
        poller.register(parent_fd, zmq.POLLIN)

    def send_outputs(outs: list) -> None:
        if outs:
            sock.send(wire.pack(["out", [wire.encode_output(o) for o in outs]]))

    deferred: collections.deque = collections.deque()   # read by take_arrivals, not an add: the loop's next

    def receive() -> list | None:
        if deferred:
            return deferred.popleft()
        try:
            return wire.unpack(sock.recv(zmq.NOBLOCK))
        except zmq.Again:
            return None

    def take_arrivals() -> None:
        """Called by the core while it waits for the GPU mid-step (EngineConfig.intake_while_waiting): the adds
        waiting in the socket go in as one batch now. The first other message stops the reading and waits for the
        loop, with everything behind it, so the messages keep their order."""
        if deferred or not driver.batches_adds():
            return
        batch = []
        while (msg := receive()) is not None:
            if msg[0] != "add":
                deferred.append(msg)
                break
            batch.append(wire.decode_request(msg[1]))
        if batch:
            driver.last_work = time.monotonic()
            send_outputs(driver.add_many(batch))

    while True:
        if driver.has_work() or deferred:
            timeout = 0
        else:
            idle = driver.idle_poll_timeout(time.monotonic())
            timeout = None if idle is None else int(idle * 1e3)
        events = dict(poller.poll(timeout))
        if parent_fd is not None and parent_fd in events:
            driver.core.shutdown()      # API process gone: nobody to serve
            return
        since = time.monotonic()
        ahead = None                    # a message read while collecting adds: the next one to handle
        # Pacing, when configured, spreads a burst over steps (inprocess.py); a message already read is handled.
        while ahead is not None or driver.may_take_more(since):
            msg, ahead = ahead or receive(), None
            if msg is None:
                break
            kind = msg[0]
            driver.last_work = time.monotonic()
            if kind == "add":
                # The adds waiting right behind it join it: a burst of arrivals is prepared in one batched pass.
                batch = [wire.decode_request(msg[1])]
                while driver.batches_adds() and (ahead := receive()) is not None and ahead[0] == "add":
                    batch.append(wire.decode_request(ahead[1]))
                    ahead = None
                send_outputs(driver.add_many(batch))
            elif kind == "abort":
                send_outputs(driver.abort(msg[1]))
            elif kind == "call":
                _, token, method, args = msg
                try:
                    sock.send(wire.pack(["result", token, driver.call(method, args), None, None]))
                except ValueError as e:    # bad input: the caller's answer
                    sock.send(wire.pack(["result", token, None, str(e), "invalid_request"]))
                except Exception as e:     # a failing call is the caller's answer, not the engine's death
                    sock.send(wire.pack(["result", token, None, f"{type(e).__name__}: {e}", "internal"]))
            elif kind == "stop":
                send_outputs(driver.stop())
                sock.send(wire.pack(["stopped"]))
                return
        if driver.has_work():
            send_outputs(driver.step(emit=send_outputs, arrivals=take_arrivals))


def _last_words(sock: zmq.Socket, kind: str, e: BaseException) -> None:
    """Send a fatal error (one-line summary for records and health, traceback for the log) and wait until
    the client has read it, so that it is never raced by our exit."""
    sock.send(wire.pack([kind, f"{type(e).__name__}: {e}", "".join(traceback.format_exception(e))]))
    deadline = time.monotonic() + _BYE_WAIT_S
    while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000) + 1):
        if wire.unpack(sock.recv())[0] == "bye":    # skip late adds / aborts
            return


# ================================ client (API process) ====================================================
class ProcessEngineClient(EngineClient):
    def __init__(self, factory: Callable[[], Any], *, startup_timeout: float = 600.0,
                 stop_timeout: float = 30.0) -> None:
        super().__init__()
        self._factory = factory
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, self._res.release)
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._identity: bytes | None = None
        self._exited: asyncio.Future | None = None
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._call_waiters: dict[int, asyncio.Future] = {}
        self.startup: dict | None = None        # the engine's startup report (KV pool, graph capture, memory)
        self._tokens = itertools.count()
        self._stopping = False
        self._pid: int | None = None

    @property
    def pid(self) -> int | None:
        return self._pid

    async def start(self) -> None:
        if self._started:
            return
        loop = asyncio.get_running_loop()
        res = self._res
        res.ipc_dir = tempfile.mkdtemp(prefix="voxflow-engine-")
        address = f"ipc://{res.ipc_dir}/engine.sock"
        res.ctx = zmq.asyncio.Context()
        self._sock = res.sock = res.ctx.socket(zmq.ROUTER)
        for opt, val in ((zmq.LINGER, 0), (zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.ROUTER_MANDATORY, 1)):
            self._sock.setsockopt(opt, val)
        self._sock.bind(address)
        try:
            self._proc = multiprocessing.get_context("spawn").Process(
                target=run_engine_process, args=(self._factory, address), name="voxflow-engine", daemon=True)
            self._proc.start()          # an unpicklable factory fails here, in the caller's face
            res.proc, self._pid = self._proc, self._proc.pid
            self._exited = loop.create_future()
            sentinel = self._proc.sentinel

            def on_exit() -> None:
                loop.remove_reader(sentinel)
                if not self._exited.done():
                    self._exited.set_result(None)
            loop.add_reader(sentinel, on_exit)
            await self._await_ready()
        except BaseException:
            await self._release()
            raise
        self._started = True
        self._reader = loop.create_task(self._read_loop())
        self._watcher = loop.create_task(self._watch_exit())
        await self._load_model_info()

    async def _await_ready(self) -> None:
        recv = asyncio.ensure_future(self._sock.recv_multipart())
        try:
            await asyncio.wait({recv, self._exited}, timeout=self._startup_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not recv.done():
                recv.cancel()
        if recv.cancelled():
            if self._exited.done():
                raise EngineStartupError(f"engine process died during startup ({await self._exit_text()})")
            raise EngineStartupError(f"engine not ready after {self._startup_timeout} s")
        identity, frame = recv.result()
        msg = wire.unpack(frame)
        self._identity = identity
        if msg[0] == "startup_error":
            self._send(["bye"])
            raise EngineStartupError(f"engine failed to start: {msg[1]}\n{msg[2]}")
        if msg[0] != "ready":
            raise EngineStartupError(f"unexpected first message from the engine: {msg[0]!r}")
        self.startup = (msg[1] or {}).get("startup")
        if self.startup:
            log.info("engine ready: %s", self.startup)

    # ---- talking to the engine -----------------------------------------------------------------------------
    def _send(self, msg: list) -> None:
        # NOBLOCK + unlimited HWM: the send completes (or fails) now, so messages keep their order.
        fut = self._sock.send_multipart([self._identity, wire.pack(msg)], flags=zmq.NOBLOCK)
        fut.add_done_callback(_log_send_failure)

    def _submit(self, request: SpeechRequest) -> None:
        self._send(["add", wire.encode_request(request)])

    def _send_abort(self, request_id: str) -> None:
        self._send(["abort", request_id])

    async def _engine_call(self, method: str, args: list) -> Any:
        token = next(self._tokens)
        fut = asyncio.get_running_loop().create_future()
        self._call_waiters[token] = fut
        try:
            self._send(["call", token, method, args])
            return await fut
        finally:
            self._call_waiters.pop(token, None)

    async def _read_loop(self) -> None:
        try:
            while True:
                _, frame = await self._sock.recv_multipart()
                self._dispatch(wire.unpack(frame))
        except asyncio.CancelledError:
            raise
        except Exception as e:          # a message we cannot read: the two sides disagree, stop trusting it
            log.exception("bad message from the engine process")
            self._engine_died(f"unreadable message from the engine ({type(e).__name__}: {e})")
            self._fail_call_waiters()
            self._proc.kill()

    def _dispatch(self, msg: list) -> None:
        kind = msg[0]
        if kind == "out":
            self._route_outputs(wire.decode_output(item) for item in msg[1])
        elif kind == "result":
            _, token, value, err, err_kind = msg
            fut = self._call_waiters.get(token)
            if fut is None or fut.done():
                return                  # its caller (e.g. a health() check) timed out meanwhile
            if err is None:
                fut.set_result(value)
            else:
                fut.set_exception(ValueError(err) if err_kind == "invalid_request" else RuntimeError(err))
        elif kind == "died":
            self._send(["bye"])
            log.error("engine process died:\n%s", msg[2])
            self._engine_died(msg[1])      # the summary only: records reach end users, tracebacks must not
            self._fail_call_waiters()
        elif kind != "stopped":
            log.warning("ignoring engine message %r", kind)

    async def _watch_exit(self) -> None:
        await self._exited
        self._reader.cancel()           # a cancelled recv leaves its message in the socket: drain it below
        try:
            await self._reader
        except asyncio.CancelledError:
            pass
        while True:                     # outputs (or "died") sent just before the exit
            try:
                _, frame = await self._sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            self._dispatch(wire.unpack(frame))
        if not self._stopping:
            self._engine_died(await self._exit_text())
        self._fail_call_waiters()

    def _fail_call_waiters(self) -> None:
        for fut in self._call_waiters.values():
            if not fut.done():
                fut.set_exception(RuntimeError(self._down_reason or "engine stopped"))

    async def _exit_text(self) -> str:
        # The sentinel turns readable while the kernel tears the process down, a moment before it can be
        # reaped: wait for the reap (off the loop) so that exitcode is known.
        await asyncio.get_running_loop().run_in_executor(None, self._proc.join)
        code = self._proc.exitcode
        if code is not None and code < 0:
            return f"engine process killed by {signal.Signals(-code).name}"
        return f"engine process exited with code {code}"

    # ---- stopping ------------------------------------------------------------------------------------------
    async def _stop(self) -> None:
        self._stopping = True
        if not self._exited.done():
            self._send(["stop"])
            try:
                await wait_within(asyncio.shield(self._exited), self._stop_timeout)
            except asyncio.TimeoutError:
                log.warning("engine process did not stop within %s s: killing it", self._stop_timeout)
                self._proc.kill()
        await self._watcher
        await self._release()

    async def _release(self) -> None:
        if self._proc is not None and self._pid is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self._proc.sentinel)
            if self._proc.exitcode is None:
                self._proc.kill()
            await loop.run_in_executor(None, self._proc.join)
        self._finalizer()


class _Resources:
    """What the client holds outside Python: the engine process, the socket and its context, the ipc dir.

    Released once: by shutdown, or by a finaliser when a client is dropped without one. That matters: when
    garbage collection takes a client, its zmq context may be finalised before its socket is closed, and a
    context terminated with an open socket blocks forever (a failed test would hang the whole run)."""

    def __init__(self) -> None:
        self.proc: multiprocessing.process.BaseProcess | None = None
        self.ctx: zmq.asyncio.Context | None = None
        self.sock: zmq.asyncio.Socket | None = None
        self.ipc_dir: str | None = None

    def release(self) -> None:
        if self.proc is not None:
            if self.proc.exitcode is None:
                self.proc.kill()
                self.proc.join(5)
            if self.proc.exitcode is not None:
                self.proc.close()
        if self.sock is not None:
            self.sock.close(linger=0)
        if self.ctx is not None:
            self.ctx.term()
        if self.ipc_dir is not None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)


def _log_send_failure(fut: asyncio.Future) -> None:
    # The engine is gone (unroutable): the exit watcher reports that; here we only keep asyncio quiet.
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("send to engine failed: %s", fut.exception())
