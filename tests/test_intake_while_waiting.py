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
    units = []

    def hook() -> bool:                       # what CoreDriver.install_intake gives the core
        batch = [arriving.popleft() for _ in range(min(2, len(arriving)))]
        if not batch:
            return False
        assert core.add_requests(batch) == [None] * len(batch)
        units.append((core.steps, [r.request_id for r in batch], [r.request_id for r in reqs[:2]
                                                                   if r.request_id not in core.live]))
        return True
    core.intake_hook = hook
    results = drive(core, {0: reqs[:2]})
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


def test_driver_hands_over_adds_and_emits_the_refused():
    core = make_engine(intake_while_waiting=3)
    driver = CoreDriver(core)
    queue = collections.deque(requests()[:2] + [greedy("Again.", 5, voice="vivian", request_id="a")])
    emitted = []
    driver.install_intake(lambda n: [queue.popleft() for _ in range(min(n, len(queue)))], emitted.extend)
    assert core.intake_hook() is True           # one unit: all three, the repeated id refused
    assert core.intake_hook() is False          # nothing left
    assert sorted(core.live) == ["a", "b"]
    assert len(emitted) == 1 and isinstance(emitted[0], FinalRecord)
    assert emitted[0].request_id == "a" and emitted[0].reason is FinishReason.ERROR
    while core.has_work():
        core.step()
    assert_all_released(core)


def test_driver_installs_nothing_with_the_setting_off():
    core = make_engine()
    CoreDriver(core).install_intake(lambda n: [], lambda outs: None)
    assert core.intake_hook is None


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
