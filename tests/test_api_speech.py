"""POST /v1/audio/speech and the server core (models, health, metrics, auth, limits) end to end.

One real uvicorn server (background thread) serves a real in-process engine on the tiny CustomVoice checkpoint;
the official `openai` package and httpx talk to it over TCP. Requests are greedy with a few frames only
(max_new_tokens), so every output is deterministic and short. Error mapping of engine states that the tiny
engine cannot be put in (queue full, dead engine, failure mid-stream) uses a scripted EngineClient over the ASGI
transport. Nothing asserts on timing; waits only turn a hang into a failure.
"""
import asyncio
import base64
import contextlib
import io
import json
import os
import socket
import struct
import threading
import time

import av
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from voxflow.api.app import create_app
from voxflow.api.state import ServerSettings
from voxflow.engine.client import EngineClient
from voxflow.engine.request import AudioChunk, FinalRecord, FinishReason, Usage

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "acme/tiny-custom-voice"
FAST = {"greedy": True, "max_new_tokens": 8}          # 7 frames = 0.56 s of audio
LONG = {"greedy": True, "max_new_tokens": 400, "ignore_eos": True, "initial_codec_chunk_frames": 1}
HANG = 30.0
FORMATS = ["pcm", "wav", "mp3", "opus", "aac", "flac"]
CONTAINER = {"wav": "wav", "mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac"}


# ------------------------------------------------------------------------------------------------ server
class ServerThread:
    def __init__(self, app):
        import uvicorn
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    http="h11", loop="asyncio", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + HANG
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(HANG)


@contextlib.contextmanager
def tiny_server(**settings):
    """A uvicorn server (ServerThread, with its engine core as .core) on the tiny CustomVoice checkpoint, 4 engine
    slots, API key KEY, 64 KiB bodies, and these ServerSettings."""
    from voxflow.engine.engine import EngineConfig, EngineCore
    from voxflow.engine.inprocess import InProcessEngineClient
    core = EngineCore.from_config(EngineConfig(model=os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice"),
                                               max_num_seqs=4))
    settings = ServerSettings(model_name=MODEL, api_keys=(KEY,), max_body_bytes=64 * 1024, **settings)
    with ServerThread(create_app(InProcessEngineClient(core), settings)) as srv:
        srv.core = core
        yield srv


@pytest.fixture(scope="module")
def server():
    # admission_wait_s=0: a request beyond the limit is refused at once (the flood test counts those 429s); waiting
    # in the admission queue is test_api_admission.py's
    with tiny_server(max_concurrent_requests=2, admission_wait_s=0) as srv:
        yield srv


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=HANG) as c:
        wait_idle(c)
        yield c


@pytest.fixture
def oai(server):
    import openai
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=HANG, max_retries=0) as c:
        yield c


