"""Background prompt builds (`EngineConfig.background_builds`, engine/prompt_builder.py): arrivals built on a thread
beside the step loop must give every request what the inline build gives it (codes and audio equal to the eager
reference), end a refused request with an ERROR record, drop one aborted mid-build, count builds against the queue's
limit and ids, and raise a build's bug on the engine thread."""
from __future__ import annotations

import os
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_engine import assert_all_released, assert_engine_matches_reference, drive, greedy, make_engine
from voxflow.engine.engine import QueueFullError
from voxflow.engine.model_api import PreparedRequest
from voxflow.engine.prompt_builder import Build, PromptBuilder, _tensors
from voxflow.engine.request import AudioChunk, FinalRecord, FinishReason, StreamingOptions

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")
pytestmark = pytest.mark.skipif(not TINY, reason="needs the tiny checkpoints: VOXFLOW_TINY_DIR (tools/tiny_set.py)")


def test_background_builds_give_the_inline_builds_codes_and_audio():
    name = "custom_voice_1b7"
    core = make_engine(name, background_builds=True)
    assert core.builder is not None
    reqs = [greedy("Hello world.", 14, voice="vivian", request_id="a"),
            greedy("The quick brown fox jumps over the lazy dog.", 22, voice="ryan", language="english",
                   non_streaming_mode=False, request_id="b"),
            greedy("Speak.", 9, voice="eric", request_id="c"),
            greedy("This is a tiny test.", 17, voice="serena", instructions="Speak happily.", request_id="d")]
    results = drive(core, {0: reqs[:2], 3: reqs[2:3], 5: reqs[3:]})
    assert_engine_matches_reference(name, core, results, reqs)
    assert_all_released(core)
    core.shutdown()
    assert core.builder is None


def test_a_request_the_model_refuses_ends_with_an_error_record_and_the_others_run():
    core = make_engine(background_builds=True)
    errors = core.add_requests([greedy("Hello.", 5, voice="nobody", request_id="bad"),
                                greedy("Hello.", 5, voice="vivian", request_id="ok")])
    assert errors == [None, None]                   # accepted for building: the model's verdict comes later
    results = drive(core, {})
    bad = results["bad"]
    assert len(bad) == 1 and isinstance(bad[0], FinalRecord) and bad[0].reason is FinishReason.ERROR
    assert "nobody" in bad[0].error and bad[0].error_kind == "invalid_request"
    assert results["ok"][-1].reason is FinishReason.LENGTH
    assert core.stats()["errors"] == 1 and core.stats()["finished"] == 1
    assert_all_released(core)
    core.shutdown()


def test_builds_count_against_the_queue_limit_and_hold_their_ids():
    core = make_engine(background_builds=True, max_waiting=2)
    gate = threading.Event()
    prepare_many = core.model.prepare_many
    core.model.prepare_many = lambda reqs: (gate.wait(30), prepare_many(reqs))[1]     # builds wait on the gate
    errors = core.add_requests([greedy("Hello.", 5, voice="vivian", request_id=r) for r in ("x", "y", "z")])
    assert errors[:2] == [None, None] and isinstance(errors[2], QueueFullError)
    with pytest.raises(ValueError, match="already in use"):
        core.add_request(greedy("Hello.", 5, voice="vivian", request_id="x"))
    assert core.has_work() and core.builder.pending == 2
    gate.set()
    results = drive(core, {})
    assert {r: o[-1].reason for r, o in results.items()} == {"x": FinishReason.LENGTH, "y": FinishReason.LENGTH}
    assert_all_released(core)
    core.shutdown()


