"""A burst of arrivals added in one call (EngineCore.add_requests, CoreDriver.add_many) and the engine loops that
collect a burst's adds into one batch (inprocess.py, process.py): each request gets what it gets when added alone
(the same error and message, the same codes), a bad request fails alone, nothing accepted is lost, the order of
adds and aborts is kept, and the step trace counts one prompt-building pass for the burst."""
import asyncio
import json
import time

import pytest
import torch

from voxflow.engine.errors import QueueFullError
from voxflow.engine.inprocess import CoreDriver, InProcessEngineClient
from voxflow.engine.model_api import prepare_requests
from voxflow.engine.process import ProcessEngineClient
from voxflow.engine.request import FinalRecord, FinishReason, SamplingOptions, SpeechRequest, StreamingOptions

from test_engine import make_engine  # tests/test_engine.py: the tiny custom_voice engine recording its frames

HANG = 20.0



def speech(rid, text="Hello there.", voice="vivian", frames=6, **kw) -> SpeechRequest:
    return SpeechRequest(text=text, voice=voice, request_id=rid, streaming=StreamingOptions(initial_chunk_frames=2),
                         sampling=SamplingOptions(greedy=True, max_new_tokens=frames), **kw)


def run_to_end(core) -> dict:
    finals = {}
    while core.has_work():
        for out in core.step():
            if isinstance(out, FinalRecord):
                finals[out.request_id] = out
    return finals


def burst() -> list[SpeechRequest]:
    """With one request already waiting and room for four: every way to be refused, between good requests."""
    return [speech("a"), speech("b", voice="nobody"), speech("a", text="The same id again."),
            speech("waiting"), speech("c", text="A second, longer sentence.", non_streaming_mode=False),
            speech("d", frames=20000), speech("e", text="Short."), speech("f"), speech("g", text="   ")]


def test_a_burst_gets_what_each_request_gets_added_alone():
    one_by_one, together = make_engine(max_waiting=4), make_engine(max_waiting=4)
    errors_alone = []
    for core in (one_by_one, together):
        core.add_request(speech("waiting", text="Already here."))
    for request in burst():
        try:
            one_by_one.add_request(request)
            errors_alone.append(None)
        except (ValueError, QueueFullError) as e:
            errors_alone.append(e)
    errors = together.add_requests(burst())
    assert [(type(e), str(e)) for e in errors] == [(type(e), str(e)) for e in errors_alone]
    # the queue filled at "f", so "g" is refused for that before its text is looked at, as alone
    kinds = [type(e).__name__ if e else None for e in errors]
    assert kinds == [None, "PromptError", "ValueError", "ValueError", None, "ValueError", None, "QueueFullError",
                     "QueueFullError"]
    finals_alone, finals = run_to_end(one_by_one), run_to_end(together)
    assert sorted(finals) == sorted(finals_alone) == ["a", "c", "e", "waiting"]
    for rid in finals:
        assert finals[rid].reason is finals_alone[rid].reason is FinishReason.LENGTH
        assert torch.equal(torch.cat(together.recorded[rid]), torch.cat(one_by_one.recorded[rid]))


def test_the_step_trace_counts_one_prompt_building_pass_for_a_burst(tmp_path):
    path = tmp_path / "steps.jsonl"
    core = make_engine(trace_steps=str(path))
    requests = [speech(f"r{i}", text=f"Sentence number {i}.") for i in range(4)] + [speech("bad", voice="x")]
    errors = core.add_requests(requests)
    assert errors[:4] == [None] * 4 and isinstance(errors[4], ValueError)
    prepare_seconds = {live.prepare_seconds for live in core.live.values()}
    assert len(prepare_seconds) == 1                 # every request of the pass waited for the whole pass
    run_to_end(core)
    core.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["added"] == 4 and lines[0]["prepare_batches"] == 1
    assert lines[0]["prepare_ms"] >= next(iter(prepare_seconds)) * 1e3 - 1e-3 > 0
    assert sum(r["added"] for r in lines) == 4 and sum(r["prepare_batches"] for r in lines) == 1


class _OnlyPrepare:
    """A model without prepare_many (as the Piper plugin): prepared one by one, bad requests fail alone."""

    def prepare(self, request):
        if request.text == "bad":
            raise ValueError("bad text")
        return f"prepared {request.request_id}"


def test_prepare_requests_falls_back_to_prepare_one_by_one():
    results = prepare_requests(_OnlyPrepare(), [speech("x"), speech("y", text="bad"), speech("z")])
    assert results[0] == "prepared x" and results[2] == "prepared z"
    assert isinstance(results[1], ValueError) and str(results[1]) == "bad text"

    class RaisesForTheBatch(_OnlyPrepare):          # prepare_many itself raises for one bad request
        def prepare_many(self, requests):
            if any(r.text == "bad" for r in requests):
                raise ValueError("bad text somewhere")
            return [self.prepare(r) for r in requests]
    results = prepare_requests(RaisesForTheBatch(), [speech("x"), speech("y", text="bad"), speech("z")])
    assert results[0] == "prepared x" and results[2] == "prepared z" and str(results[1]) == "bad text"

    class Broken:
        def prepare_many(self, requests):
            return []
    with pytest.raises(RuntimeError, match="0 results for 2 requests"):
        prepare_requests(Broken(), [speech("x"), speech("y")])