def metrics(c: httpx.Client) -> dict:
    out = {}
    for family in text_string_to_metric_families(c.get("/metrics").text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def wait_idle(c: httpx.Client) -> dict:
    """Until no speech request is in flight in the API or the engine (after a disconnect: the abort landed)."""
    deadline = time.monotonic() + HANG
    while True:
        m = metrics(c)
        if (m[("voxflow_api_requests_in_flight", ())] == 0 and m[("voxflow_num_requests_running", ())] == 0
                and m[("voxflow_num_requests_waiting", ())] == 0):
            return m
        assert time.monotonic() < deadline, "server did not become idle"
        time.sleep(0.05)


def speech(**kw) -> dict:
    body = {"model": "tts-1", "input": "Hello there, world.", "voice": "alloy", **FAST}
    body.update(kw)
    return body


def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Mono float samples and rate, decoded with PyAV (pcm: s16le at 24 kHz)."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0, 24000
    chunks, rate = [], None
    with av.open(io.BytesIO(data), format=CONTAINER[fmt]) as container:
        for frame in container.decode(audio=0):
            rate = frame.sample_rate
            x = frame.to_ndarray().reshape(-1)
            if x.dtype.kind == "i":
                x = x.astype(np.float32) / float(np.iinfo(x.dtype).max + 1)
            chunks.append(x)
    return np.concatenate(chunks), rate


def assert_error(r: httpx.Response, status: int, param: str | None = None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err


# ------------------------------------------------------------------------------------------------ openai SDK
def test_openai_sdk_every_format_whole_and_streamed(server, oai, http):
    ref = oai.audio.speech.create(model="tts-1", voice="alloy", input="Hello there, world.", response_format="pcm",
                                  extra_body=FAST).content
    ref_s16 = np.frombuffer(ref, dtype="<i2")
    seconds = len(ref_s16) / 24000
    assert 0.3 < seconds < 1.0
    for fmt in FORMATS:
        whole = oai.audio.speech.create(model="tts-1", voice="alloy", input="Hello there, world.",
                                        response_format=fmt, extra_body=FAST).content
        with oai.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input="Hello there, world.", response_format=fmt,
                stream_format="audio", extra_body=FAST) as resp:
            assert resp.headers["content-type"].startswith(
                {"pcm": "audio/pcm", "wav": "audio/wav", "mp3": "audio/mpeg", "opus": "audio/ogg",
                 "aac": "audio/aac", "flac": "audio/flac"}[fmt])
            streamed = b"".join(resp.iter_bytes())
        for data in (whole, streamed):
            audio, rate = decode(data, fmt)
            assert rate == (48000 if fmt == "opus" else 24000), fmt
            assert abs(len(audio) / rate - seconds) < 0.1, (fmt, len(audio) / rate, seconds)
        if fmt in ("pcm", "wav", "flac"):        # lossless: streamed and whole decode to the very same samples
            a, _ = decode(whole, fmt)
            b, _ = decode(streamed, fmt)
            assert len(a) == len(b) == len(ref_s16), fmt
            assert np.max(np.abs(a - b)) <= 2 / 32768, fmt
            assert np.max(np.abs(a - ref_s16 / 32768.0)) <= 2 / 32768, fmt


def test_streamed_wav_header_and_pcm_headers(http):
    with http.stream("POST", "/v1/audio/speech", json=speech(response_format="wav", stream_format="audio")) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
        data = r.read()
    riff, riff_size, wave, fmt_, fmt_size, tag, ch, rate, byte_rate, align, bits, data_tag, data_size = \
        struct.unpack("<4sI4s4sIHHIIHH4sI", data[:44])
    assert (riff, wave, fmt_, data_tag) == (b"RIFF", b"WAVE", b"fmt ", b"data")
    assert riff_size == data_size == 0xFFFFFFFF
    assert (fmt_size, tag, ch, rate, byte_rate, align, bits) == (16, 1, 1, 24000, 48000, 2, 16)
    assert len(data) > 44 and (len(data) - 44) % 2 == 0

    r = http.post("/v1/audio/speech", json=speech(response_format="pcm"))
    assert r.status_code == 200
    assert r.headers["content-type"] == "audio/pcm"
    assert r.headers["x-sample-rate"] == "24000" and r.headers["x-audio-format"] == "s16le"
    assert r.headers["x-channels"] == "1"
    # whole WAV: real sizes
    r = http.post("/v1/audio/speech", json=speech(response_format="wav"))
    size, = struct.unpack_from("<I", r.content, 40)
    assert size == len(r.content) - 44


def test_server_timing_splits_the_first_audio(http):
    """Streamed and whole responses say where their first audio's time went inside the server (the bench reads
    it): handler -> engine, the engine's own parts up to its first chunk (intake, prompt build, queue and
    prefill, first frame, first chunk), chunk -> API. Durations only, no claims about their size."""
    from voxflow.bench.client import parse_server_timing
    from voxflow.engine.live_request import TTFP_PARTS
    for body in (speech(response_format="pcm", stream_format="audio"), speech(response_format="pcm")):
        with http.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            timing = parse_server_timing(r.headers["server-timing"])
            r.read()
        assert list(timing) == ["api", "intake", *TTFP_PARTS, "relay"] and all(v >= 0 for v in timing.values())
        assert timing["prepare"] > 0 and timing["first_frame"] > 0        # the engine's parts, measured


def test_server_timing_without_the_engines_split_names_the_engine_as_one_part():
    """An engine output without the split (another engine, an older one): one `engine` part, the same total."""
    from voxflow.api.routes_speech import SpeechJob
    from voxflow.bench.client import parse_server_timing
    job = SpeechJob.__new__(SpeechJob)
    job.arrived_at, job.submitted_at, job.first_out_at = 10.0, 10.001, 10.060
    for parts, want in ((None, ["api", "engine", "relay"]),
                        ({"prepare": 0.002, "queue_and_prefill": 0.02, "first_frame": 0.01, "first_chunk": 0.02},
                         ["api", "intake", "prepare", "queue_and_prefill", "first_frame", "first_chunk", "relay"])):
        job.first = AudioChunk("r", 0, b"", 24000, 0, 0, 1, emitted_at=10.055, ttfp_parts=parts)
        timing = parse_server_timing(job.server_timing()["Server-Timing"])
        assert list(timing) == want
        assert abs(sum(timing.values()) - 60.0) < 0.05              # api + engine + relay, in ms
        if parts:
            assert abs(timing["intake"] - (54.0 - 52.0)) < 0.01     # engine 54 ms, of which its parts 52 ms


def _sse_events(r: httpx.Response) -> list[dict]:
    events = []
    for line in r.iter_lines():
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
    return events


def test_sse_events_and_legacy_stream_flag(http):
    raw = http.post("/v1/audio/speech", json=speech(response_format="pcm")).content
    for extra in ({"stream_format": "sse"}, {"stream": True}):
        with http.stream("POST", "/v1/audio/speech", json=speech(response_format="pcm", **extra)) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = _sse_events(r)
        *deltas, done = events
        assert deltas and all(e["type"] == "speech.audio.delta" and e["response_format"] == "pcm" for e in deltas)
        audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
        assert np.max(np.abs(np.frombuffer(audio, "<i2").astype(int) - np.frombuffer(raw, "<i2"))) <= 2
        assert done["type"] == "speech.audio.done"
        u = done["usage"]
        assert u["input_tokens"] > 0 and u["output_tokens"] == 7
        assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    # wav over SSE: the deltas concatenate to a valid WAV
    with http.stream("POST", "/v1/audio/speech", json=speech(response_format="wav", stream_format="sse")) as r:
        audio = b"".join(base64.b64decode(e["audio"]) for e in _sse_events(r) if e["type"] == "speech.audio.delta")
    assert audio[:4] == b"RIFF" and len(decode(audio, "wav")[0]) == len(raw) // 2


def test_voices_models_and_aliases(http):
    base = http.post("/v1/audio/speech", json=speech(voice="serena", response_format="pcm")).content
    for voice in ("alloy", "Serena", "SERENA", {"id": "serena"}):       # alloy -> serena (voice_names.py)
        assert http.post("/v1/audio/speech", json=speech(voice=voice, response_format="pcm")).content == base
    other = http.post("/v1/audio/speech", json=speech(voice="ryan", response_format="pcm")).content
    assert other != base
    for model in (MODEL, "tiny-custom-voice", "gpt-4o-mini-tts", None):
        body = speech(model=model, response_format="pcm")
        assert http.post("/v1/audio/speech", json=body).status_code == 200, model
    models = http.get("/v1/models").json()
    card, = models["data"]
    assert models["object"] == "list" and card["id"] == MODEL and card["object"] == "model"
    assert card["sample_rate"] == 24000 and "serena" in card["voices"] and card["openai_voices"]["alloy"] == "serena"


def test_bad_input_matrix(http):
    cases = [
        ({"model": "tts-1", "voice": "alloy"}, 400, "input"),
        (speech(input=""), 400, "input"),
        (speech(input="   "), 400, "input"),
        (speech(input="a" * 4097), 400, "input"),
        (speech(voice="nobody"), 404, "voice"),
        (speech(model="whisper-1"), 404, "model"),
        (speech(response_format="ogg"), 400, "response_format"),
        (speech(speed=0.1), 400, "speed"),
        (speech(speed=4.5), 400, "speed"),
        (speech(stream_format="chunks"), 400, "stream_format"),
        (speech(task_type="VoiceDesign"), 400, "task_type"),
        (speech(task_type="Talk"), 400, "task_type"),
        (speech(ref_audio="data:audio/wav;base64,AAAA"), 400, "ref_audio"),
        (speech(language="Klingon"), 400, "language"),
        (speech(max_new_tokens=0), 400, "max_new_tokens"),
        (speech(seed=-1), 400, "seed"),
        (speech(input=123), 400, "input"),
    ]
    for body, status, param in cases:
        assert_error(http.post("/v1/audio/speech", json=body), status, param)
    json_type = {"Content-Type": "application/json"}
    r = http.post("/v1/audio/speech", content=b'{"input": "hi", "voice": ', headers=json_type)
    assert_error(r, 400)
    assert r.json()["error"]["code"] == "invalid_json"
    assert_error(http.post("/v1/audio/speech", content=b"[1, 2]", headers=json_type), 400)
    assert_error(http.post("/v1/audio/speech", json=speech(input="x" * 70_000)), 413)
    # chunked upload without Content-Length: cut while reading
    assert_error(http.post("/v1/audio/speech", content=iter([b"{" + b" " * 40_000] * 2)), 413)
    # what each message says, and the field it names as a client spells it
    r = http.post("/v1/audio/speech", json=speech(max_new_tokens=1))       # 1 token = 0 frames: no audio
    assert_error(r, 400, "max_new_tokens")
    assert "max_new_tokens must be >= 2" in r.json()["error"]["message"]
    r = http.post("/v1/audio/speech", json=speech(voice=5))                 # not "voice.str" (a union member)
    assert_error(r, 400, "voice")
    assert "voice.str" not in r.json()["error"]["message"]
    r = http.post("/v1/audio/speech", json=speech(greedy=False, temperature=0))     # the engine's own check
    assert_error(r, 400, "temperature")
    assert "greedy" in r.json()["error"]["message"] and "do_sample" not in r.json()["error"]["message"]
    for headers in ({}, {"Content-Type": "application/x-www-form-urlencoded"}):      # curl -d sends the latter
        r = http.post("/v1/audio/speech", content=json.dumps(speech()).encode(), headers=headers)
        assert_error(r, 400)
        assert "Content-Type: application/json" in r.json()["error"]["message"]
    r = http.post("/v1/audio/speech", content=b"[1, 2]", headers=json_type)
    assert "must be a JSON object" in r.json()["error"]["message"]
    # null means the default (SDKs send null for fields left unset): speed 1.0, response_format mp3, ...
    nulls = speech(speed=None, response_format=None, temperature=None, top_k=None, top_p=None,
                   repetition_penalty=None, seed=None, initial_codec_chunk_frames=None)
    r = http.post("/v1/audio/speech", json=nulls)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg", r.text
    assert r.content == http.post("/v1/audio/speech", json=speech()).content
    # the language of a request is case-insensitive, Auto included
    for lang in ("English", "auto", "Auto"):
        assert http.post("/v1/audio/speech", json=speech(language=lang, response_format="pcm")).status_code == 200


def test_auth(server, http):
    with httpx.Client(base_url=server.url, timeout=HANG) as anon:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            assert_error(anon.post("/v1/audio/speech", json=speech(), headers=headers), 401)
            assert_error(anon.get("/v1/models", headers=headers), 401)
        for path in ("/", "/health", "/live", "/ready", "/metrics"):       # probes and scrapers: open
            assert anon.get(path).status_code == 200, path
    import openai
    with openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.audio.speech.create(model="tts-1", voice="alloy", input="hi")


def test_health_and_root(http):
    http.post("/v1/audio/speech", json=speech(response_format="pcm"))
    r = http.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["engine"]["running"] == 0
    # the engine's own split of first-audio latency (an HTTP benchmark records it after its run)
    assert set(r.json()["engine"]["ttfp_breakdown_ms"]) == {"prepare", "queue_and_prefill", "first_frame",
                                                            "first_chunk"}
    # and the prefix cache's counters (the bench reads them before and after a run)
    engine = r.json()["engine"]
    assert engine["prompt_tokens"] > 0 and 0 <= engine["prompt_tokens_cached"] <= engine["prompt_tokens"]
    # and the requests preempted so far (their KV pages given back under memory pressure, recomputed later: an
    # HTTP benchmark's record of a tight KV pool)
    assert engine["preemptions"] == 0
    # and where the engine's start went (its startup record: a first start on a GPU machine compiles every kernel)
    assert engine["startup"]["startup_seconds"] > 0 and engine["startup"]["kv_cache_blocks"] > 0
    assert http.get("/").json()["model"] == MODEL


def _open_stream(stack: contextlib.ExitStack, c: httpx.Client, body: dict) -> httpx.Response:
    r = stack.enter_context(c.stream("POST", "/v1/audio/speech", json=body))
    assert r.status_code == 200
    # Keep the iterator: closing it (e.g. when garbage-collected) closes the connection.
    r.chunks = r.iter_raw()
    assert next(r.chunks)                       # the first audio is out: the request is running in the engine
    return r


def test_flood_beyond_concurrency_limit_then_serves_again(server, http):
    before = metrics(http)
    with contextlib.ExitStack() as stack:
        for _ in range(2):                      # settings.max_concurrent_requests = 2, both held open
            _open_stream(stack, http, speech(response_format="pcm", stream_format="audio", **LONG))
        for _ in range(3):
            r = http.post("/v1/audio/speech", json=speech())
            assert_error(r, 429)
            assert int(r.headers["Retry-After"]) >= 1
    after = wait_idle(http)
    key = ("voxflow_requests_rejected_total", (("reason", "concurrency"),))
    assert after[key] - before[key] == 3
    assert http.post("/v1/audio/speech", json=speech(response_format="pcm")).status_code == 200


def test_client_disconnect_aborts_the_engine_request(server, http):
    before = metrics(http)
    with contextlib.ExitStack() as stack:
        _open_stream(stack, http, speech(response_format="pcm", stream_format="audio", **LONG))
    after = wait_idle(http)                     # the API noticed, the engine finished the request
    assert after[("voxflow_engine_aborted", ())] == before[("voxflow_engine_aborted", ())] + 1
    assert after[("voxflow_engine_codec_nonfinite_chunks", ())] == 0      # the engine's NaN-chunk count, exported
    # prompt positions admitted (the stream's prompt, at least a template's worth) and those the prefix cache held
    grew = after[("voxflow_engine_prompt_tokens", ())] - before[("voxflow_engine_prompt_tokens", ())]
    cached = after[("voxflow_engine_prompt_tokens_cached", ())]
    assert grew >= 8 and 0 <= cached <= after[("voxflow_engine_prompt_tokens", ())]
    key = ("voxflow_requests_finished_total", (("reason", "client_disconnect"),))
    assert after[key] - before.get(key, 0) == 1
    assert after[("voxflow_kv_cache_usage_ratio", ())] == 0          # no leaked KV blocks
    stats = server.core.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0 and server.core.block_manager.num_free_blocks == \
        server.core.block_manager.num_blocks


def post_and_leave(port: int, body: dict, started, path: str = "/v1/audio/speech") -> None:
    """POST `body` to `path` on a raw connection and close it, unanswered, once `started()` is true."""
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=HANG) as s:
        s.sendall(head + data)
        deadline = time.monotonic() + HANG
        while not started():
            assert time.monotonic() < deadline, "the request did not start"
            time.sleep(0.02)


