"""Server-wide admission (voxflow/api/admission.py): one FIFO of requests waiting for a slot, shared by HTTP speech
requests, batches and WebSocket sentences.

First the Admission class alone (FIFO order, a large request at the head is not starved, cancellation and
timeouts give everything back, the depth limit), then the API over a real uvicorn server and a stand-in engine
whose requests end only when the test says so: an HTTP request waits for a busy slot (served when it frees, 429
when its wait runs out), cannot overtake a queued WebSocket sentence or batch, and the gauges tell running from
waiting. Waits only turn a hang into a failure.
"""
import argparse
import asyncio
import json
import os
import time

import httpx
import numpy as np
import pytest
import websockets

from voxflow.api.admission import Abandoned, Admission, AdmissionRefused
from voxflow.api.app import create_app
from voxflow.api.state import ServerSettings
from voxflow.engine.request import AudioChunk, FinalRecord, FinishReason, Usage

from test_api_speech import ServerThread, post_and_leave

HANG = 20.0
SPEECH = "/v1/audio/speech"
BATCH = "/v1/audio/speech/batch"
WS_PATH = "/v1/audio/speech/stream"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, HANG))


async def until(predicate) -> None:
    deadline = time.monotonic() + HANG
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def settle() -> None:
    """Let every task that can run do so (a few loop turns)."""
    for _ in range(5):
        await asyncio.sleep(0)


def holder(admission: Admission, n: int, log: list, name: str, **kw) -> asyncio.Task:
    """A task that waits for `n` slots and notes `name` in `log` once it has them (it keeps them)."""
    async def wait():
        await admission.acquire(n, **kw)
        log.append(name)
    return asyncio.ensure_future(wait())


async def queue_up(admission: Admission, log: list, *waiters: tuple[int, str]) -> list[asyncio.Task]:
    """`holder` tasks for (n, name) in this order, each one queued before the next is made."""
    tasks = []
    for n, name in waiters:
        tasks.append(holder(admission, n, log, name))
        await settle()
    return tasks


# ============================================================================================ the class alone
def test_waiters_are_served_in_arrival_order():
    async def main():
        adm, log = Admission(1, 10), []
        assert adm.try_acquire()
        tasks = [holder(adm, 1, log, name) for name in "abc"]
        await settle()
        assert (adm.running, adm.waiting, log) == (1, 3, [])
        for expected in (["a"], ["a", "b"], ["a", "b", "c"]):
            adm.release()
            await settle()
            assert log == expected and adm.running == 1
        assert adm.waiting == 0
        await asyncio.gather(*tasks)
    run(main())


def test_a_large_request_at_the_head_holds_back_smaller_ones_behind_it():
    """Strict FIFO: a request needing 2 slots with 1 free blocks the 1-slot requests behind it (which would fit),
    so it is not starved by small ones that keep taking each slot as it frees."""
    async def main():
        adm, log = Admission(3, 10), []
        assert adm.try_acquire() and adm.try_acquire()
        big, small = await queue_up(adm, log, (3, "big"), (1, "small"))
        assert adm.free == 1 and log == [] and adm.waiting == 4
        assert not adm.try_acquire()                    # nobody jumps the queue either, even with a slot free
        adm.release()                                   # 2 free: "small" would fit, "big" not yet
        await settle()
        assert log == [] and adm.free == 2
        adm.release()
        await settle()
        assert log == ["big"] and adm.running == 3 and adm.waiting == 1
        adm.release(3)
        await settle()
        assert log == ["big", "small"] and adm.running == 1 and adm.waiting == 0
        await asyncio.gather(big, small)
    run(main())


def test_a_cancelled_waiter_leaves_the_queue_and_unblocks_those_behind():
    async def main():
        adm, log = Admission(2, 10), []
        assert adm.try_acquire()
        big, small = await queue_up(adm, log, (2, "big"), (1, "small"))
        assert log == [] and adm.waiting == 3
        big.cancel()                                    # the head leaves: the one behind fits the free slot
        await settle()
        assert big.cancelled() and log == ["small"] and (adm.running, adm.waiting) == (2, 0)
        await small
    run(main())


