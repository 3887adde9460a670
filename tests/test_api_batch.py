"""POST /v1/audio/speech/batch end to end (voxflow/api/routes_batch.py).

A real uvicorn server on the tiny CustomVoice checkpoint (greedy, a few frames: deterministic and short) for
what the batch returns, admission, disconnects and auth; scripted engines (tests/test_api_speech.py) for engine
failures, concurrency and the shared reference clip. Every item is checked against what POST /v1/audio/speech
answers for the same request. Nothing asserts on timing; waits only turn a hang into a failure.
"""
import base64
import contextlib
import io
import json
import time
import wave

import httpx
import numpy as np
import pytest

from test_api_speech import (HANG, LONG, MODEL, ScriptedEngine, ServerThread, SilentEngine, _open_stream,
                             assert_error, decode, metrics, post_and_leave, speech, tiny_server, wait_idle)
from test_api_speech import http  # noqa: F401 (the fixture, shared)
from voxflow.api.app import create_app
from voxflow.api.state import ServerSettings

BATCH = "/v1/audio/speech/batch"
MAX_ITEMS = 4
MAX_CHARS = 300


@pytest.fixture(scope="module")
def server():
    # admission_wait_s=0: a batch that does not fit is refused at once (waiting for slots: test_api_admission.py)
    with tiny_server(max_concurrent_requests=4, max_batch_items=MAX_ITEMS, max_batch_input_chars=MAX_CHARS,
                     admission_wait_s=0) as srv:
        yield srv


def single(c: httpx.Client, defaults: dict, item: dict) -> httpx.Response:
    """What POST /v1/audio/speech answers for the request a batch item stands for (its nulls keep the defaults;
    its `speaker` is the voice)."""
    body = {**defaults, **{k: v for k, v in item.items() if v is not None}}
    if "speaker" in item:
        body["voice"] = body.pop("speaker")
    return c.post("/v1/audio/speech", json=body)


def requests_by_status(m: dict) -> dict:
    return {dict(k[1])["status"]: v for k, v in m.items() if k[0] == "voxflow_requests_total"}


def delta(before: dict, after: dict) -> dict:
    return {s: after[s] - before.get(s, 0) for s in after if after[s] != before.get(s, 0)}


# ------------------------------------------------------------------------------------------------ tiny engine
def test_items_decode_and_equal_the_single_endpoints_answers(http):
    """Mixed formats, voices, lengths and a time-stretch: each item's file is byte for byte what the single
    endpoint returns for the same greedy request, and decodes to the expected duration."""
    defaults = {"model": "tts-1", "voice": "alloy", "greedy": True, "response_format": "wav"}
    items = [{"input": "Hello there, world.", "max_new_tokens": 8, "voice": None},        # null: the default voice
             {"input": "A second sentence here.", "speaker": "ryan", "response_format": "flac", "max_new_tokens": 12},
             {"input": "Third one.", "response_format": "mp3", "speed": 2.0, "max_new_tokens": 16}]
    seconds = [7 * 0.08, 11 * 0.08, 15 * 0.08 / 2]                  # N tokens = N - 1 frames of 80 ms
    r = http.post(BATCH, json={**defaults, "items": items})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
    out = r.json()
    assert out["id"].startswith("speech-batch-") and len(out["id"]) > len("speech-batch-") + 16
    assert (out["total"], out["succeeded"], out["failed"]) == (3, 3, 0)
    assert [res["index"] for res in out["results"]] == [0, 1, 2]
    for res, item, want in zip(out["results"], items, seconds):
        fmt = item.get("response_format", "wav")
        assert res["status"] == "success" and res["error"] is None and res["status_code"] == 200
        data = base64.b64decode(res["audio_data"])
        ref = single(http, defaults, item)
        assert ref.status_code == 200
        assert res["media_type"] == ref.headers["content-type"]
        assert res["sample_rate"] == int(ref.headers["x-sample-rate"]) == 24000
        assert data == ref.content, fmt
        audio, rate = decode(data, fmt)
        assert rate == 24000 and abs(len(audio) / rate - want) < 0.03, (fmt, len(audio) / rate, want)
        assert res["usage"] == json.loads(ref.headers["x-usage"])
    # the item's null voice kept the batch's alloy: a single request's null would be the model's default voice
    first = base64.b64decode(out["results"][0]["audio_data"])
    assert first != http.post("/v1/audio/speech", json={**defaults, **items[0]}).content