def test_client_disconnect_aborts_a_whole_file_request(server, http):
    """A whole-file request sends nothing until its audio is complete (the engine's only chunk comes at the end):
    a client leaving while it generates still aborts it in the engine and counts as 499, like a stream."""
    before = metrics(http)
    post_and_leave(server.port, speech(response_format="pcm", **LONG),    # left while decoding in the engine
                   lambda: metrics(http)[("voxflow_num_requests_running", ())] >= 1)
    after = wait_idle(http)         # unfixed: the request runs to its end (or past HANG) and answers 200
    assert after[("voxflow_engine_aborted", ())] == before[("voxflow_engine_aborted", ())] + 1
    for status, grew in (("499", 1), ("200", 0)):
        key = ("voxflow_requests_total", (("status", status),))
        assert after.get(key, 0) - before.get(key, 0) == grew, status
    key = ("voxflow_requests_finished_total", (("reason", "client_disconnect"),))
    assert after[key] - before.get(key, 0) == 1
    assert server.core.block_manager.num_free_blocks == server.core.block_manager.num_blocks


def test_metrics_after_requests(http):
    before = metrics(http)
    http.post("/v1/audio/speech", json=speech(response_format="pcm"))
    with http.stream("POST", "/v1/audio/speech", json=speech(response_format="pcm", stream_format="audio")) as r:
        r.read()
    m = wait_idle(http)
    ok = ("voxflow_requests_total", (("status", "200"),))
    assert m[ok] - before.get(ok, 0) == 2
    for name in ("voxflow_audio_ttfp_seconds_count", "voxflow_e2e_request_latency_seconds_count",
                 "voxflow_audio_rtf_count"):
        assert m[(name, ())] - before.get((name, ()), 0) == 2, name
    assert m[("voxflow_audio_underrun_seconds_count", ())] - before.get(("voxflow_audio_underrun_seconds_count", ()),
                                                                        0) == 1       # streams only
    assert m[("voxflow_audio_seconds_total", ())] - before[("voxflow_audio_seconds_total", ())] == pytest.approx(
        2 * 7 * 0.08, abs=1e-3)


