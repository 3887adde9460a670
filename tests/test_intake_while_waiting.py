"""EngineConfig.intake_while_waiting: arrivals taken, and their prompts built, while the engine waits for a decode
step's results (EngineCore._take_arrivals_while), handed over by the serving loops (CoreDriver.install_intake, the
engine process's Inbox, the in-process engine's command queue).

On a CPU a decode step has no CUDA event (its results are there when it returns), so the wait is simulated: each
in-flight step gets an event that reports "still running" a set number of times, which is what the GPU's would
do while the step runs. What is held: requests taken that way are served exactly as the reference serves them
(greedy codes and audio), in units of at most the configured size, never with the setting off; the loops hand
over adds only, in order, and hold back any other message for the loop."""
from __future__ import annotations

import collections

from test_engine import TINY, assert_all_released, assert_engine_matches_reference, drive, greedy, make_engine

import pytest

from voxflow.engine import wire
from voxflow.engine.inprocess import CoreDriver
from voxflow.engine.process import Inbox
from voxflow.engine.request import FinalRecord, FinishReason

pytestmark = pytest.mark.skipif(not TINY, reason="needs the tiny checkpoints (VOXFLOW_TINY_DIR)")


class StillRunning:
    """A CUDA event stand-in: query() is False `busy` times, then True."""

    def __init__(self, busy: int) -> None:
        self.busy = busy

    def query(self) -> bool:
        self.busy -= 1
        return self.busy < 0

    def synchronize(self) -> None:
        pass


def simulate_gpu_waits(core, busy: int) -> None:
    real = core._collect_decode

    def collect(inflight):
        if inflight.event is None:
            inflight.event = StillRunning(busy)
        return real(inflight)
    core._collect_decode = collect


def requests():
    return [greedy("Hello world.", 12, voice="vivian", request_id="a"),
            greedy("The quick brown fox.", 15, voice="ryan", request_id="b"),
            greedy("Speak.", 9, voice="eric", request_id="c"),
            greedy("This is a tiny test.", 11, voice="serena", request_id="d"),
            greedy("One more.", 10, voice="dylan", request_id="e")]


def test_arrivals_taken_while_waiting_are_served_as_the_reference_serves_them():
    core = make_engine(intake_while_waiting=2)
    simulate_gpu_waits(core, busy=3)
    reqs = requests()
    arriving = collections.deque(reqs[2:])
    units, refused = [], []

    def take(n):                              # the serving loop's side: up to n of the queued arrivals
        batch = [arriving.popleft() for _ in range(min(n, len(arriving)))]
        if batch:
            units.append((core.steps, [r.request_id for r in batch], [r.request_id for r in reqs[:2]
                                                                      if r.request_id not in core.live]))
        return batch
    CoreDriver(core).install_intake(take, refused.extend)
    results = drive(core, {0: reqs[:2]})
    assert not refused
    # taken during the first decode wait, in units of two at most, while a and b still ran
    assert [u[1] for u in units] == [["c", "d"], ["e"]]
    assert units[0][0] == units[1][0] and not units[0][2] and not units[1][2]
    assert core.timings["intake_in_wait"] > 0
    assert_engine_matches_reference("custom_voice", core, results, reqs)
    assert_all_released(core)


def test_off_by_default_the_hook_is_never_called():
    core = make_engine()
    simulate_gpu_waits(core, busy=3)
    calls = []
    core.intake_hook = lambda: calls.append(1) or False
    drive(core, {0: requests()[:2]})
    assert not calls


def test_driver_hands_over_adds_in_units_and_emits_the_refused():
    core = make_engine(intake_while_waiting=3)
    driver = CoreDriver(core)
    queue = collections.deque(requests()[:2] + [greedy("Again.", 5, voice="vivian", request_id="a")]
                              + requests()[2:])
    emitted, asked = [], []

    def take(n):
        asked.append(n)
        return [queue.popleft() for _ in range(min(n, len(queue)))]
    driver.install_intake(take, emitted.extend)
    assert core.intake_hook() is True           # a unit of three: a, b and a repeated id, refused
    assert sorted(core.live) == ["a", "b"] and len(queue) == 3
    assert len(emitted) == 1 and isinstance(emitted[0], FinalRecord)
    assert emitted[0].request_id == "a" and emitted[0].reason is FinishReason.ERROR
    assert core.intake_hook() is True and sorted(core.live) == ["a", "b", "c", "d", "e"]
    assert core.intake_hook() is False          # nothing left
    assert asked == [3, 3, 3]
    while core.has_work():
        core.step()
    assert_all_released(core)


