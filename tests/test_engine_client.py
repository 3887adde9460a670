"""The engine clients (in-process thread, engine process over ZeroMQ) against a fake, deterministic EngineCore.

Every scenario runs in both modes; the engine-process ones spawn a real process (the fake is built there by
`make_fake_core`, imported from this module). Waits use generous timeouts only so that a bug fails instead of
hanging; nothing asserts on timing.
"""
import asyncio
import contextlib
import os
import signal
import time

import pytest

from voxflow.engine import wire
from voxflow.engine.client import ENGINE_DIED, EngineClient, EngineStartupError, EngineUnavailableError
from voxflow.engine.inprocess import InProcessEngineClient
from voxflow.engine.process import ProcessEngineClient
from voxflow.engine.request import (AudioChunk, FinalRecord, FinishReason, SamplingOptions, SpeechRequest,
                                    StreamingOptions, Usage)

MODES = ["inprocess", "process"]
HANG = 10.0        # seconds: only to turn a hang into a failure


class FakeCore:
    """Text drives behaviour:  ""  -> add_request raises ValueError;  "boom" -> step() raises;
    "gate" -> never produces anything, ends only when aborted;  "hold" -> one chunk, then waits while any
    gate is live;  anything else -> `sampling.max_new_tokens or 3` chunks (one per step), then EOS."""

    def __init__(self):
        self.requests = {}          # rid -> [request, chunks sent]
        self.aborted = []
        self.is_shut_down = False
        self.steps = 0
        self.slow_adds_at = []      # steps taken before each "slow" request was added

    def add_request(self, request):
        if not request.text:
            raise ValueError("empty text")
        if request.text == "slow":  # a prompt build longer than the engine loop's add budget per step
            time.sleep(0.006)
            self.slow_adds_at.append(self.steps)
        self.requests[request.request_id] = [request, 0]

    def abort(self, request_id):
        self.aborted.append(request_id)
        self.requests.pop(request_id, None)

    def _runnable(self):
        gated = any(r.text == "gate" for r, _ in self.requests.values())
        return [rid for rid, (r, sent) in self.requests.items()
                if r.text != "gate" and not (r.text == "hold" and sent >= 1 and gated)]

    def has_work(self):
        return bool(self._runnable())

    def step(self):
        self.steps += 1
        outs = []
        for rid in self._runnable():
            request, sent = self.requests[rid]
            if request.text == "boom":
                raise RuntimeError("boom in step")
            if sent < (request.sampling.max_new_tokens or 3):
                outs.append(expected_chunk(rid, sent))
                self.requests[rid][1] += 1
            else:
                outs.append(FinalRecord(rid, FinishReason.EOS, Usage(prompt_tokens=7, frames=2 * sent)))
                del self.requests[rid]
        return outs

    def stats(self):
        return {"running": len(self.requests), "aborted": list(self.aborted), "slow_adds_at": list(self.slow_adds_at)}

    def shutdown(self):
        self.is_shut_down = True


def make_fake_core():
    return FakeCore()


def make_paced_fake_core():
    """A FakeCore whose engine config turns on the loop's per-step add budget (off by default)."""
    import types
    core = FakeCore()
    core.config = types.SimpleNamespace(add_seconds_per_step=0.004)
    return core


def make_broken_core():
    raise RuntimeError("no weights at /nowhere")