# ------------------------------------------------------------------------------------ scripted engine states
class ScriptedEngine(EngineClient):
    """text "invalid" -> the engine's ValueError; "full" -> queue full; "midfail" -> a chunk, then an error;
    anything else -> two chunks then EOS. `down` makes generate raise EngineUnavailableError."""

    INFO = {"name": "scripted", "family": "qwen3_tts", "task": "custom_voice", "sample_rate": 24000,
                  "voices": ["vivian", "ryan"], "languages": ["auto", "english"], "supports_instructions": False}

    def __init__(self, **info):
        super().__init__()
        self.info = {**self.INFO, **info}
        self.submitted = []
        self.aborted = []

    async def start(self):
        self._started = True
        self._model_info = dict(self.info)

    def _submit(self, request):
        self.submitted.append(request)
        rid = request.request_id
        chunk = AudioChunk(rid, 0, np.full(1920, 0.1, "<f4").tobytes(), 24000, 1920, 0, 1)
        final = FinalRecord(rid, FinishReason.EOS, Usage(prompt_tokens=5, frames=2, audio_seconds=0.16))
        script = {"invalid": [FinalRecord(rid, FinishReason.ERROR, error="unknown speaker 'x'; available: a",
                                          error_kind="invalid_request")],
                  "full": [FinalRecord(rid, FinishReason.ERROR, error="the engine queue is full (0 waiting requests)",
                                       error_kind="overloaded")],
                  "midfail": [chunk, FinalRecord(rid, FinishReason.ERROR, error="boom", error_kind="internal")],
                  "internal": [FinalRecord(rid, FinishReason.ERROR, error="kaput", error_kind="internal")]}
        outs = script.get(request.text, [chunk, AudioChunk(rid, 1, chunk.pcm, 24000, 1920, 1, 1), final])
        asyncio.get_running_loop().call_soon(self._route_outputs, outs)

    def _send_abort(self, request_id):
        self.aborted.append(request_id)

    async def _engine_call(self, method, args):
        assert method == "stats"
        return {"running": 0, "waiting": 0, "kv_usage": 0.0}

    async def _stop(self):
        pass