def test_a_slot_granted_as_its_waiter_is_cancelled_goes_to_the_next():
    """release() grants the waiter its slot, and its task is cancelled before it could run: the slot is given
    back (to the next waiter), not leaked."""
    async def main():
        adm, log = Admission(1, 10), []
        assert adm.try_acquire()
        first, second = await queue_up(adm, log, (1, "first"), (1, "second"))
        adm.release()                                   # grants "first"'s slot (its task has not run yet) ...
        first.cancel()                                  # ... which is cancelled at the same moment
        await settle()
        assert first.cancelled() and log == ["second"] and (adm.running, adm.waiting) == (1, 0)
        adm.release()
        assert (adm.running, adm.waiting) == (0, 0)
        await second
    run(main())


def test_the_wait_ends_at_the_deadline_and_takes_nothing():
    async def main():
        loop = asyncio.get_running_loop()
        changes = []
        adm = Admission(1, 10, on_change=lambda a: changes.append((a.running, a.waiting)))
        assert adm.try_acquire()
        started = loop.time()
        with pytest.raises(AdmissionRefused) as refused:
            await adm.acquire(1, deadline=started + 0.2)
        assert refused.value.reason == "wait_expired" and loop.time() - started >= 0.2
        assert (adm.running, adm.waiting) == (1, 0)
        adm.release()
        assert adm.running == 0                         # the expired waiter was not granted the freed slot
        assert changes == [(1, 0), (1, 1), (1, 0), (0, 0)]
        await adm.acquire(1, deadline=loop.time() - 1)  # a deadline already passed: a free slot is still taken
        with pytest.raises(AdmissionRefused):           # but none is waited for
            await adm.acquire(1, deadline=loop.time() - 1)
        assert (adm.running, adm.waiting) == (1, 0)
    run(main())


def test_the_queue_depth_is_bounded_and_too_large_requests_are_refused_at_once():
    async def main():
        adm, log = Admission(2, 3), []
        assert adm.try_acquire(2)
        waiters = [holder(adm, 1, log, "a"), holder(adm, 2, log, "b")]
        await settle()
        assert adm.waiting == 3                          # counted in slots asked for: a batch of 2 is 2 requests
        with pytest.raises(AdmissionRefused) as full:
            await adm.acquire(1)
        assert full.value.reason == "queue_full" and adm.waiting == 3
        # a WebSocket sentence (bounded=False) is never refused for a full queue: it takes its place behind them
        sentence = asyncio.ensure_future(adm.acquire(1, bounded=False))
        await settle()
        assert not sentence.done() and adm.waiting == 4
        sentence.cancel()
        await settle()
        assert adm.waiting == 3
        with pytest.raises(AdmissionRefused) as large:
            await adm.acquire(3)                         # could never fit: not queued to block everyone forever
        assert large.value.reason == "too_large"
        with pytest.raises(ValueError):
            adm.release(3)                               # more than held: a bug, not silently clamped
        adm.release(2)
        await settle()
        assert log == ["a"] and adm.waiting == 2         # "b" needs 2, one is free: it waits at the head
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        assert (adm.running, adm.waiting) == (1, 0)
    run(main())


def test_an_abandon_future_takes_the_waiter_out_of_the_queue():
    async def main():
        adm = Admission(1, 10)
        assert adm.try_acquire()
        gone = asyncio.get_running_loop().create_future()
        waiter = asyncio.ensure_future(adm.acquire(1, abandon=gone))
        await settle()
        assert adm.waiting == 1
        gone.set_result(None)
        with pytest.raises(Abandoned):
            await waiter
        adm.release()
        assert (adm.running, adm.waiting) == (0, 0)
    run(main())