def test_a_bad_item_fails_alone_with_the_single_endpoints_error(http):
    """Bad fields (caught while planning, by pydantic, by the engine's own checks) give that item the very error
    the single endpoint answers; the others succeed; the metrics count the items as those single requests."""
    defaults = {"model": "tts-1", "voice": "alloy", "greedy": True, "max_new_tokens": 8, "response_format": "pcm"}
    items = [{"input": "Good one."},
             {"input": "   "},                                        # 400 input, empty
             {"input": "Who?", "voice": "nobody"},                    # 404 voice
             {"input": "Fast.", "speed": 9},                          # 400 speed (pydantic)
             ]
    bad_engine = {"input": "Hot.", "greedy": False, "temperature": 0}    # 400 temperature, from the engine
    m0 = requests_by_status(wait_idle(http))
    r = http.post(BATCH, json={**defaults, "items": items})
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["total"], out["succeeded"], out["failed"]) == (4, 1, 3)
    r2 = http.post(BATCH, json={**defaults, "items": [items[0], bad_engine]})
    assert r2.status_code == 200 and [res["index"] for res in r2.json()["results"]] == [0, 1]
    results = out["results"] + r2.json()["results"]
    m1 = requests_by_status(wait_idle(http))
    for res, item in zip(results, items + [items[0], bad_engine]):
        ref = single(http, defaults, item)
        if ref.status_code == 200:
            assert res["status"] == "success" and base64.b64decode(res["audio_data"]) == ref.content
            continue
        assert res["status"] == "error" and res["audio_data"] is None and res["media_type"] is None, res
        assert res["status_code"] == ref.status_code
        assert res["error"] == ref.json()["error"], item
    assert [res["status_code"] for res in results] == [200, 400, 404, 400, 200, 400]
    assert [res["error"]["param"] for res in results if res["error"]] == ["input", "voice", "speed", "temperature"]
    m2 = requests_by_status(wait_idle(http))
    assert delta(m0, m1) == delta(m1, m2) == {"200": 2, "400": 1}     # the engine's 400 was admitted, as alone


def test_malformed_batches_are_rejected_whole(http):
    good = {"input": "Hello."}
    cases = [({"voice": "alloy"}, "items"),                                     # no items
             ({"items": []}, "items"),
             ({"items": [good] * (MAX_ITEMS + 1)}, "items"),
             ({"items": "Hello."}, "items"),
             ({"items": [good, "Hello."]}, "items.1"),
             ({"items": [good], "stream": True}, "stream"),
             ({"items": [good], "stream_format": "audio"}, "stream_format"),
             ({"items": [good, {"input": "x", "stream_format": "sse"}]}, "items.1.stream_format"),
             ({"items": [good], "input": "Hello."}, "input"),
             ({"items": [good], "speed": 10}, "speed"),                         # a default out of range
             ({"items": [{"input": "y" * 100}] * 3 + [{"input": "z"}]}, "items"),   # 301 > MAX_CHARS together
             ]
    before = wait_idle(http)
    for body, param in cases:
        r = http.post(BATCH, json=body)
        assert_error(r, 400, param)
        if isinstance(body.get("items"), list) and len(body["items"]) > MAX_ITEMS:
            assert r.json()["error"]["code"] == "too_many_items"
    assert_error(http.post(BATCH, json={"model": "whisper-1", "items": [good]}), 404, "model")
    assert_error(http.post(BATCH, content=b'{"items": [', headers={"Content-Type": "application/json"}), 400)
    after = wait_idle(http)
    assert requests_by_status(after) == requests_by_status(before)              # nothing reached the engine
    assert after[("voxflow_engine_prompt_tokens", ())] == before[("voxflow_engine_prompt_tokens", ())]
    # stream false / null is no streaming request: accepted
    r = http.post(BATCH, json={"stream": False, "stream_format": None, "max_new_tokens": 4,
                               "items": [{"input": "Hello.", "stream": None, "response_format": "pcm"}]})
    assert r.status_code == 200 and r.json()["succeeded"] == 1