def test_engine_states_map_to_http_errors():
    engine = ScriptedEngine()
    with ServerThread(create_app(engine, ServerSettings(model_name="scripted"))) as srv, \
            httpx.Client(base_url=srv.url, timeout=HANG) as c:
        body = {"model": "scripted", "voice": "vivian", "response_format": "pcm"}
        r = c.post("/v1/audio/speech", json={**body, "input": "fine"})
        assert r.status_code == 200 and len(r.content) == 2 * 1920 * 2
        r = c.post("/v1/audio/speech", json={**body, "input": "invalid"})
        assert_error(r, 400)
        assert "unknown speaker" in r.json()["error"]["message"]
        r = c.post("/v1/audio/speech", json={**body, "input": "full"})
        assert_error(r, 503)
        assert r.headers["Retry-After"]
        assert_error(c.post("/v1/audio/speech", json={**body, "input": "internal"}), 500)
        # failure after the first byte: SSE says so in-band, a raw stream is cut (no chunked terminator)
        r = c.post("/v1/audio/speech", json={**body, "input": "midfail", "stream_format": "sse"})
        types = [json.loads(line[6:])["type"] for line in r.text.splitlines() if line.startswith("data: ")]
        assert types == ["speech.audio.delta", "speech.audio.error"]
        with pytest.raises(httpx.RemoteProtocolError):
            c.post("/v1/audio/speech", json={**body, "input": "midfail", "stream_format": "audio"})
        engine._down_reason = "engine died: test"
        r = c.post("/v1/audio/speech", json={**body, "input": "fine"})
        assert_error(r, 503)
        assert r.headers["Retry-After"]
        assert c.get("/health").status_code == 503
        engine._down_reason = None
        m = metrics(c)
        assert m[("voxflow_requests_rejected_total", (("reason", "queue_full"),))] == 1
        assert m[("voxflow_requests_rejected_total", (("reason", "unavailable"),))] == 1


def test_request_trace_writes_a_line_per_request_as_it_closes(tmp_path):
    """--trace-requests: each speech request's line once it closes, refused ones too, with its status and mode; a
    request whose first output is its (error) final record has its final in when its first output came, and no
    chunk time. (Its times on a real engine, in causal order: test_bench.py's test_smoke_against_voxflow_app.)"""
    path = tmp_path / "requests.jsonl"
    with ServerThread(create_app(ScriptedEngine(), ServerSettings(model_name="scripted",
                                                                  trace_requests=str(path)))) as srv, \
            httpx.Client(base_url=srv.url, timeout=HANG) as c:
        body = {"model": "scripted", "voice": "vivian", "response_format": "pcm"}
        rs = [c.post("/v1/audio/speech", json={**body, "input": text, **extra})
              for text, extra in (("fine", {"stream_format": "audio"}), ("invalid", {}), ("fine", {}))]
        assert [r.status_code for r in rs] == [200, 400, 200]
        assert c.post("/v1/audio/speech", json={**body, "input": "fine", "speed": 99}).status_code == 400  # no job
        lines = [json.loads(line) for line in path.read_text().splitlines()]        # (written as each closed)
    assert len(lines) == 3 and [lines[0]["id"], lines[2]["id"]] == [rs[0].headers["x-request-id"],
                                                                     rs[2].headers["x-request-id"]]
    assert [(t["status"], t["mode"]) for t in lines] == [(200, "audio"), (400, "file"), (200, "file")]
    ok, bad = lines[0], lines[1]
    assert ok["api_arrived"] <= ok["api_submitted"] <= ok["api_first_out"] <= ok["api_final_in"] <= ok["api_closed"]
    assert ok["engine_first_chunk"] is not None and ok["audio_s"] == pytest.approx(0.16)
    assert bad["api_final_in"] == bad["api_first_out"] and bad["engine_first_chunk"] is None
    assert bad["api_closed"] >= bad["api_final_in"] and bad["audio_s"] == 0.0