def test_an_abort_during_the_build_ends_the_request_at_once_and_its_build_is_dropped():
    core = make_engine(background_builds=True)
    gate = threading.Event()
    prepare_many = core.model.prepare_many
    core.model.prepare_many = lambda reqs: (gate.wait(30), prepare_many(reqs))[1]
    core.add_requests([greedy("Hello.", 6, voice="vivian", request_id="gone"),
                       greedy("Hello.", 6, voice="vivian", request_id="kept")])
    final = core.abort("gone")
    assert [(f.request_id, f.reason) for f in final] == [("gone", FinishReason.ABORTED)]
    assert core.abort("gone") == []                 # once
    gate.set()
    results = drive(core, {})
    assert "gone" not in results and "gone" not in core.recorded
    assert results["kept"][-1].reason is FinishReason.LENGTH
    assert core.stats()["aborted"] == 1
    assert_all_released(core)
    core.shutdown()


def test_a_build_that_raises_a_bug_raises_it_on_the_engine_thread():
    core = make_engine(background_builds=True)

    def broken(reqs):
        raise RuntimeError("a bug in the build")
    core.model.prepare_many = broken
    core.add_request(greedy("Hello.", 5, voice="vivian", request_id="r"))
    with pytest.raises(RuntimeError, match="a bug in the build"):
        while core.has_work():
            core.step()
    core.builder.close()


def test_the_tensors_of_a_prepared_request_are_all_found_for_the_hand_over():
    core = make_engine(background_builds=True)
    req = greedy("The quick brown fox.", 5, voice="vivian", non_streaming_mode=False, request_id="r")
    prepared = core.model.prepare_many([req])[0]
    assert isinstance(prepared, PreparedRequest)
    found = {id(t) for t in _tensors(prepared)}
    assert id(prepared.prompt_embeds) in found
    assert id(prepared.state.trailing_text) in found
    assert len(found) == len([t for t in _tensors(prepared)])    # each once
    core.shutdown()


def test_take_waits_for_a_pending_build_only_when_asked_to():
    gate = threading.Event()

    class Model:
        def prepare_many(self, reqs):
            gate.wait(30)
            return [f"built {r}" for r in reqs]
    builder = PromptBuilder(Model(), torch.device("cpu"))
    builder.submit(["a", "b"])
    assert builder.take(block=False) == [] and builder.pending == 2
    gate.set()
    (build,) = builder.take(block=True)
    assert isinstance(build, Build) and build.results == ["built a", "built b"] and build.error is None
    assert builder.pending == 0 and build.event is None       # (a CPU build has no event to wait for)
    builder.close()
    with pytest.raises(RuntimeError, match="closed"):
        builder.submit(["c"])


_shared = {}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["add", "abort", "step", "step", "step"]),
                          st.integers(0, 3), st.integers(2, 12)), min_size=1, max_size=25))
def test_random_arrivals_and_aborts_with_background_builds_keep_the_engine_consistent(ops):
    """Property: with builds landing whenever the builder finishes them, every request added gets exactly one final
    record and every block, slot and codec state is free at the end."""
    if "core" not in _shared:
        _shared["core"] = make_engine(num_kv_blocks=12, block_size=4, max_num_seqs=3, background_builds=True)
    core = _shared["core"]
    texts = ["Hello world.", "The quick brown fox.", "Hi.", "This is a tiny test of the quick brown fox."]
    finals: dict[str, int] = {}
    added = []

    def count(outs):
        for o in outs:
            if not isinstance(o, AudioChunk):
                finals[o.request_id] = finals.get(o.request_id, 0) + 1
    for i, (op, a, n) in enumerate(ops):
        if op == "add":
            rid = f"q{i}"
            core.add_request(greedy(texts[a], n, voice="vivian", request_id=rid,
                                    streaming=StreamingOptions(initial_chunk_frames=1 + a, chunk_frames=3)))
            added.append(rid)
        elif op == "abort" and added:
            count(core.abort(added[a % len(added)]))
        else:
            count(core.step())
        core.block_manager.check_invariants()
    while core.has_work():
        count(core.step())
        core.block_manager.check_invariants()
    assert finals == {rid: 1 for rid in added}
    assert_all_released(core)
    assert not core._building and core.builder.pending == 0
