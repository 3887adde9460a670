"""Server-wide admission: the slots of settings.max_concurrent_requests and one fair FIFO of those waiting for them.

Every speech request holds a slot while it runs: a POST /v1/audio/speech request, each item of a batch (queued
one after another: routes_batch.py), each WebSocket sentence. All of them wait in the same queue, in arrival order.

Why HTTP requests wait too. Before this queue, an HTTP request found full was answered 429 at once, while
WebSocket sentences (their text was accepted: they cannot be retried) polled for a slot every 50 ms. A freed slot
went to whoever looked first, almost never an HTTP client retrying after Retry-After: a soak test saw 26-31 % of
them still refused after 8 retries. Answering 429 also whenever someone is queued would stop HTTP from jumping the
queue but starve it under a steady WebSocket load (someone is always queued). So an HTTP request takes its place in
the queue and waits there up to settings.admission_wait_s (serve --admission-wait-s, a few seconds: OpenAI-style
clients expect a slow answer rather than a 429), then gets its 429 with Retry-After. 0 keeps the old immediate
429, now also given when others are queued, so that a request never overtakes one that came earlier. A WebSocket
sentence waits up to ws_session.ADMIT_WAIT_S, counted from its acceptance.

The order is strict: the head of the queue, when it needs more slots than are free (`acquire(n)` with n > 1; the
API asks for one at a time), holds back everyone behind it until enough are freed, so a large request is never
starved by small ones that keep fitting first. The queue holds at most `max_waiting` slots asked for
(settings.max_queued_requests); an HTTP request that would go beyond is refused at once rather than holding its
connection for nothing (a batch's later items are not refused: each batch has at most one queued at a time).
WebSocket sentences are never refused for a full queue (their text was accepted; max_ws_sessions x
ws_session.MAX_IN_FLIGHT bounds them), so a burst of HTTP requests cannot make accepted sentences fail. The price of
strict order: a request of several slots at the head that does not fit yet leaves the slots freed meanwhile idle
until it fits, which is why a batch asks for its items' slots one at a time.

No polling: a waiter sleeps on a future that `release` resolves. Cancellation-safe: a waiter that is cancelled or
whose deadline passes leaves the queue (those behind it may then fit), and a slot granted at the very moment its
waiter was cancelled is given back. `running` and `waiting` are what /health (in_flight, waiting) and the
gauges voxflow_api_requests_in_flight / voxflow_api_requests_waiting show.

    admission = Admission(capacity=8, max_waiting=64)
    await admission.acquire(1, deadline=loop.time() + 5.0)     # AdmissionRefused: 429
    try:
        ...
    finally:
        admission.release(1)
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable


class AdmissionRefused(Exception):
    """No slot for the request: `reason` is "wait_expired", "queue_full", "too_large" (more slots than exist) or
    "closing" (the server is shutting down)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class Abandoned(Exception):
    """The `abandon` future given to `acquire` finished first (e.g. the client went away): no slot was taken."""


class _Waiter:
    __slots__ = ("n", "future", "queued", "granted")

    def __init__(self, n: int, future: asyncio.Future):
        self.n, self.future = n, future
        self.queued = True
        self.granted = False