def test_a_batch_with_no_free_slot_gets_429_and_one_with_fewer_free_slots_than_items_runs(server, http):
    """max_concurrent_requests = 4 (admission_wait_s = 0). All four held by streams: a batch of three valid items is
    refused as a whole (nothing runs), with Retry-After, counted as three rejections. Two held: the same batch runs,
    two items at once and the third in the slot the first of them frees (it waits without a deadline: its batch
    runs)."""
    before = metrics(http)
    body = {"voice": "alloy", "greedy": True, "max_new_tokens": 4, "response_format": "pcm"}
    three = [{"input": "One."}, {"input": "Two."}, {"input": "Three."}]
    with contextlib.ExitStack() as stack:
        for _ in range(4):
            _open_stream(stack, http, speech(response_format="pcm", stream_format="audio", **LONG))
        r = http.post(BATCH, json={**body, "items": three})
        assert_error(r, 429)
        assert int(r.headers["Retry-After"]) >= 1
        mid = metrics(http)
    wait_idle(http)
    key = ("voxflow_requests_rejected_total", (("reason", "concurrency"),))
    assert mid[key] - before[key] == 3
    assert requests_by_status(mid) == requests_by_status(before)              # the refused batch ran nothing
    with contextlib.ExitStack() as stack:
        for _ in range(2):
            _open_stream(stack, http, speech(response_format="pcm", stream_format="audio", **LONG))
        r = http.post(BATCH, json={**body, "items": three})
        assert r.status_code == 200 and r.json()["succeeded"] == 3
        r = http.post(BATCH, json={**body, "items": [{"input": "One."}, {"input": ""}, {"input": "Three."}]})
        assert r.status_code == 200 and r.json()["succeeded"] == 2 and r.json()["failed"] == 1
    after = wait_idle(http)
    assert after[key] == mid[key]                                               # nothing refused since
    assert server.app.state.vox.admission.running == 0                          # slots all given back


def test_a_batch_larger_than_the_concurrency_limit_runs_in_parts(server, http, monkeypatch):
    """More valid items than max_concurrent_requests (3 here): the items take the slots one at a time, each
    waiting for one its batch's earlier items free, never more than 3 at once; every item gets its audio, the same
    as the batch answers with slots for all (within one 16-bit step: the codec's float sums depend on the batch of
    streams it decoded with)."""
    assert MAX_ITEMS == 4
    body = {"voice": "alloy", "greedy": True, "max_new_tokens": 4, "response_format": "pcm",
            "items": [{"input": "One."}, {"input": "Two."}, {"input": "Three."}, {"input": "Four."}]}
    wide = http.post(BATCH, json=body)
    admission = server.app.state.vox.admission
    monkeypatch.setattr(admission, "capacity", 3)     # (the slots that exist decide)
    most = []
    release = admission.release
    monkeypatch.setattr(admission, "release", lambda n=1: (most.append(admission.running), release(n))[1])
    r = http.post(BATCH, json=body)
    assert r.status_code == 200 and r.json()["succeeded"] == 4
    assert max(most) == 3 and len(most) == 4         # the slots filled, never more than exist
    for part, whole in zip(r.json()["results"], wide.json()["results"]):
        x, y = (np.frombuffer(base64.b64decode(e["audio_data"]), "<i2").astype(np.int32) for e in (part, whole))
        assert x.shape == y.shape and np.abs(x - y).max() <= 1
    assert admission.running == 0


def test_client_disconnect_aborts_every_item(server, http):
    before = metrics(http)
    body = {"voice": "alloy", "response_format": "pcm", **LONG,
            "items": [{"input": "First long one."}, {"input": "Second long one."}, {"input": "Third long one."}]}
    post_and_leave(server.port, body, lambda: metrics(http)[("voxflow_num_requests_running", ())] >= 3, BATCH)
    after = wait_idle(http)
    assert after[("voxflow_engine_aborted", ())] - before[("voxflow_engine_aborted", ())] == 3
    assert delta(requests_by_status(before), requests_by_status(after)) == {"499": 3}
    key = ("voxflow_requests_finished_total", (("reason", "client_disconnect"),))
    assert after[key] - before.get(key, 0) == 3
    assert after[("voxflow_kv_cache_usage_ratio", ())] == 0
    bm = server.core.block_manager
    assert bm.num_free_blocks == bm.num_blocks and server.core.stats()["running"] == 0
    r = http.post(BATCH, json={"max_new_tokens": 4, "items": [{"input": "a"}] * MAX_ITEMS})
    assert r.json()["succeeded"] == MAX_ITEMS                                   # every slot was given back


def test_auth(server):
    with httpx.Client(base_url=server.url, timeout=HANG) as anon:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            assert_error(anon.post(BATCH, json={"items": [{"input": "hi"}]}, headers=headers), 401)