# ============================================================================================ over the API
class GateEngine:
    """An engine client stand-in: a request ends (one chunk, then EOS) only once the test calls `finish(text)`, from
    its own thread; one whose text starts with "quick" ends at once. `started`: texts in the order they reached the
    engine, which is the order they were admitted."""

    def __init__(self):
        self.model_info = dict(name="gate", family="qwen3_tts", task="custom_voice", sample_rate=24000,
                               voices=["vivian"], languages=["auto"], supports_instructions=False)
        self.started, self.gates, self.loop = [], {}, None

    def _gate(self, text: str) -> asyncio.Event:
        return self.gates.setdefault(text, asyncio.Event())

    def finish(self, text: str) -> None:
        self.loop.call_soon_threadsafe(self._gate(text).set)

    async def generate(self, request):
        self.loop = asyncio.get_running_loop()
        self.started.append(request.text)
        if not request.text.startswith("quick"):
            await self._gate(request.text).wait()
        rid = request.request_id
        yield AudioChunk(rid, 0, np.full(1920, 0.1, "<f4").tobytes(), 24000, 1920, 0, 1)
        yield FinalRecord(rid, FinishReason.EOS, Usage(prompt_tokens=5, frames=1, audio_seconds=0.08))

    async def health(self, timeout=None):
        return {"alive": True, "in_flight": 0, "stats": {"running": 0, "waiting": 0, "kv_usage": 0.0},
                "error": None}


def gate_server(engine: GateEngine, **settings) -> ServerThread:
    app = create_app(engine, ServerSettings(model_name="gate", **settings), model_info=engine.model_info,
                     manage_engine=False)
    return ServerThread(app)


def body(text: str) -> dict:
    return {"model": "gate", "voice": "vivian", "response_format": "pcm", "input": text}


async def hold_the_slot(client: httpx.AsyncClient, engine: GateEngine) -> asyncio.Future:
    """POST "held first" and wait until the engine runs it (it holds its slot until engine.finish): its response."""
    first = asyncio.ensure_future(client.post(SPEECH, json=body("held first")))
    await until(lambda: engine.started == ["held first"])
    return first


def gauge(srv: ServerThread, name: str, **labels) -> float:
    return srv.app.state.vox.metrics.registry.get_sample_value(name, labels or None) or 0.0


def running_waiting(srv: ServerThread) -> tuple[float, float]:
    return gauge(srv, "voxflow_api_requests_in_flight"), gauge(srv, "voxflow_api_requests_waiting")


def test_an_http_request_waits_for_a_busy_slot_and_is_served_when_it_frees():
    """Before the shared queue, a request beyond the limit was answered 429 at once."""
    engine = GateEngine()
    with gate_server(engine, max_concurrent_requests=1, admission_wait_s=HANG) as srv:
        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=HANG) as c:
                first = await hold_the_slot(c, engine)
                second = asyncio.ensure_future(c.post(SPEECH, json=body("quick second")))
                await until(lambda: running_waiting(srv) == (1, 1))
                health = (await c.get("/health")).json()
                assert (health["in_flight"], health["waiting"]) == (1, 1)
                assert engine.started == ["held first"] and not second.done()
                engine.finish("held first")
                return await first, await second
        r1, r2 = run(main())
    assert (r1.status_code, r2.status_code) == (200, 200) and len(r2.content) == 1920 * 2
    assert engine.started == ["held first", "quick second"]
    assert gauge(srv, "voxflow_requests_rejected_total", reason="concurrency") == 0
    assert gauge(srv, "voxflow_requests_total", status="200") == 2
    assert running_waiting(srv) == (0, 0)


