"""Out-of-range integers in a speech request fail that request only (a 400 naming the field), never the engine.

A security audit found that one POST /v1/audio/speech with `"top_k": 2**63` or `"initial_codec_chunk_frames":
2**70` killed the engine process for good (every later request and /health: 503): the first overflowed an int64
tensor inside the engine step, the second reached the engine as a string (the wire's msgpack fallback). The server
here runs the real thing: the tiny CustomVoice checkpoint in its own engine process (ProcessEngineClient), behind
the speech, batch and WebSocket endpoints, which share one request body model (schemas.SpeechRequestBody).
"""
import asyncio
import functools
import json
import os

import httpx
import pytest

from test_api_speech import HANG, MODEL, ServerThread, assert_error, speech
from voxflow.api.app import create_app
from voxflow.api.state import ServerSettings

HUGE = {"top_k": 2 ** 63, "initial_codec_chunk_frames": 2 ** 70, "seed": 2 ** 64, "max_new_tokens": 2 ** 64}


@pytest.fixture(scope="module")
def server():
    from voxflow.engine.engine import EngineConfig, EngineCore
    from voxflow.engine.process import ProcessEngineClient
    config = EngineConfig(model=os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice"), max_num_seqs=4)
    engine = ProcessEngineClient(functools.partial(EngineCore.from_config, config), startup_timeout=120)
    with ServerThread(create_app(engine, ServerSettings(model_name=MODEL))) as srv:
        yield srv


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=HANG) as c:
        yield c


def assert_alive(http: httpx.Client) -> None:
    """The engine still serves: a normal request gets its audio, /health is 200."""
    r = http.post("/v1/audio/speech", json=speech(response_format="pcm"))
    assert r.status_code == 200 and len(r.content) > 0, r.text
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize("field", sorted(HUGE))
def test_huge_int_is_a_400_naming_the_field_and_the_engine_lives_on(http, field):
    r = http.post("/v1/audio/speech", json=speech(**{field: HUGE[field]}))
    assert_error(r, 400, field)
    assert field in r.json()["error"]["message"]
    assert_alive(http)


def test_just_past_each_bound_is_a_400_and_the_bound_itself_is_served(http):
    from voxflow.engine.request import CHUNK_FRAMES_MAX, TOP_K_MAX
    for field, bound in (("top_k", TOP_K_MAX), ("initial_codec_chunk_frames", CHUNK_FRAMES_MAX)):
        assert_error(http.post("/v1/audio/speech", json=speech(**{field: bound + 1})), 400, field)
        ok = http.post("/v1/audio/speech", json=speech(greedy=False, seed=1, **{field: bound}))
        assert ok.status_code == 200, ok.text
    # the sampling fields vLLM-Omni sends in extra_params are checked as the top-level ones
    r = http.post("/v1/audio/speech", json=speech(extra_params={"top_k": 2 ** 63}))
    assert_error(r, 400, "top_k")
    assert_alive(http)


def test_batch_item_with_a_huge_int_fails_alone(http):
    items = [{"input": "Hello there."}, {"input": "Bad one.", "top_k": 2 ** 63},
             {"input": "Third.", "initial_codec_chunk_frames": 2 ** 70}]
    r = http.post("/v1/audio/speech/batch", json={"model": "tts-1", "greedy": True, "max_new_tokens": 8,
                                                   "items": items})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [res["status_code"] for res in results] == [200, 400, 400]
    assert [res["error"]["param"] for res in results[1:]] == ["top_k", "initial_codec_chunk_frames"]
    assert_error(http.post("/v1/audio/speech/batch", json={"top_k": 2 ** 63, "items": [{"input": "Hi."}]}),
                 400, "top_k")
    assert_alive(http)


def test_websocket_session_config_with_a_huge_int_is_an_error_and_the_session_goes_on(server, http):
    import websockets

    async def main():
        url = server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        async with websockets.connect(url, max_size=None, open_timeout=HANG, close_timeout=HANG) as ws:
            async def recv():
                m = await asyncio.wait_for(ws.recv(), HANG)
                return m if isinstance(m, bytes) else json.loads(m)
            errors = []
            for field in ("top_k", "initial_codec_chunk_frames"):
                await ws.send(json.dumps({"type": "session.config", "voice": "vivian", field: HUGE[field]}))
                errors.append(await recv())
            await ws.send(json.dumps({"type": "session.config", "voice": "vivian", "greedy": True,
                                      "max_new_tokens": 8}))
            await ws.send(json.dumps({"type": "input.text", "text": "Hello there."}))
            await ws.send(json.dumps({"type": "input.done"}))
            got = [await recv()]
            while not (isinstance(got[-1], dict) and got[-1]["type"] == "session.done"):
                got.append(await recv())
            return errors, got

    errors, got = asyncio.run(main())
    assert [(e["type"], e["param"]) for e in errors] == [("error", "top_k"), ("error", "initial_codec_chunk_frames")]
    done = [m for m in got if isinstance(m, dict) and m["type"] == "audio.done"]
    assert len(done) == 1 and done[0]["error"] is False and done[0]["total_bytes"] > 0, got
    assert_alive(http)