# ------------------------------------------------------------------------------------------------ scripted engines
class GatedEngine(ScriptedEngine):
    """Answers no request until `gate` are in: a batch whose items were run one after another would hang."""

    def __init__(self, gate: int, **info):
        super().__init__(**info)
        self.gate, self.held = gate, []

    def _submit(self, request):
        self.held.append(request)
        if len(self.held) == self.gate:
            for r in self.held:
                super()._submit(r)


def test_items_run_concurrently_and_engine_failures_stay_per_item():
    texts = ["fine", "invalid", "full", "internal"]        # ScriptedEngine: 200, 400, 503 queue full, 500
    engine = GatedEngine(gate=len(texts))
    with ServerThread(create_app(engine, ServerSettings(model_name="scripted"))) as srv, \
            httpx.Client(base_url=srv.url, timeout=HANG) as c:
        r = c.post(BATCH, json={"voice": "vivian", "response_format": "pcm",
                                "items": [{"input": t} for t in texts]})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [res["status_code"] for res in results] == [200, 400, 503, 500]
        assert len(base64.b64decode(results[0]["audio_data"])) == 2 * 1920 * 2
        assert results[2]["error"]["code"] == "queue_full"
        for res, text in zip(results[1:], texts[1:]):
            engine.gate, engine.held = 1, []                # a single request: answered at once
            ref = c.post("/v1/audio/speech", json={"voice": "vivian", "response_format": "pcm", "input": text})
            assert (res["status_code"], res["error"]) == (ref.status_code, ref.json()["error"])


def _wav_uri(freq: float) -> str:
    pcm = (np.sin(np.arange(24000) * freq) * 8000).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(24000), w.writeframes(pcm.tobytes())
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def test_batch_reference_clip_is_decoded_once_and_shared(monkeypatch):
    from voxflow.api import media
    calls = []
    real = media.resolve_ref_audio

    async def counted(value, *args, **kw):
        calls.append(value)
        return await real(value, *args, **kw)
    monkeypatch.setattr(media, "resolve_ref_audio", counted)
    shared, other = _wav_uri(0.1), _wav_uri(0.2)
    engine = ScriptedEngine(name="base", task="voice_clone", voices=[])
    with ServerThread(create_app(engine, ServerSettings(model_name="scripted-base"))) as srv, \
            httpx.Client(base_url=srv.url, timeout=HANG) as c:
        items = [{"input": "One."}, {"input": "Two.", "ref_text": "other words"}, {"input": "Three."},
                 {"input": "Four.", "ref_audio": other}, {"input": "Five.", "ref_audio": "ftp://x/y.wav"}]
        r = c.post(BATCH, json={"ref_audio": shared, "ref_text": "words", "response_format": "pcm", "items": items})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [res["status_code"] for res in results] == [200, 200, 200, 200, 400]
        assert results[4]["error"]["param"] == "ref_audio"
        assert sorted(calls) == sorted([shared, other, "ftp://x/y.wav"])       # each clip once
        by_text = {req.text: req for req in engine.submitted}
        assert len({id(by_text[t].ref_audio) for t in ("One.", "Two.", "Three.")}) == 1     # one buffer, shared
        assert [by_text[t].ref_text for t in ("One.", "Two.", "Four.")] == ["words", "other words", "words"]
        assert by_text["Four."].ref_audio != by_text["One."].ref_audio
        single = c.post("/v1/audio/speech", json={"input": "One.", "ref_audio": shared, "ref_text": "words"})
        assert single.status_code == 200 and engine.submitted[-1].ref_audio == by_text["One."].ref_audio


def test_client_disconnect_before_any_output_aborts_every_item():
    engine = SilentEngine()
    with ServerThread(create_app(engine, ServerSettings(model_name="scripted"))) as srv, \
            httpx.Client(base_url=srv.url, timeout=HANG) as c:
        body = {"voice": "vivian", "items": [{"input": "a"}, {"input": "b"}, {"input": "c"}]}
        post_and_leave(srv.port, body, lambda: len(engine.submitted) == 3, BATCH)
        deadline = time.monotonic() + HANG
        while not (len(engine.aborted) == 3 and metrics(c)[("voxflow_api_requests_in_flight", ())] == 0):
            assert time.monotonic() < deadline, "the items were not aborted"
            time.sleep(0.02)
        assert sorted(engine.aborted) == sorted(r.request_id for r in engine.submitted)
        assert delta({}, requests_by_status(metrics(c))) == {"499": 3}
        health = c.get("/health").json()
        assert health["engine_streams"] == 0 and health["in_flight"] == 0 and health["waiting"] == 0
        assert srv.app.state.vox.admission.running == 0                         # admission slots given back