def test_an_http_request_gets_429_when_its_wait_runs_out():
    engine = GateEngine()
    with gate_server(engine, max_concurrent_requests=1, admission_wait_s=0.3) as srv:
        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=HANG) as c:
                first = await hold_the_slot(c, engine)
                started = time.monotonic()
                refused = await c.post(SPEECH, json=body("quick second"))
                took = time.monotonic() - started
                after = running_waiting(srv)
                engine.finish("held first")
                return refused, took, after, await first
        refused, took, after, r1 = run(main())
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert "too many concurrent requests" in refused.json()["error"]["message"]
    assert "1 in flight, 1 waiting, limit 1" in refused.json()["error"]["message"]     # as it stood while it waited
    assert took >= 0.3                                  # it waited its turn before the 429
    assert after == (1, 0)                              # out of the queue, holding nothing
    assert r1.status_code == 200 and engine.started == ["held first"]
    assert gauge(srv, "voxflow_requests_rejected_total", reason="concurrency") == 1
    assert gauge(srv, "voxflow_requests_total", status="429") == 0     # a rejection, as before it could wait
    assert running_waiting(srv) == (0, 0)


def test_an_http_request_cannot_overtake_waiting_websocket_sentences():
    """Slot held by an HTTP request; a session's two sentences queue, then another HTTP request: each runs in
    arrival order (before, sentences polled and the HTTP request was answered 429). The waiting sentences are
    counted as waiting, not in flight (a soak test saw 41 "in flight" with a limit of 6)."""
    engine = GateEngine()
    with gate_server(engine, max_concurrent_requests=1, admission_wait_s=HANG) as srv:
        ws_url = srv.url.replace("http://", "ws://") + WS_PATH

        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=HANG) as c, \
                    websockets.connect(ws_url, open_timeout=HANG) as ws:
                first = await hold_the_slot(c, engine)
                await ws.send('{"type": "session.config", "voice": "vivian", "response_format": "pcm"}')
                await ws.send('{"type": "input.text", "text": "One held. Two held."}')
                await ws.send('{"type": "input.done"}')
                await until(lambda: running_waiting(srv) == (1, 2))
                late = asyncio.ensure_future(c.post(SPEECH, json=body("quick late")))
                await until(lambda: running_waiting(srv) == (1, 3))
                health = (await c.get("/health")).json()
                assert (health["in_flight"], health["waiting"]) == (1, 3)
                for text, now, left in (("held first", "One held.", 2), ("One held.", "Two held.", 1)):
                    engine.finish(text)
                    await until(lambda: engine.started[-1] == now)
                    assert not late.done() and running_waiting(srv) == (1, left)
                engine.finish("Two held.")
                replies = []
                while not replies or replies[-1].get("type") != "session.done":
                    m = await asyncio.wait_for(ws.recv(), HANG)
                    if isinstance(m, str):
                        replies.append(json.loads(m))
                return await first, await late, replies
        r1, late, replies = run(main())
    assert engine.started == ["held first", "One held.", "Two held.", "quick late"]
    assert (r1.status_code, late.status_code) == (200, 200)
    assert [m["error"] for m in replies if m["type"] == "audio.done"] == [False, False]
    assert gauge(srv, "voxflow_requests_rejected_total", reason="concurrency") == 0
    assert running_waiting(srv) == (0, 0)