class HeldEngine(ScriptedEngine):
    """Emits a request's first chunk at once and the rest only when `release()` is called (from any thread)."""

    def _submit(self, request):
        self.submitted.append(request)
        rid = request.request_id
        pcm = np.full(1920, 0.1, "<f4").tobytes()
        loop = asyncio.get_running_loop()
        loop.call_soon(self._route_outputs, [AudioChunk(rid, 0, pcm, 24000, 1920, 0, 1)])
        rest = [AudioChunk(rid, 1, pcm, 24000, 1920, 1, 1),
                FinalRecord(rid, FinishReason.EOS, Usage(prompt_tokens=5, frames=2, audio_seconds=0.16))]
        self.release = lambda: loop.call_soon_threadsafe(self._route_outputs, rest)


def test_first_chunk_reaches_the_client_before_the_second_exists():
    """The first audio leaves the server as soon as the engine has it: nothing (response buffering, an encoder
    holding samples back) waits for more audio before sending it."""
    engine = HeldEngine()
    body = {"model": "scripted", "voice": "vivian", "input": "hi", "stream_format": "audio"}
    with ServerThread(create_app(engine, ServerSettings(model_name="scripted"))) as srv, \
            httpx.Client(base_url=srv.url, timeout=HANG) as c:
        for fmt, first_bytes in (("pcm", 1920 * 2), ("wav", 44 + 1920 * 2)):
            with c.stream("POST", "/v1/audio/speech", json={**body, "response_format": fmt}) as r:
                pieces = r.iter_raw()
                got = b""
                while len(got) < first_bytes:       # the engine's second chunk does not exist yet
                    got += next(pieces)
                engine.release()
                got += b"".join(pieces)
            assert r.status_code == 200 and len(got) == first_bytes + 1920 * 2


class SilentEngine(ScriptedEngine):
    """Takes requests and emits nothing: a whole-file request whose audio is not done yet."""

    def _submit(self, request):
        self.submitted.append(request)


@pytest.mark.parametrize("engine_cls", [SilentEngine, HeldEngine], ids=["before_first_output", "after_it"])
def test_whole_file_client_disconnect_aborts_while_waiting_for_the_engine(engine_cls):
    """A whole-file request whose client leaves is aborted in the engine and counted as 499, nothing left in
    flight, whether the engine had produced nothing yet (SpeechJob.start waiting) or part of the audio."""
    engine = engine_cls()
    body = {"model": "scripted", "voice": "vivian", "input": "hi", "response_format": "pcm"}
    with ServerThread(create_app(engine, ServerSettings(model_name="scripted"))) as srv, \
            httpx.Client(base_url=srv.url, timeout=HANG) as c:
        post_and_leave(srv.port, body, lambda: engine.submitted)
        deadline = time.monotonic() + HANG
        while not (engine.aborted and metrics(c)[("voxflow_api_requests_in_flight", ())] == 0):
            assert time.monotonic() < deadline, "the request was not aborted"
            time.sleep(0.02)
        assert engine.aborted == [engine.submitted[0].request_id]
        m = metrics(c)
        assert m[("voxflow_requests_total", (("status", "499"),))] == 1
        assert m.get(("voxflow_requests_total", (("status", "200"),)), 0) == 0
        assert m[("voxflow_requests_finished_total", (("reason", "client_disconnect"),))] == 1
        health = c.get("/health").json()
        assert health["engine_streams"] == 0                       # the client holds no engine stream
        assert health["in_flight"] == 0 and health["waiting"] == 0  # nor an admission slot


def test_first_speech_request_pays_no_one_time_costs(monkeypatch):
    """A fresh server's first speech request is served like the next ones: FastAPI's one-time read of the
    endpoint's source (inspect.getsourcelines, ~17 ms on the test CPU) happened when the app was created."""
    import inspect

    import fastapi.routing
    getattr(fastapi.routing, "_endpoint_context_cache", {}).clear()     # as in a fresh process
    app = create_app(ScriptedEngine(), ServerSettings(model_name="scripted"))
    reads = []
    real = inspect.getsourcelines
    monkeypatch.setattr(inspect, "getsourcelines", lambda obj: reads.append(obj) or real(obj))
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=HANG) as c:
        r = c.post("/v1/audio/speech", json={"model": "scripted", "voice": "vivian", "response_format": "pcm",
                                             "stream_format": "audio", "input": "fine"})
        assert r.status_code == 200
    assert reads == []