class _BatchingCore:
    """Records each add_requests call's ids; "bad" is refused, "slow" builds for 0.3 s (the burst that follows it
    queues up meanwhile); every accepted request ends at its first step."""

    def __init__(self, batches=True):
        self.batches, self.aborted, self.pending = [], [], []
        if not batches:
            self.add_requests = None

    def add_requests(self, requests):
        self.batches.append([r.request_id for r in requests])
        if any(r.text == "slow" for r in requests):
            time.sleep(0.3)
        return [self._add(r) for r in requests]

    def add_request(self, request):
        self.batches.append([request.request_id])
        error = self._add(request)
        if error is not None:
            raise error

    def _add(self, request):
        if request.text == "bad":
            return ValueError("bad text")
        if request.text == "full":
            return QueueFullError("the engine queue is full")
        self.pending.append(request.request_id)
        return None

    def abort(self, request_id):
        self.aborted.append(request_id)
        self.pending.remove(request_id)

    def has_work(self):
        return bool(self.pending)

    def step(self):
        done, self.pending = self.pending, []
        return [FinalRecord(rid, FinishReason.EOS) for rid in done]

    def stats(self):
        return {"batches": self.batches, "aborted": self.aborted}

    def shutdown(self):
        pass


@pytest.mark.parametrize("batches", [True, False], ids=["add_requests", "add_request_only"])
def test_driver_add_many_refuses_each_request_as_if_added_alone(batches):
    core = _BatchingCore(batches)
    driver = CoreDriver(core)
    assert driver.add(speech("live")) == []
    outs = driver.add_many([speech("x"), speech("live"), speech("y", text="bad"), speech("x"),
                            speech("z", text="full"), speech("w")])
    errors = {o.request_id: (o.error, o.error_kind) for o in outs}
    assert errors == {"live": ("request id 'live' is already in flight", None),
                      "x": ("request id 'x' is already in flight", None),
                      "y": ("bad text", "invalid_request"), "z": ("the engine queue is full", "overloaded")}
    assert all(o.reason is FinishReason.ERROR for o in outs)
    # the repeated "x" splits the burst: it is judged once the first "x" is in
    want = [["live"], ["x", "y"], ["z", "w"]] if batches else [["live"], ["x"], ["y"], ["z"], ["w"]]
    assert core.batches == want
    assert sorted(driver.live) == ["live", "w", "x"]


def make_batching_core():
    return _BatchingCore()


@pytest.mark.parametrize("mode", ["inprocess", "process"])
def test_the_engine_loop_hands_a_burst_of_adds_to_the_core_at_once(mode):
    """While a slow prompt build runs, a burst arrives: its adds reach the core in one add_requests call, up to an
    abort of one of them (order kept: the abort comes after its add), and the add after the abort in a later call;
    the bad request fails alone."""
    async def main():
        client = InProcessEngineClient(make_batching_core()) if mode == "inprocess" else \
            ProcessEngineClient(make_batching_core)
        async with client:
            async def collect(request):
                return [out async for out in client.generate(request)]
            slow = asyncio.ensure_future(collect(speech("slow", text="slow")))
            await asyncio.sleep(0.1)                        # its build is running (0.3 s)
            names = ["b0", "b1", "bad", "b2", "b3"]
            tasks = [asyncio.ensure_future(collect(speech(n, text="bad" if n == "bad" else "hi"))) for n in names]
            await asyncio.sleep(0)                          # the tasks have sent their adds
            await client.abort("b0")
            tasks.append(asyncio.ensure_future(collect(speech("after"))))
            results = dict(zip(["slow"] + names + ["after"], await asyncio.gather(slow, *tasks)))
            stats = (await client.health())["stats"]
        finals = {rid: outs[-1] for rid, outs in results.items()}
        assert finals["b0"].reason is FinishReason.ABORTED and stats["aborted"] == ["b0"]
        assert finals["bad"].reason is FinishReason.ERROR and finals["bad"].error == "bad text"
        assert all(finals[rid].reason is FinishReason.EOS for rid in ("slow", "b1", "b2", "b3", "after"))
        batches = stats["batches"]
        assert [rid for b in batches for rid in b] == ["slow"] + names + ["after"]
        assert any(b[-5:] == names for b in batches) and batches[-1] == ["after"]
    asyncio.run(asyncio.wait_for(main(), HANG))