def test_a_batchs_items_take_slots_one_at_a_time_and_later_arrivals_are_served_between_them():
    """Limit 2, one slot held: a batch of three takes the free slot for its first item at once and queues its
    second; a single request arriving then queues behind that second item (a no-wait one is refused: others are
    queued), and the batch's third item queues only once its second runs, so behind the single request. Before,
    the batch waited for two free slots at the head of the queue, leaving the free one idle."""
    engine = GateEngine()
    with gate_server(engine, max_concurrent_requests=2, admission_wait_s=HANG) as srv:
        settings = srv.app.state.vox.settings

        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=HANG) as c:
                first = await hold_the_slot(c, engine)
                batch = asyncio.ensure_future(c.post(BATCH, json={
                    "model": "gate", "voice": "vivian", "response_format": "pcm",
                    "items": [{"input": "held item one"}, {"input": "held item two"}, {"input": "held item three"}]}))
                # the free slot did not stay idle: item one runs, item two waits
                await until(lambda: engine.started == ["held first", "held item one"]
                            and running_waiting(srv) == (2, 1))
                settings.admission_wait_s = 0
                refused = await c.post(SPEECH, json=body("quick no wait"))
                settings.admission_wait_s = HANG
                single = asyncio.ensure_future(c.post(SPEECH, json=body("held single")))
                await until(lambda: running_waiting(srv) == (2, 2))
                engine.finish("held first")                                  # -> item two; item three queues
                await until(lambda: len(engine.started) == 3 and running_waiting(srv) == (2, 2))
                engine.finish("held item one")                               # -> the single request
                await until(lambda: len(engine.started) == 4 and running_waiting(srv) == (2, 1))
                engine.finish("held item two")                               # -> item three
                await until(lambda: len(engine.started) == 5 and running_waiting(srv) == (2, 0))
                engine.finish("held single")
                engine.finish("held item three")
                return refused, await first, await batch, await single
        refused, r1, batch, single = run(main())
    assert engine.started == ["held first", "held item one", "held item two", "held single", "held item three"]
    assert refused.status_code == 429 and "quick no wait" not in engine.started
    assert (r1.status_code, batch.status_code, single.status_code) == (200, 200, 200)
    assert batch.json()["succeeded"] == 3
    assert gauge(srv, "voxflow_requests_rejected_total", reason="concurrency") == 1
    assert running_waiting(srv) == (0, 0)


def test_a_batch_item_queued_when_the_server_stops_fails_alone():
    """A batch's later item is refused only by a shutdown: its entry is a 503 server_shutting_down, the items that
    ran keep their audio, and the batch is answered (200)."""
    engine = GateEngine()
    with gate_server(engine, max_concurrent_requests=1, admission_wait_s=HANG) as srv:
        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=HANG) as c:
                batch = asyncio.ensure_future(c.post(BATCH, json={
                    "model": "gate", "voice": "vivian", "response_format": "pcm",
                    "items": [{"input": "held item one"}, {"input": "held item two"}]}))
                await until(lambda: engine.started == ["held item one"] and running_waiting(srv) == (1, 1))
                engine.loop.call_soon_threadsafe(srv.app.state.vox.admission.close)     # (the server's loop)
                await until(lambda: running_waiting(srv) == (1, 0))
                engine.finish("held item one")
                return await batch
        r = run(main())
    assert r.status_code == 200 and engine.started == ["held item one"]
    one, two = r.json()["results"]
    assert one["status"] == "success" and one["audio_data"]
    assert two["status"] == "error" and two["status_code"] == 503
    assert two["error"]["code"] == "server_shutting_down"
    assert gauge(srv, "voxflow_requests_rejected_total", reason="unavailable") == 1
    assert running_waiting(srv) == (0, 0)


def test_a_client_leaving_a_batch_with_an_item_queued_aborts_the_running_and_dequeues_the_rest():
    """Limit 1: a batch's first item runs, its second waits in the queue. The client leaves: the running item is
    aborted (its engine generator closed), the queued one leaves the queue; both count as 499 and the slot is
    free for the next request."""
    engine = GateEngine()
    closed = []
    generate = engine.generate

    async def tracked(request):
        try:
            async for out in generate(request):
                yield out
        finally:
            closed.append(request.text)
    engine.generate = tracked
    with gate_server(engine, max_concurrent_requests=1, admission_wait_s=HANG) as srv:
        batch = {"model": "gate", "voice": "vivian", "response_format": "pcm",
                 "items": [{"input": "held item one"}, {"input": "held item two"}]}
        post_and_leave(srv.port, batch, lambda: engine.started == ["held item one"] and running_waiting(srv) == (1, 1),
                       BATCH)

        async def main():
            await until(lambda: running_waiting(srv) == (0, 0))
            async with httpx.AsyncClient(base_url=srv.url, timeout=HANG) as c:
                return await c.post(SPEECH, json=body("quick after"))
        after = run(main())
    assert after.status_code == 200 and engine.started == ["held item one", "quick after"]
    assert "held item one" in closed
    assert gauge(srv, "voxflow_requests_total", status="499") == 2
    assert srv.app.state.vox.admission.running == 0