def test_voice_clone_inputs_reach_the_engine():
    """Base model: ref_audio (data URI, via media.resolve_ref_audio) and stored voices (VoiceStore) become the
    engine request's float32 reference / voice-clone prompt; OpenAI names and missing references are handled."""
    import wave
    from voxflow.api.voices import StoredVoice
    pcm = (np.sin(np.arange(24000) / 10.0) * 8000).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(24000), w.writeframes(pcm.tobytes())
    uri = "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()
    engine = ScriptedEngine(name="base", task="voice_clone", voices=[])
    app = create_app(engine, ServerSettings(model_name="scripted-base"))
    prompt = {"format": "test", "dim": 4}
    app.state.vox.voices.add(StoredVoice(name="MyVoice", prompt=prompt, consent="mine", ref_text="hi"), b"x")
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=HANG) as c:
        body = {"input": "Hello.", "response_format": "pcm"}
        assert c.post("/v1/audio/speech", json={**body, "ref_audio": uri, "ref_text": "words"}).status_code == 200
        req = engine.submitted[-1]
        assert req.task == "voice_clone" and req.voice is None and req.ref_text == "words"
        ref = np.frombuffer(req.ref_audio, "<f4")
        assert len(ref) == 24000 and np.allclose(ref, pcm / 32768.0, atol=1e-3)
        for voice in ("myvoice", "MYVOICE"):
            assert c.post("/v1/audio/speech", json={**body, "voice": voice}).status_code == 200
            assert engine.submitted[-1].voice_clone_prompt == prompt and engine.submitted[-1].ref_audio is None
        # OpenAI voice + explicit reference: the reference is used
        assert c.post("/v1/audio/speech", json={**body, "voice": "alloy", "ref_audio": uri,
                                                "x_vector_only_mode": True}).status_code == 200
        assert engine.submitted[-1].x_vector_only and engine.submitted[-1].ref_audio is not None
        n = len(engine.submitted)
        assert_error(c.post("/v1/audio/speech", json={**body, "ref_audio": uri}), 400, "ref_text")
        assert_error(c.post("/v1/audio/speech", json={**body, "voice": "alloy"}), 400, "ref_audio")
        assert_error(c.post("/v1/audio/speech", json={**body, "voice": "stranger"}), 404, "voice")
        assert_error(c.post("/v1/audio/speech", json={**body, "ref_audio": "ftp://x/y.wav", "ref_text": "a"}), 400,
                     "ref_audio")
        junk = "data:audio/wav;base64," + base64.b64encode(b"RIFF\x00\x00\x00\x00WAVEjunk" * 50).decode()
        r = c.post("/v1/audio/speech", json={**body, "ref_audio": junk, "ref_text": "a"})
        assert_error(r, 400, "ref_audio")
        msg = r.json()["error"]["message"]
        assert msg.startswith("could not decode the reference audio") and " at 0x" not in msg and "<" not in msg
        assert_error(c.post("/v1/audio/speech", json={**body, "speaker_embedding": [0.5] * 4}), 400,
                     "speaker_embedding")
        assert_error(c.post("/v1/audio/speech", json={**body, "ref_audio": uri, "ref_text": "a",
                                                      "task_type": "CustomVoice"}), 400, "task_type")
        assert len(engine.submitted) == n       # rejected before the engine


# ------------------------------------------------------------------------------------------------ voxflow serve
def test_serve_arguments():
    import argparse
    from voxflow.api.serve import add_serve_parser, engine_config_from_args, settings_from_args
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "org/model", "--api-key", "k1", "--api-key", "k2", "--max-num-seqs", "4",
                              "--voices-dir", "/v", "--allowed-local-media-path", "/media",
                              "--allowed-media-domains", "a.com,b.com", "c.com", "--device", "cpu",
                              "--max-batch-items", "8", "--max-batch-input-chars", "999", "--max-new-tokens-limit",
                              "500"])
    s = settings_from_args(args)
    assert s.model_name == "org/model" and s.api_keys == ("k1", "k2") and s.voices_dir == "/v"
    assert (s.max_batch_items, s.max_batch_input_chars, s.max_new_tokens_limit) == (8, 999, 500)
    assert s.allowed_local_media_path == "/media" and s.allowed_media_domains == ("a.com", "b.com", "c.com")
    cfg = engine_config_from_args(args)
    assert (cfg.model, cfg.max_num_seqs, cfg.device, cfg.dtype) == ("org/model", 4, "cpu", "float32")
    assert cfg.add_seconds_per_step is None and cfg.kv_cache_dtype == "auto"
    assert engine_config_from_args(parser.parse_args(["serve", "m", "--kv-cache-dtype", "fp8"])).kv_cache_dtype == "fp8"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "m", "--kv-cache-dtype", "int4"])
    args = parser.parse_args(["serve", "m", "--device", "cpu", "--engine-arg", "add_seconds_per_step=0.004",
                              "--engine-arg", "chunk-frames=7"])
    cfg = engine_config_from_args(args)
    assert cfg.add_seconds_per_step == 0.004 and cfg.chunk_frames == 7
    with pytest.raises(ValueError, match="nope"):
        engine_config_from_args(parser.parse_args(["serve", "m", "--device", "cpu", "--engine-arg", "nope=1"]))


