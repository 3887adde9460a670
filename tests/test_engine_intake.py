"""EngineConfig.intake_while_waiting: the requests that arrive during a step are taken in while the host waits for the
decode in flight (EngineCore.take_arrivals, set by the engine process's loop), not after the step.

The engine's side runs on a CPU engine timed by test_engine's _Clock (its decodes carry events that complete a few
polls after their launch); the loop's side (process.py's `_serve`: which socket messages go in mid-step, and which
wait) runs on a real ZeroMQ pair in this process, its core a recording stub.
"""
from __future__ import annotations

import threading
import time
import types

import numpy as np
import pytest
import zmq

from test_engine import (_clocked_engine, _three_requests, assert_all_released, assert_engine_matches_reference,
                         greedy)
from voxflow.engine import wire
from voxflow.engine.inprocess import CoreDriver
from voxflow.engine.process import _serve
from voxflow.engine.request import AudioChunk, FinalRecord, FinishReason, Usage


def _run_with_arrival(monkeypatch, intake: bool):
    """Three requests running on a clocked engine; a fourth arrives during step 3 (the driver's `take_arrivals`
    takes it in when called, else the loop does after the step). Returns the engine, the four requests, every
    output by request and the calls of take_arrivals as (step, before that step read the decode it waits for?)."""
    core, clock = _clocked_engine(monkeypatch, intake_while_waiting=intake)
    reqs = _three_requests("i")
    late = greedy("A late arrival.", 7, voice="vivian", request_id="late")
    driver = CoreDriver(core)
    pending, calls, collected = [], [], []
    collect = core._collect_decode

    def collecting(inflight):
        collected.append(core.steps)
        return collect(inflight)
    core._collect_decode = collecting

    def take_arrivals():
        calls.append((core.steps, core.steps not in collected))     # (step, before the step read its decode?)
        if pending:
            driver.add_many([pending.pop()])      # as process.py's loop does with its socket's adds
    driver.add_many(reqs)
    results: dict[str, list] = {}
    while driver.has_work():
        if core.steps == 2:
            pending.append(late)
        for out in driver.step(arrivals=take_arrivals):
            results.setdefault(out.request_id, []).append(out)
        if pending:                         # not taken mid-step: the loop's own intake, after the step
            driver.add_many([pending.pop()])
    assert core.take_arrivals is None       # lent for a step, handed back after it
    assert_all_released(core)
    return core, [*reqs, late], results, calls


def test_arrivals_are_taken_mid_step_while_the_decode_runs_and_the_outputs_are_the_same(monkeypatch):
    """On: the driver's take_arrivals runs inside a step, once a step, while the decode it waits for is still in
    flight; the request it takes in is scheduled in the next step as if taken after this one. Every request's
    outputs equal the switch off's and the reference's. Off: take_arrivals is never called."""
    core, reqs, on, calls = _run_with_arrival(monkeypatch, True)
    _, _, off, calls_off = _run_with_arrival(monkeypatch, False)
    assert calls_off == []
    assert calls and len({step for step, _ in calls}) == len(calls)      # at most once a step
    assert all(before_read for _, before_read in calls)
    assert (3, True) in calls                                            # the late one went in mid-step 3
    assert_engine_matches_reference("custom_voice", core, on, reqs)
    for r in reqs:
        want = [(type(o), getattr(o, "index", None), getattr(o, "reason", None)) for o in off[r.request_id]]
        assert [(type(o), getattr(o, "index", None), getattr(o, "reason", None)) for o in on[r.request_id]] == want
        pcm_on = [o.pcm for o in on[r.request_id] if isinstance(o, AudioChunk)]
        pcm_off = [o.pcm for o in off[r.request_id] if isinstance(o, AudioChunk)]
        assert all(np.array_equal(a, b) for a, b in zip(pcm_on, pcm_off, strict=True))


def test_no_intake_when_the_decode_has_already_landed(monkeypatch):
    """The host's time is only free while the GPU still runs: a decode already done when the step comes to read it
    means no take_arrivals call (the loop takes the arrivals after the step, as without the switch)."""
    core, clock = _clocked_engine(monkeypatch, intake_while_waiting=True)
    launch = core._launch_decode

    def landed(seqs):
        inflight = launch(seqs)
        inflight.event = type("Done", (), {"query": lambda self: True, "synchronize": lambda self: None})()
        return inflight
    monkeypatch.setattr(core, "_launch_decode", landed)
    calls = []
    driver = CoreDriver(core)
    driver.add_many(_three_requests("d"))
    while driver.has_work():
        driver.step(arrivals=lambda: calls.append(core.steps))
    assert calls == []