def test_a_client_that_leaves_while_queued_leaves_the_queue():
    """Counted as a client disconnect (499), as a request that left while it ran; no slot is taken or leaked."""
    engine = GateEngine()
    with gate_server(engine, max_concurrent_requests=1, admission_wait_s=HANG) as srv:
        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=HANG) as c:
                first = await hold_the_slot(c, engine)
                await asyncio.to_thread(post_and_leave, srv.port, body("quick gone"),
                                        lambda: running_waiting(srv) == (1, 1))
                await until(lambda: running_waiting(srv) == (1, 0))
                engine.finish("held first")
                r1 = await first
                return r1, await c.post(SPEECH, json=body("quick after"))
        r1, after = run(main())
    assert (r1.status_code, after.status_code) == (200, 200)
    assert engine.started == ["held first", "quick after"]
    assert gauge(srv, "voxflow_requests_total", status="499") == 1
    assert gauge(srv, "voxflow_requests_finished_total", reason="client_disconnect") == 1
    assert srv.app.state.vox.admission.running == 0 and running_waiting(srv) == (0, 0)


def test_close_refuses_the_queued_and_everything_after_while_the_running_keep_their_slots():
    async def main():
        adm, log = Admission(2, 8), []
        assert adm.try_acquire(2)
        waiters = [holder(adm, 1, log, "a"), holder(adm, 2, log, "b")]
        await settle()
        adm.close()
        await settle()
        assert all(w.done() for w in waiters) and not log and adm.waiting == 0 and adm.running == 2
        for w in waiters:
            assert isinstance(w.exception(), AdmissionRefused) and w.exception().reason == "closing"
        adm.release(1)                                   # a running request finishing: nothing takes its slot
        assert not adm.try_acquire(1) and adm.running == 1
        with pytest.raises(AdmissionRefused) as late:
            await adm.acquire(1, bounded=False)
        assert late.value.reason == "closing" and adm.waiting == 0
    run(main())


def test_stopping_the_server_answers_queued_requests_at_once(monkeypatch):
    """serve's uvicorn server closes the admission queue when it stops (a signal, or the engine dying): a request
    queued behind a running one gets its 503 at once, not after its admission wait or the running one's end; the
    running one still finishes. Without it the queued request would wait out admission_wait_s (HANG here)."""
    import uvicorn
    from voxflow.api.uvicorn_server import ShutdownAwareServer
    engine = GateEngine()
    app = create_app(engine, ServerSettings(model_name="gate", max_concurrent_requests=1, admission_wait_s=HANG),
                     model_info=engine.model_info, manage_engine=False)
    monkeypatch.setattr(uvicorn, "Server", lambda config: ShutdownAwareServer(config, app.state.vox.admission))
    with ServerThread(app) as srv:
        assert isinstance(srv.server, ShutdownAwareServer)

        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=HANG) as c:
                first = await hold_the_slot(c, engine)
                second = asyncio.ensure_future(c.post(SPEECH, json=body("queued second")))
                await until(lambda: running_waiting(srv) == (1, 1))
                started = time.monotonic()
                srv.server.stop()
                refused = await second
                took = time.monotonic() - started
                engine.finish("held first")
                return refused, took, await first
        refused, took, r1 = run(main())
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
    assert took < HANG / 2 and r1.status_code == 200 and engine.started == ["held first"]
    assert gauge(srv, "voxflow_requests_rejected_total", reason="unavailable") == 1


def test_a_signal_closes_the_admission_queue_too(monkeypatch):
    import uvicorn
    from voxflow.api.uvicorn_server import ShutdownAwareServer
    adm = Admission(1, 4)
    server = ShutdownAwareServer(uvicorn.Config(lambda *a: None), adm)
    calls = []

    class Loop:
        def is_closed(self):
            return False

        def call_soon_threadsafe(self, fn, *args):
            calls.append(fn)
    server.loop = Loop()
    server.handle_exit(2, None)                          # SIGINT, as uvicorn's signal handler calls it
    assert server.should_exit and calls == [adm.close]