@pytest.mark.parametrize("config", [dict(), dict(intake_while_waiting=4, add_seconds_per_step=0.004)],
                         ids=["off", "pacing"])
def test_driver_installs_nothing_when_off_or_pacing(config):
    core = make_engine(**config)
    CoreDriver(core).install_intake(lambda n: [], lambda outs: None)
    assert core.intake_hook is None


def test_engine_process_loop_serves_every_request_once_with_intake_on():
    """engine/process.py's loop (`_serve`) over a real ZeroMQ pair, its core waiting on simulated GPU steps: adds,
    aborts and stats calls interleaved in bursts; every request gets exactly one final record (an aborted one
    ABORTED unless it had finished), every call its answer, and some adds were taken inside steps, in units of at
    most two."""
    import random
    import threading
    import time

    import zmq

    from voxflow.engine.process import _serve
    core = make_engine(intake_while_waiting=2)
    simulate_gpu_waits(core, busy=4)
    driver = CoreDriver(core)
    units = []
    install = driver.install_intake

    def counting_install(take, emit):
        def counted(n):
            batch = take(n)
            if batch:
                units.append(len(batch))
            return batch
        install(counted, emit)
    driver.install_intake = counting_install
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    router.bind("inproc://intake-test")
    dealer.connect("inproc://intake-test")
    dealer.send(wire.pack(["hello"]))           # (the router learns the engine's identity; the loop never reads it)
    identity, _ = router.recv_multipart()
    thread = threading.Thread(target=_serve, args=(dealer, driver), daemon=True)
    thread.start()
    rng, sent, aborted, calls = random.Random(1), [], set(), 0
    voices = ["vivian", "ryan", "eric", "serena", "dylan"]
    for burst in range(8):
        for _ in range(rng.randint(1, 6)):
            rid = f"r{len(sent)}"
            request = greedy("Hello there world.", rng.randint(5, 14), voice=rng.choice(voices), request_id=rid)
            router.send_multipart([identity, wire.pack(["add", wire.encode_request(request)])])
            sent.append(rid)
            if rng.random() < 0.3:
                router.send_multipart([identity, wire.pack(["abort", rid])])
                aborted.add(rid)
            if rng.random() < 0.2:
                router.send_multipart([identity, wire.pack(["call", calls, "stats", []])])
                calls += 1
        time.sleep(rng.random() * 0.05)
    finals, answers, deadline = collections.Counter(), 0, time.time() + 120
    reasons = {}
    while (sum(finals.values()) < len(sent) or answers < calls) and time.time() < deadline:
        if router.poll(1000):
            message = wire.unpack(router.recv_multipart()[1])
            if message[0] == "out":
                for item in message[1]:
                    out = wire.decode_output(item)
                    if isinstance(out, FinalRecord):
                        finals[out.request_id] += 1
                        reasons[out.request_id] = out.reason
            elif message[0] == "result":
                answers += 1
    router.send_multipart([identity, wire.pack(["stop"])])
    while wire.unpack(router.recv_multipart()[1])[0] != "stopped":
        pass
    thread.join(10)
    router.close(0)
    dealer.close(0)
    ctx.term()
    assert sorted(finals) == sorted(sent) and set(finals.values()) == {1}
    assert answers == calls
    assert all(reasons[rid] in (FinishReason.ABORTED, FinishReason.LENGTH) for rid in aborted)
    assert units and max(units) <= 2
    assert_all_released(core)


def test_inbox_takes_adds_in_order_and_holds_back_any_other_message():
    reqs = requests()
    msgs = collections.deque([["add", wire.encode_request(reqs[0])], ["add", wire.encode_request(reqs[1])],
                              ["abort", "a"], ["add", wire.encode_request(reqs[2])]])
    inbox = Inbox(lambda: msgs.popleft() if msgs else None)
    assert [r.request_id for r in inbox.take_adds(5)] == ["a", "b"]      # stops at the abort
    assert inbox.take_adds(5) == []                                       # still held: the loop goes first
    assert inbox.receive() == ["abort", "a"]
    assert [r.request_id for r in inbox.take_adds(1)] == ["c"]
    assert inbox.receive() is None and not inbox.held


def test_the_loop_does_not_sleep_on_a_held_message():
    """An idle core and a quiet socket: the loop sleeps in poll() until a message comes, unless the inbox holds one
    the intake met (it would be stranded)."""
    from voxflow.engine.process import _poll_timeout_ms
    driver = CoreDriver(make_engine())
    inbox = Inbox(lambda: None)
    assert _poll_timeout_ms(inbox, driver) is None
    inbox.held.append(["call", 0, "stats", []])
    assert _poll_timeout_ms(inbox, driver) == 0