def test_an_intake_that_fails_raises_from_a_whole_step(monkeypatch):
    """A take_arrivals that raises (an engine bug: refusals are records, not exceptions) is raised by the step once
    it is whole: the decode it waited for read, nothing lost; the engine goes on and every request ends whole."""
    core, _ = _clocked_engine(monkeypatch, intake_while_waiting=True)
    reqs = _three_requests("f")
    driver = CoreDriver(core)
    driver.add_many(reqs)
    failed, got = [], []

    def take_arrivals():
        if not failed:
            failed.append(core.steps)
            raise RuntimeError("intake broke")
    while driver.has_work():
        before = core.steps
        try:
            got += driver.step(arrivals=take_arrivals)
        except RuntimeError as e:
            assert str(e) == "intake broke" and core.steps == before + 1
            core.block_manager.check_invariants()
    assert failed
    assert_all_released(core)
    assert_engine_matches_reference("custom_voice", core, {r.request_id: [o for o in got if o.request_id ==
                                                                          r.request_id] for r in reqs}, reqs)


class _MidStepCore:
    """A stub core for process.py's loop: its first step, before it ends, lets the test fill the socket and then
    calls take_arrivals (as EngineCore does while its decode runs); it records what reached it, in order."""

    def __init__(self):
        self.config = types.SimpleNamespace(intake_while_waiting=True)     # (what CoreDriver reads of it)
        self.take_arrivals = None
        self.emit_early = None
        self.log: list[tuple] = []
        self.waiting: list[str] = []
        self.in_step = threading.Event()
        self.filled = threading.Event()
        self.steps = 0

    def add_requests(self, requests):
        self.log.append(("add", [r.request_id for r in requests], self.steps))
        self.waiting += [r.request_id for r in requests]
        return [None] * len(requests)

    def abort(self, request_id):
        self.log.append(("abort", request_id, self.steps))
        self.waiting.remove(request_id)

    def has_work(self):
        return bool(self.waiting)

    def shutdown(self):
        pass

    def step(self):
        self.steps += 1
        if self.steps == 1:
            self.in_step.set()
            assert self.filled.wait(10)
            self.log.append(("take_arrivals", self.steps))
            self.take_arrivals()
            return []
        return [FinalRecord(self.waiting.pop(0), FinishReason.LENGTH, Usage(1, 1, 0.08))]   # one finishes a step


def _add(rid: str) -> bytes:
    return wire.pack(["add", wire.encode_request(greedy("Hi.", 2, voice="vivian", request_id=rid))])


@pytest.fixture
def loop_pair():
    """process.py's `_serve` on a thread, at one end of an in-process ZeroMQ pair; the test at the other."""
    ctx = zmq.Context()
    engine_end, test_end = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    engine_end.bind("inproc://intake")
    test_end.connect("inproc://intake")
    core = _MidStepCore()
    thread = threading.Thread(target=_serve, args=(engine_end, CoreDriver(core)), daemon=True)
    thread.start()
    yield core, test_end
    test_end.send(wire.pack(["stop"]))
    thread.join(10)
    assert not thread.is_alive()
    engine_end.close(0)
    test_end.close(0)
    ctx.term()


def test_the_engine_loop_takes_adds_mid_step_and_leaves_the_rest_in_order(loop_pair):
    """process.py's loop lends its core a take_arrivals for each step: the adds waiting in the socket go in mid-step
    as one batch; the first other message (an abort) stops the reading, and it and the add behind it are handled
    after the step, in the order they came."""
    core, sock = loop_pair
    sock.send(_add("a"))
    assert core.in_step.wait(10)
    for msg in (_add("b"), _add("c"), wire.pack(["abort", "a"]), _add("d")):
        sock.send(msg)
    time.sleep(0.2)                         # (inproc delivery is asynchronous: let the four land)
    core.filled.set()
    records = []
    while len(records) < 4:
        assert sock.poll(10_000)
        kind, outs = wire.unpack(sock.recv())
        assert kind == "out"
        records += [wire.decode_output(o) for o in outs]
    assert core.log[:4] == [("add", ["a"], 0), ("take_arrivals", 1), ("add", ["b", "c"], 1), ("abort", "a", 1)]
    assert core.log[4] == ("add", ["d"], 1)
    assert [r.request_id for r in records][0] == "a" and records[0].reason is FinishReason.ABORTED
    assert sorted(r.request_id for r in records) == ["a", "b", "c", "d"]