# ============================================================================================ serve options
def test_serve_options(capsys):
    from voxflow.api.serve import add_serve_arguments, run_serve, settings_from_args
    p = argparse.ArgumentParser()
    add_serve_arguments(p)
    defaults = settings_from_args(p.parse_args([]))
    assert (defaults.admission_wait_s, defaults.max_queued_requests) == (5.0, 2048)
    s = settings_from_args(p.parse_args(["m", "--admission-wait-s", "0", "--max-queued-requests", "7"]))
    assert (s.admission_wait_s, s.max_queued_requests) == (0.0, 7)
    model = os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice")
    for option, value in (("--admission-wait-s", "-1"), ("--admission-wait-s", "nan"),
                          ("--max-queued-requests", "-1")):
        assert run_serve(p.parse_args([model, option, value])) == 2          # refused before anything starts
        assert capsys.readouterr().err.strip() == f"voxflow serve: error: {option} must be >= 0"
    assert run_serve(p.parse_args([model, "--max-concurrent-requests", "0"])) == 2
    assert capsys.readouterr().err.strip() == "voxflow serve: error: --max-concurrent-requests must be >= 1"


class JitterEngine(GateEngine):
    """GateEngine whose requests each take a few milliseconds (their text's seeded jitter), then end."""

    async def generate(self, request):
        self.loop = asyncio.get_running_loop()
        self.started.append(request.text)
        self.running = getattr(self, "running", 0) + 1
        self.most = max(getattr(self, "most", 0), self.running)
        try:
            await asyncio.sleep(0.002 + sum(map(ord, request.text)) % 7 / 1000)
            rid = request.request_id
            yield AudioChunk(rid, 0, np.full(1920, 0.1, "<f4").tobytes(), 24000, 1920, 0, 1)
            yield FinalRecord(rid, FinishReason.EOS, Usage(prompt_tokens=5, frames=1, audio_seconds=0.08))
        finally:
            self.running -= 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mixed_traffic_with_clients_leaving_is_served_in_full_and_gives_every_slot_back(seed):
    """Limit 3: singles and batches of 1-6 items arrive together, some clients leave mid-way. Every request whose
    client stayed is answered 200 with all of its items; never more than 3 run at once; afterwards nothing is
    held or queued (a slot leaked by a batch item, a cancelled waiter or a leaving client would show here)."""
    import random
    rng = random.Random(seed)
    engine = JitterEngine()
    with gate_server(engine, max_concurrent_requests=3, admission_wait_s=HANG) as srv:
        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=HANG) as c:
                calls = []
                for i in range(24):
                    if rng.random() < 0.4:
                        items = [{"input": f"b{i} item {k}"} for k in range(rng.randint(1, 6))]
                        post = c.post(BATCH, json={"model": "gate", "voice": "vivian", "response_format": "pcm",
                                                   "items": items})
                    else:
                        post = c.post(SPEECH, json=body(f"single {i}"))
                    calls.append(asyncio.ensure_future(post))
                    if rng.random() < 0.3:
                        await asyncio.sleep(rng.random() / 200)
                leaving = rng.sample(range(len(calls)), 5)
                await asyncio.sleep(0.01)
                for i in leaving:
                    calls[i].cancel()
                done = await asyncio.gather(*calls, return_exceptions=True)
                await until(lambda: running_waiting(srv) == (0, 0))
                return [r for i, r in enumerate(done) if i not in leaving]
        answered = run(main())
    assert len(answered) == 19
    for r in answered:
        assert r.status_code == 200
        if r.headers["content-type"] == "application/json":
            assert r.json()["failed"] == 0
    assert engine.most <= 3 and engine.running == 0
    admission = srv.app.state.vox.admission
    assert (admission.running, admission.waiting) == (0, 0)