class Admission:
    """`capacity` slots; up to `max_waiting` requests (counted in slots asked for) queued for them in FIFO order.
    `on_change(self)` is called after every change of `running` or `waiting` (the metrics gauges follow it).
    Not thread-safe: used from one event loop."""

    def __init__(self, capacity: int, max_waiting: int, on_change: Callable[["Admission"], None] | None = None):
        self.capacity, self.max_waiting = int(capacity), int(max_waiting)
        self.on_change = on_change
        self.running = 0                        # slots held
        self.waiting = 0                        # slots asked for by queued requests
        self.closed = False                     # shutting down: nothing admitted any more (`close`)
        self._queue: deque[_Waiter] = deque()

    @property
    def free(self) -> int:
        return self.capacity - self.running

    def try_acquire(self, n: int = 1) -> bool:
        """Take `n` slots now if they are free and nobody is queued ahead; never waits."""
        _check(n)
        if self.closed or self.waiting or n > self.free:
            return False
        self.running += n
        self._changed()
        return True

    async def acquire(self, n: int = 1, deadline: float | None = None,
                      abandon: asyncio.Future | None = None, bounded: bool = True) -> None:
        """Take `n` slots, waiting in FIFO order until `deadline` (the running loop's time; None: no limit) for
        them. AdmissionRefused when the deadline passes first (at once if it has passed and the slots are not free
        now), when the queue is full (`bounded` requests only), or when `n` exceeds the capacity. `abandon` (a
        future or task, owned by the caller): when it finishes first, the request leaves the queue and Abandoned is
        raised. bounded=False: a request that may not be refused for a full queue (a WebSocket sentence, whose text
        was accepted and which the protocol cannot retry; those are bounded by the session limits instead): it
        still counts in `waiting`, so HTTP requests behind a queue of sentences are refused first."""
        if self.try_acquire(n):
            return
        loop = asyncio.get_running_loop()
        if self.closed:
            raise AdmissionRefused("the server is shutting down", "closing")
        if n > self.capacity:
            raise AdmissionRefused(f"needs {n} slots, the server has {self.capacity}", "too_large")
        if deadline is not None and deadline <= loop.time():
            raise AdmissionRefused(f"no slot free ({self._describe()})", "wait_expired")
        if bounded and self.waiting + n > self.max_waiting:
            raise AdmissionRefused(f"the admission queue is full ({self._describe()}, at most {self.max_waiting} "
                                   "waiting)", "queue_full")
        waiter = _Waiter(n, loop.create_future())
        self._queue.append(waiter)
        self.waiting += n
        self._changed()
        timer = loop.call_at(deadline, self._expire, waiter) if deadline is not None else None
        try:
            if abandon is None:
                await waiter.future
            else:
                # (asyncio.wait never cancels what it waits on: the waiter's future stays ours to settle)
                await asyncio.wait({waiter.future, abandon}, return_when=asyncio.FIRST_COMPLETED)
                if not waiter.future.done():
                    raise Abandoned()
                waiter.future.result()              # raises when the deadline passed
        except BaseException:
            if waiter.granted:                      # granted as it was cancelled: nobody will use the slots
                self.release(n)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if waiter.future.done() and not waiter.future.cancelled():
                waiter.future.exception()           # a deadline passing as the wait was cancelled: not logged
            self._leave(waiter)

    def close(self) -> None:
        """The server is shutting down: every queued request is refused ("closing") at once rather than waiting out
        its wait (and then perhaps starting a generation while the server drains), and none is admitted from now
        on. Running requests keep their slots until they finish."""
        if self.closed:
            return
        self.closed = True
        while self._queue:
            waiter = self._queue[0]
            self._dequeue(waiter)
            if not waiter.future.done():
                waiter.future.set_exception(AdmissionRefused("the server is shutting down", "closing"))
        self._changed()

    def release(self, n: int = 1) -> None:
        """Give back `n` held slots; the waiters they now fit are granted theirs, in order."""
        _check(n)
        if n > self.running:
            raise ValueError(f"releasing {n} slots, {self.running} held")
        self.running -= n
        self._wake()
        self._changed()

    # ---- internals -------------------------------------------------------------------------------------------
    def _describe(self) -> str:
        return f"{self.running} in flight, {self.waiting} waiting, limit {self.capacity}"

    def _wake(self) -> None:
        """Grant the head of the queue its slots while they are free (strict FIFO: stop at the first that does
        not fit). A head whose future is done was cancelled and its task has not run yet: drop it here."""
        while self._queue:
            head = self._queue[0]
            if head.future.done():
                self._dequeue(head)
                continue
            if head.n > self.free:
                break
            self._dequeue(head)
            head.granted = True
            self.running += head.n
            head.future.set_result(None)

    def _dequeue(self, waiter: _Waiter) -> None:
        if waiter.queued:
            waiter.queued = False
            self._queue.remove(waiter)
            self.waiting -= waiter.n

    def _leave(self, waiter: _Waiter) -> None:
        """The waiter is done waiting (granted, refused, cancelled): out of the queue; when it was the head that
        did not fit, those behind it may fit now."""
        before = (self.running, self.waiting)
        self._dequeue(waiter)
        self._wake()
        if (self.running, self.waiting) != before:     # (called again once the waiter's task resumes)
            self._changed()

    def _expire(self, waiter: _Waiter) -> None:
        if waiter.future.done():
            return
        refused = AdmissionRefused(f"no slot free in time ({self._describe()})", "wait_expired")   # (counting itself)
        self._leave(waiter)
        waiter.future.set_exception(refused)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)


def _check(n: int) -> None:
    if n < 1:
        raise ValueError(f"slots are taken and given back one or more at a time, not {n}")
