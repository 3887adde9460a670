"""Out-of-range request options fail that request alone, however the request reaches the engine.

The engine is also a library and the CLI's: it checks a request's numeric sampling / streaming options when the
request is added (request.check_options), so that nothing out of range reaches a tensor inside a step, where a
top_k of 2**63 once raised and ended the engine process for every request after it. Over the process boundary an
int of any size arrives as that int (wire.py; past 64 bits it used to arrive as a string).
"""
import asyncio
import functools
import os

import numpy as np
import pytest

from voxflow.engine import wire
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.process import ProcessEngineClient
from voxflow.engine.request import (AudioChunk, FinalRecord, FinishReason, SamplingOptions, SpeechRequest,
                                    StreamingOptions)

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")

# (sampling options, streaming options, the field the error names)
BAD = [({"top_k": 2 ** 63}, {}, "top_k"),
       ({"top_k": -1}, {}, "top_k"),
       ({"seed": 2 ** 64}, {}, "seed"),
       ({"max_new_tokens": 2 ** 70}, {}, "max_new_tokens"),
       ({"temperature": float("inf")}, {}, "temperature"),
       ({"top_p": float("nan")}, {}, "top_p"),
       ({"repetition_penalty": 1e39}, {}, "repetition_penalty"),       # past float32: inf in its tensor
       ({}, {"initial_chunk_frames": 2 ** 70}, "initial_chunk_frames"),
       ({}, {"initial_chunk_frames": "1180591620717411303424"}, "initial_chunk_frames"),   # what the wire made of it
       ({}, {"chunk_frames": 2 ** 63}, "chunk_frames")]


def config(**kw):
    return EngineConfig(model=os.path.join(TINY, "custom_voice"), max_num_seqs=4, max_num_batched_tokens=64,
                        num_kv_blocks=128, block_size=4, **kw)


def request(rid, sampling=None, streaming=None):
    """Greedy, 6 tokens (5 frames), 1-frame first chunk, then 2-frame chunks; `sampling` / `streaming` override."""
    sampling = {"greedy": True, "max_new_tokens": 6, **(sampling or {})}
    streaming = {"initial_chunk_frames": 1, "chunk_frames": 2, **(streaming or {})}
    return SpeechRequest(text="Hello world.", voice="vivian", request_id=rid, sampling=SamplingOptions(**sampling),
                         streaming=StreamingOptions(**streaming))


def run(core):
    outs = []
    while core.has_work():
        outs += core.step()
    return outs


def final_of(outs, rid) -> FinalRecord:
    return next(o for o in outs if isinstance(o, FinalRecord) and o.request_id == rid)


@pytest.fixture(scope="module")
def core():
    return EngineCore.from_config(config())


@pytest.mark.parametrize("sampling, streaming, field", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_add_request_refuses_an_out_of_range_option_and_the_engine_serves_on(core, sampling, streaming, field):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        core.add_request(request("bad", sampling, streaming))
    assert not core.live and not core.has_work()                 # nothing of it was queued
    core.add_request(request("good"))
    outs = run(core)
    assert final_of(outs, "good").reason is FinishReason.LENGTH
    assert sum(o.num_frames for o in outs if isinstance(o, AudioChunk)) == 5


def test_the_bounds_themselves_are_served(core):
    from voxflow.engine.request import CHUNK_FRAMES_MAX, SEED_MAX, TOP_K_MAX
    core.add_request(request("edge", {"greedy": False, "seed": SEED_MAX, "top_k": TOP_K_MAX},
                             {"initial_chunk_frames": CHUNK_FRAMES_MAX, "chunk_frames": CHUNK_FRAMES_MAX}))
    final = final_of(run(core), "edge")
    assert final.reason in (FinishReason.EOS, FinishReason.LENGTH) and final.error is None


def test_a_bad_request_in_a_burst_fails_alone(core):
    errors = core.add_requests([request("a"), request("b", {"top_k": 2 ** 63}), request("c")])
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], ValueError) and str(errors[1]).startswith("top_k")
    outs = run(core)
    assert [final_of(outs, rid).reason for rid in "ac"] == [FinishReason.LENGTH] * 2


def test_ints_of_any_size_cross_the_wire_as_ints():
    r = request("w", {"top_k": 2 ** 63, "seed": -2 ** 70}, {"initial_chunk_frames": 2 ** 70,
                                                              "chunk_frames": np.int64(3)})
    back = wire.decode_request(wire.unpack(wire.pack(["add", wire.encode_request(r)]))[1])
    assert back.sampling.top_k == 2 ** 63 and back.sampling.seed == -2 ** 70
    assert back.streaming.initial_chunk_frames == 2 ** 70 and type(back.streaming.initial_chunk_frames) is int
    assert back.streaming.chunk_frames == 3 and type(back.streaming.chunk_frames) is int
    stats = {"big": 10 ** 30, "neg": -(10 ** 30), 2 ** 65: "key"}
    assert wire.unpack(wire.pack(["result", 0, stats, None, None]))[2] == stats


def test_an_engine_process_answers_an_out_of_range_request_with_an_error_and_lives_on():
    """The audit's two requests, over the process boundary: each gets an invalid_request record (the API's 400),
    and the engine process keeps serving."""
    async def collect(client, req):
        outs = [out async for out in client.generate(req)]
        return outs[-1], sum(o.num_frames for o in outs if isinstance(o, AudioChunk))

    async def main():
        async with ProcessEngineClient(functools.partial(EngineCore.from_config, config()),
                                       startup_timeout=120) as proc:
            for rid, sampling, streaming in (("k", {"top_k": 2 ** 63}, {}),
                                             ("f", {}, {"initial_chunk_frames": 2 ** 70})):
                final, frames = await collect(proc, request(rid, sampling, streaming))
                field = next(iter(sampling or streaming))
                assert final.reason is FinishReason.ERROR and final.error_kind == "invalid_request", final
                assert final.error.startswith(field) and frames == 0
                final, frames = await collect(proc, request(rid + "-ok"))
                assert final.reason is FinishReason.LENGTH and frames == 5, final
            health = await proc.health()
            assert health["alive"] and health["error"] is None
    asyncio.run(main())
