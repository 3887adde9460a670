"""EngineConfig.prefill_stream (voxflow/engine/prefill_lane.py): a step's prefill on a stream of its own beside its
decode. Its CUDA ordering is checked here with stand-ins for torch.cuda's streams and events, and its place in the
engine's step on the CPU engine; tests/gpu/test_gpu_engine.py holds the served codes to the CPU loop on a GPU."""
import contextlib

import pytest
import torch

from test_engine import assert_engine_matches_reference, codes_of, drive, greedy, make_engine
from voxflow.engine import engine as engine_mod
from voxflow.engine import prefill_lane as lane_mod
from voxflow.engine.config import EngineConfig
from voxflow.engine.prefill_lane import PrefillLane, make_prefill_lane


class FakeCuda:
    """torch.cuda's streams, events and stream context as a log: ("wait_event", waiter, event), ("wait_stream",
    waiter, other), ("record", event, stream), ("enter", stream) / ("exit", stream), ("work", stream)."""

    def __init__(self):
        self.log, self.current, self.events = [], "T", 0
        fake = self

        class Stream:
            def __init__(self, device=None):
                self.name, self.device = "P", device

            def wait_stream(self, other):
                fake.log.append(("wait_stream", self.name, other.name if hasattr(other, "name") else other))

        class Event:
            def __init__(self):
                fake.events += 1
                self.name = f"E{fake.events}"

            def record(self, stream):
                fake.log.append(("record", self.name, stream.name))

        class Current:
            name = "T"

            def wait_event(self, event):
                fake.log.append(("wait_event", "T", event.name))

        @contextlib.contextmanager
        def stream(s):
            fake.log.append(("enter", s.name))
            fake.current = s.name
            yield
            fake.current = "T"
            fake.log.append(("exit", s.name))
        self.Stream, self.Event, self.stream = Stream, Event, stream
        self.current_stream = lambda device=None: Current()

    def work(self):
        self.log.append(("work", self.current))


class Input:
    """A CUDA tensor stand-in: logs the streams it is marked as used on."""
    is_cuda = True

    def __init__(self, log):
        self.log = log

    def record_stream(self, stream):
        self.log.append(("record_stream", stream.name))


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda()
    for name in ("Stream", "Event", "stream", "current_stream"):
        monkeypatch.setattr(lane_mod.torch.cuda, name, getattr(fake, name))
    return fake


def test_the_prefill_follows_the_talkers_work_and_the_next_step_waits_for_it(cuda):
    lane = PrefillLane(torch.device("cuda", 0))
    lane.before_step()                                  # nothing queued on the lane yet: no wait
    assert cuda.log == []
    with lane.running([Input(cuda.log)]):
        cuda.work()
    assert cuda.log == [("wait_stream", "P", "T"), ("record_stream", "P"), ("enter", "P"), ("work", "P"),
                        ("exit", "P"), ("record", "E1", "P")]
    cuda.log.clear()
    cuda.work()                                         # this step's decode, on T: no wait for the lane
    lane.before_step()                                  # the next step: T waits for the lane's last prefill, once
    lane.before_step()
    assert cuda.log == [("work", "T"), ("wait_event", "T", "E1")]
    cuda.log.clear()
    with pytest.raises(RuntimeError):                   # a prefill that fails still leaves its event to wait for
        with lane.running([]):
            raise RuntimeError("a failed prefill")
    lane.before_step()
    assert cuda.log[-2:] == [("record", "E2", "P"), ("wait_event", "T", "E2")]


def test_the_lane_is_made_on_a_gpu_only_and_not_with_the_decode_first():
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert make_prefill_lane(EngineConfig(model="m"), gpu) is None
    assert make_prefill_lane(EngineConfig(model="m", prefill_stream=True), cpu) is None
    for device in (gpu, cpu):
        with pytest.raises(ValueError, match="exclude each other"):
            make_prefill_lane(EngineConfig(model="m", prefill_stream=True, decode_before_prefill=True), device)


def test_the_engine_attaches_on_the_talkers_stream_then_prefills_on_the_lane_before_its_decode(monkeypatch):
    """On the CPU engine with a lane that logs: every step first lets the lane's last prefill finish, then attaches
    its new requests (on the talker's stream), then queues the prefill on the lane (with the prompts' rows marked for
    it), then its decode; the codes and audio are the CPU reference's, as without a lane."""
    log = []

    class LoggingLane:
        def before_step(self):
            log.append("before_step")

        @contextlib.contextmanager
        def running(self, inputs):
            log.append(("enter", len(inputs)))
            yield
            log.append("exit")
    monkeypatch.setattr(engine_mod, "make_prefill_lane", lambda config, device: LoggingLane())
    core = make_engine(max_num_batched_tokens=64)
    for name, wrap in (("_attach", "attach"), ("_launch_decode", "decode")):
        real = getattr(core, name)
        monkeypatch.setattr(core, name, lambda *a, real=real, wrap=wrap: log.append(wrap) or real(*a))
    run = core.prefill.run
    monkeypatch.setattr(core.prefill, "run", lambda pairs: log.append(("prefill", len(pairs))) or run(pairs))
    reqs = [greedy("Hello there.", 6, voice="vivian", request_id="a"),
            greedy("The quick brown fox jumps over the lazy dog.", 8, voice="vivian", request_id="b"),
            greedy("Speak happily.", 5, voice="vivian", request_id="c")]
    results = drive(core, {0: reqs[:2], 3: reqs[2:]})      # c arrives while a and b decode
    assert_engine_matches_reference("custom_voice", core, results, reqs)
    steps, current = [], None
    for entry in log:
        if entry == "before_step":
            current = []
            steps.append(current)
        else:
            current.append(entry)
    prefill_steps = [s for s in steps if "attach" in s]
    assert len(prefill_steps) >= 2                       # the first wave's and c's
    for s in prefill_steps:
        n = s[s.index("attach") + 1][1]
        assert s[:4] == ["attach", ("enter", n), ("prefill", n), "exit"], s
    assert any(s[-1] == "decode" for s in prefill_steps)    # c's prefill beside a and b's decode
    monkeypatch.undo()
    plain = make_engine(max_num_batched_tokens=64)
    assert plain._prefill_lane is None
    plain_results = drive(plain, {0: reqs[:2], 3: reqs[2:]})
    for r in reqs:
        assert torch.equal(codes_of(core, r.request_id), codes_of(plain, r.request_id))
        assert plain_results[r.request_id][-1].reason == results[r.request_id][-1].reason