def expected_chunk(rid, i):
    pcm = f"{rid}/{i};".encode() * 8
    return AudioChunk(rid, i, pcm, sample_rate=24000, num_samples=len(pcm) // 4, first_frame=2 * i, num_frames=2)


def req(text="hello", chunks=None, rid=None):
    r = SpeechRequest(text=text, sampling=SamplingOptions(max_new_tokens=chunks))
    if rid:
        r.request_id = rid
    return r


def run(coro):
    asyncio.run(asyncio.wait_for(coro, HANG))


def make_client(mode, factory=make_fake_core) -> EngineClient:
    return InProcessEngineClient(factory()) if mode == "inprocess" else ProcessEngineClient(factory)


async def collect(client, request):
    return [out async for out in client.generate(request)]


def shape(outputs):
    """Outputs without wall-clock timestamps."""
    return [(o.index, o.pcm, o.first_frame, o.num_frames) if isinstance(o, AudioChunk)
            else (o.reason, o.error, o.usage) for o in outputs]


async def first_chunk(stream):
    out = await stream.__anext__()
    assert isinstance(out, AudioChunk) and out.index == 0
    return out


async def open_gate(client):
    """Start the "gate" request; on return its add is sent, so the engine sees it before later requests."""
    gate = asyncio.ensure_future(collect(client, req("gate", rid="gate")))
    await asyncio.sleep(0)      # one turn of the loop: the task runs up to its first wait, after submitting
    return gate


async def eventually(predicate, client):
    """Poll the fake's stats until predicate(stats) holds (bounded by HANG)."""
    while True:
        stats = (await client.health())["stats"]
        if predicate(stats):
            return stats
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------------------------------------------------
def test_wire_round_trip():
    r = SpeechRequest(text="hi", task="voice_clone", ref_audio=b"\x00\x01\xff" * 5, ref_text="ref",
                      sampling=SamplingOptions(seed=3, top_p=0.5), streaming=StreamingOptions(chunk_frames=4))
    assert wire.decode_request(wire.unpack(wire.pack(["add", wire.encode_request(r)]))[1]) == r
    for out in (expected_chunk("a", 2), FinalRecord("a", FinishReason.ERROR, Usage(1, 2, 0.5), error="x")):
        back = wire.decode_output(wire.unpack(wire.pack(["out", [wire.encode_output(out)]]))[1][0])
        assert back == out
        assert isinstance(back.reason, FinishReason) if isinstance(out, FinalRecord) else type(back.pcm) is bytes


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_round_trip_and_bad_request(mode):
    async def main():
        async with make_client(mode) as client:
            requests = [req(chunks=n, rid=f"r{n}") for n in (1, 2, 3, 4)] + [req(text="", rid="bad")]
            results = await asyncio.gather(*(collect(client, r) for r in requests))
            for n, outputs in zip((1, 2, 3, 4), results):
                want = [expected_chunk(f"r{n}", i) for i in range(n)]
                want.append(FinalRecord(f"r{n}", FinishReason.EOS, Usage(prompt_tokens=7, frames=2 * n)))
                assert shape(outputs) == shape(want)
            assert shape(results[-1]) == [(FinishReason.ERROR, "empty text", Usage())]
            health = await client.health()
            assert health["alive"] and health["in_flight"] == 0 and health["stats"]["running"] == 0
    run(main())


@pytest.mark.parametrize("mode", MODES)
def test_consumer_exit_and_explicit_abort_reach_the_engine(mode):
    async def main():
        async with make_client(mode) as client:
            gate = await open_gate(client)
            # A consumer that leaves after one chunk (client disconnected): the engine must hear of it.
            async for out in client.generate(req("hold", rid="left")):
                assert out.index == 0
                break
            await eventually(lambda s: "left" in s["aborted"], client)
            # An explicit abort ends the stream with one ABORTED record.
            await client.abort("gate")
            outs = await gate
            assert shape(outs) == [(FinishReason.ABORTED, None, Usage())]
            stats = await eventually(lambda s: "gate" in s["aborted"], client)
            assert stats["running"] == 0
    run(main())


@pytest.mark.parametrize("mode", MODES)
def test_a_burst_of_arrivals_is_spread_over_steps(mode):
    """While a stream runs, six requests whose prompt builds each outlast the loop's per-step add budget arrive at
    once: the engine takes one, steps, takes the next (the running stream is not held up by all six builds), and
    every one of them is served, in order (with the budget on: `add_seconds_per_step`)."""
    async def main():
        async with make_client(mode, make_paced_fake_core) as client:
            busy = client.generate(req(chunks=100000, rid="busy"))
            await first_chunk(busy)
            burst = [req("slow", chunks=1, rid=f"s{i}") for i in range(6)]
            results = await asyncio.gather(*(collect(client, r) for r in burst))
            assert all(shape(r)[-1][0] == FinishReason.EOS for r in results)
            at = (await client.health())["stats"]["slow_adds_at"]
            assert len(at) == 6 and at == sorted(at)
            assert len(set(at)) >= 4, at            # all in one go would be one or two step counts
            await client.abort("busy")
    run(main())


def test_add_budget_follows_the_engine_config():
    import types
    from voxflow.engine.inprocess import CoreDriver
    core = FakeCore()
    core.requests["busy"] = [req(chunks=5), 0]                    # has work
    long_ago = time.monotonic() - 1.0
    core.config = types.SimpleNamespace(add_seconds_per_step=0.004)
    assert CoreDriver(core).may_take_more(time.monotonic()) and not CoreDriver(core).may_take_more(long_ago)
    core.config.add_seconds_per_step = None                       # every arrival at once
    assert CoreDriver(core).may_take_more(long_ago)
    core.requests.clear()                                         # idle: always take the next command
    core.config.add_seconds_per_step = 0.004
    assert CoreDriver(core).may_take_more(long_ago)


async def collect_from(stream):
    return [out async for out in stream]


@pytest.mark.parametrize("mode", MODES)
def test_step_exception_ends_every_in_flight_request(mode):
    async def main():
        client = make_client(mode)
        await client.start()
        gate = await open_gate(client)
        streams = [client.generate(req("hold", rid=f"h{i}")) for i in range(2)]
        for s in streams:
            await first_chunk(s)
        boom = await collect(client, req("boom", rid="boom"))
        ends = [await s.__anext__() for s in streams] + [(await gate)[-1], boom[-1]]
        for end in ends:
            assert isinstance(end, FinalRecord) and end.reason == FinishReason.ERROR
            assert end.error.startswith(ENGINE_DIED) and "boom in step" in end.error
        health = await client.health()
        assert not health["alive"] and "boom in step" in health["error"]
        with pytest.raises(EngineUnavailableError, match=ENGINE_DIED):
            await collect(client, req())
        await client.shutdown(drain=True)   # releases a dead engine without hanging
    run(main())


def test_killed_engine_process_fails_in_flight_requests():
    async def main():
        client = ProcessEngineClient(make_fake_core)
        await client.start()
        gate = await open_gate(client)
        stream = client.generate(req("hold", rid="h"))
        await first_chunk(stream)
        os.kill(client.pid, signal.SIGKILL)
        end = await stream.__anext__()
        assert end.reason == FinishReason.ERROR and "SIGKILL" in end.error and end.error.startswith(ENGINE_DIED)
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        assert (await gate)[-1].reason == FinishReason.ERROR
        assert not client.is_alive and not (await client.health())["alive"]
        with pytest.raises(EngineUnavailableError):
            await collect(client, req())
        await client.shutdown(drain=False)
    run(main())


@pytest.mark.parametrize("mode", MODES)
def test_drain_finishes_in_flight_and_rejects_new(mode):
    async def main():
        client = make_client(mode)
        await client.start()
        gate = await open_gate(client)
        streams = [client.generate(req("hold", chunks=3, rid=f"h{i}")) for i in range(2)]
        for s in streams:
            await first_chunk(s)
        shutdown = asyncio.ensure_future(client.shutdown(drain=True))
        await asyncio.sleep(0)              # let shutdown start draining
        assert not shutdown.done()
        with pytest.raises(EngineUnavailableError, match="shutting down"):
            await collect(client, req())
        await client.abort("gate")          # lets the held requests run to their end
        assert (await gate)[-1].reason == FinishReason.ABORTED
        for i, s in enumerate(streams):
            rest = await collect_from(s)
            assert shape(rest) == shape([expected_chunk(f"h{i}", 1), expected_chunk(f"h{i}", 2),
                                         FinalRecord("", FinishReason.EOS, Usage(7, 6))])
        await shutdown
        assert not client.is_alive and (await client.health())["error"] == "engine shut down"
        if mode == "inprocess":
            assert client._driver.core.is_shut_down
    run(main())


@pytest.mark.parametrize("mode", MODES)
def test_shutdown_without_drain_aborts_in_flight(mode):
    async def main():
        client = make_client(mode)
        await client.start()
        gate = await open_gate(client)
        stream = client.generate(req("hold", rid="h"))
        await first_chunk(stream)
        await client.shutdown(drain=False)
        assert shape(await collect_from(stream)) == [(FinishReason.ABORTED, "engine shut down", Usage())]
        assert (await gate)[-1].reason == FinishReason.ABORTED
        if mode == "inprocess":
            core = client._driver.core
            assert core.is_shut_down and sorted(core.aborted) == ["gate", "h"]
    run(main())


def test_startup_exception_is_surfaced():
    async def main():
        client = ProcessEngineClient(make_broken_core)
        with pytest.raises(EngineStartupError, match="no weights at /nowhere"):
            await client.start()
        assert not client.is_alive
        with pytest.raises(EngineUnavailableError, match="not started"):
            await collect(client, req())
    run(main())


def test_not_started_client_is_not_alive():
    async def main():
        client = InProcessEngineClient(FakeCore())
        assert (await client.health()) == {"alive": False, "in_flight": 0, "stats": None,
                                           "error": "engine not started"}
        with contextlib.suppress(EngineUnavailableError):
            await collect(client, req())
            pytest.fail("generate on a client that was never started")
    run(main())