def test_serve_resolves_the_default_device_in_the_engine_process():
    """Without --device the config says "auto" and the engine process's factory resolves it (here: no GPU -> cpu,
    float32; an explicit dtype is kept), so the API process's side of `voxflow serve` (arguments, config, app,
    engine client) never imports torch: checked in a fresh interpreter."""
    import argparse
    import dataclasses
    import subprocess
    import sys
    import torch

    from voxflow.api.serve import add_serve_parser, engine_config_from_args, resolve_auto_device
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    cfg = engine_config_from_args(parser.parse_args(["serve", "m"]))
    assert (cfg.device, cfg.dtype) == ("auto", "auto")
    want = ("cuda", "bfloat16") if torch.cuda.is_available() else ("cpu", "float32")
    assert (resolve_auto_device(cfg).device, resolve_auto_device(cfg).dtype) == want
    half = dataclasses.replace(cfg, dtype="float16")
    assert resolve_auto_device(half).dtype == "float16"
    cuda = engine_config_from_args(parser.parse_args(["serve", "m", "--device", "cuda:1"]))
    assert (cuda.device, cuda.dtype) == ("cuda:1", "bfloat16") and resolve_auto_device(cuda) == cuda
    code = ("import argparse, sys\n"
            "from voxflow.api.serve import add_serve_parser, engine_config_from_args, settings_from_args\n"
            "from voxflow.api.app import create_app\n"
            "from voxflow.engine.process import ProcessEngineClient\n"
            "p = argparse.ArgumentParser(); add_serve_parser(p.add_subparsers(dest='command'))\n"
            "args = p.parse_args(['serve', 'some/model'])\n"
            "engine_config_from_args(args); settings_from_args(args)\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr


def test_serve_process_engine_and_graceful_sigterm(tmp_path):
    """`voxflow serve` end to end: engine in its own process, /health until 200, and SIGTERM mid-stream lets the
    stream finish (drain) before the server exits."""
    import signal
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice")
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "voxflow.api.serve", model, "--port", str(port), "--device", "cpu",
                             "--max-num-seqs", "2", "--api-key", KEY, "--log-level", "warning"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=HANG) as c:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "server did not become healthy"
                time.sleep(0.2)
            body = speech(response_format="pcm", stream_format="audio", greedy=True, max_new_tokens=30,
                          ignore_eos=True, initial_codec_chunk_frames=1)
            with c.stream("POST", "/v1/audio/speech", json=body) as r:
                chunks = r.iter_raw()
                data = next(chunks)
                proc.send_signal(signal.SIGTERM)
                data += b"".join(chunks)
            assert len(data) == 29 * 1920 * 2           # the whole utterance: drained, not cut
        # uvicorn re-raises the captured SIGTERM after its graceful shutdown: the conventional "died of SIGTERM"
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert b"Traceback" not in (tmp_path / "serve.log").read_bytes()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


_ENCODE_RACE = r"""
import asyncio, json, socket, sys, time
sys.path.insert(0, "tests")
import numpy as np
import httpx
from test_api_speech import ScriptedEngine, ServerThread
from voxflow.api.app import create_app
from voxflow.api.state import ServerSettings
from voxflow.engine.request import AudioChunk, FinalRecord, FinishReason, Usage

class LongAudio(ScriptedEngine):      # 90 s of audio at once: its mp3 encode takes a while
    def _submit(self, request):
        rid, n = request.request_id, 24000 * 90
        pcm = (np.random.default_rng(0).standard_normal(n) * 0.1).astype("<f4").tobytes()
        outs = [AudioChunk(rid, 0, pcm, 24000, n, 0, 1),
                FinalRecord(rid, FinishReason.EOS, Usage(prompt_tokens=5, frames=2, audio_seconds=n / 24000))]
        asyncio.get_running_loop().call_soon(self._route_outputs, outs)

with ServerThread(create_app(LongAudio(), ServerSettings(model_name="scripted"))) as srv:
    host, port = srv.url.split("//")[1].split(":")
    body = json.dumps({"model": "scripted", "voice": "vivian", "input": "hi", "response_format": "mp3"}).encode()
    for delay in (0.2, 0.4):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(delay)
        s.close()
        time.sleep(1.0)
    assert httpx.get(srv.url + "/health").status_code == 200
    print("survived")
"""


def test_a_client_leaving_while_its_file_is_encoded_does_not_crash_the_server():
    """A whole-file mp3 request whose client leaves while the file is being encoded (in a worker thread): the
    encoder is closed only once that thread is done. Closing PyAV's container under it segfaulted the server
    process (a final review found it; run in a subprocess so that a crash fails this test, not the test run)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _ENCODE_RACE], capture_output=True, text=True, timeout=HANG * 6,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0 and "survived" in out.stdout, out.stderr[-2000:]


def test_a_lowered_max_new_tokens_limit_also_caps_requests_that_name_none():
    """serve --max-new-tokens-limit below the default: a request without max_new_tokens gets the limit (with
    ignore_eos it would otherwise run to the model's own default, minutes of audio from one word); one above it is
    a 400 naming the field; one below it is served as asked."""
    with tiny_server(max_new_tokens_limit=12) as srv, httpx.Client(base_url=srv.url, headers=AUTH,
                                                                   timeout=HANG) as c:
        body = speech(ignore_eos=True, response_format="pcm")
        body.pop("max_new_tokens")
        r = c.post("/v1/audio/speech", json=body)
        assert r.status_code == 200, r.text
        assert len(r.content) == 11 * 1920 * 2                  # 12 tokens = 11 frames of 1920 16-bit samples
        assert_error(c.post("/v1/audio/speech", json=speech(max_new_tokens=13)), 400, "max_new_tokens")
        r = c.post("/v1/audio/speech", json=speech(max_new_tokens=5, ignore_eos=True, response_format="pcm"))
        assert r.status_code == 200 and len(r.content) == 4 * 1920 * 2


def test_the_limit_never_raises_a_models_own_default():
    """A request naming no max_new_tokens gets min(the model's default, the limit): a limit above the default (a
    checkpoint without generation_config.json defaults to 2048) leaves the model's default (None), and a model
    without such a default (the CPU voice) is left alone."""
    from voxflow.api.schemas import SpeechRequestBody, _max_new_tokens_or_cap
    body = SpeechRequestBody(input="Hi.")
    assert _max_new_tokens_or_cap(body, ServerSettings(max_new_tokens_limit=4096),
                                  {"default_max_new_tokens": 2048}) is None
    assert _max_new_tokens_or_cap(body, ServerSettings(max_new_tokens_limit=100),
                                  {"default_max_new_tokens": 2048}) == 100
    assert _max_new_tokens_or_cap(body, ServerSettings(max_new_tokens_limit=100), {}) is None
    assert _max_new_tokens_or_cap(SpeechRequestBody(input="Hi.", max_new_tokens=7), ServerSettings(), {}) == 7
