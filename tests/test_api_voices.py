"""Uploaded voices (voices.py, routes_voices.py) and reference-audio resolution (media.py).

The main scenario runs the tiny Base checkpoint through the in-process engine: upload -> list -> use (a
streaming session naming the voice; the engine must not compute an x-vector again) -> restart (a new
VoiceStore on the same folder) -> still listed -> delete -> 404. Error paths use a fake engine client.
"""
import asyncio
import base64
import contextlib
import json
import os

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from voxflow.api import media, routes_voices, routes_ws
from voxflow.api.errors import APIError, install_error_handlers
from voxflow.api.state import AppState, ServerSettings
from voxflow.api.voices import StoredVoice, VoiceExistsError, VoiceStore, validate_name
from voxflow.audio.io import wav_bytes

SR = 24000


def tone(seconds=1.5, sr=16000, freq=220.0) -> bytes:
    t = np.arange(int(seconds * sr), dtype=np.float32) / sr
    return wav_bytes(0.3 * np.sin(2 * np.pi * freq * t) + 0.05 * np.sin(2 * np.pi * 3 * freq * t), sr)


def make_app(engine, settings, store, lifespan=None, model_info=None):
    app = FastAPI(lifespan=lifespan)
    info = model_info if model_info is not None else dict(engine.model_info)
    app.state.vox = AppState(engine=engine, settings=settings, model_info=info, voices=store)
    install_error_handlers(app)
    app.include_router(routes_voices.router)
    app.include_router(routes_ws.router)
    return app


def upload(client, name="Alice_1", audio=None, **fields):
    data = {"name": name, "consent": "I agree to be cloned", **fields}
    files = {"audio_sample": ("sample.wav", tone() if audio is None else audio, "audio/wav")}
    return client.post("/v1/audio/voices", data=data, files=files)


# ============================================================================================ the full cycle
@pytest.fixture
def xvector_calls(monkeypatch):
    """Count x-vector computations inside the engine (the plugin's and the eager path's)."""
    from voxflow.models.qwen3_tts import generate, plugin
    calls = []
    real = generate.make_voice_clone_prompt

    def counting(*args, **kwargs):
        calls.append(args[2] if len(args) > 2 else kwargs.get("ref_text"))
        return real(*args, **kwargs)
    monkeypatch.setattr(plugin, "make_voice_clone_prompt", counting)
    monkeypatch.setattr(generate, "make_voice_clone_prompt", counting)
    return calls


class Recording:
    """Wraps an EngineClient: records the requests it is given and the create_voice calls."""

    def __init__(self, inner):
        self.inner, self.requests, self.voice_calls = inner, [], 0

    @property
    def model_info(self):
        return self.inner.model_info

    async def create_voice(self, *args):
        self.voice_calls += 1
        return await self.inner.create_voice(*args)

    def generate(self, request):
        self.requests.append(request)
        return self.inner.generate(request)


def test_upload_list_use_restart_delete(tmp_path, xvector_calls):
    from voxflow.engine.engine import EngineConfig, EngineCore
    from voxflow.engine.inprocess import InProcessEngineClient

    core = EngineCore.from_config(EngineConfig(model=os.path.join(os.environ["VOXFLOW_TINY_DIR"], "base"),
                                               max_num_seqs=8, max_num_batched_tokens=128, num_kv_blocks=256,
                                               block_size=4))
    inner = InProcessEngineClient(core)
    engine = Recording(inner)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await inner.start()
        app.state.vox.model_info = dict(inner.model_info)
        yield
        await inner.shutdown(drain=False)

    voices_dir = tmp_path / "voices"
    settings = ServerSettings(voices_dir=str(voices_dir))
    app = make_app(engine, settings, VoiceStore(settings.voices_dir), lifespan=lifespan, model_info={})
    with TestClient(app) as client:
        assert client.app.state.vox.model_info["task"] == "voice_clone"
        r = upload(client, "Alice_1", ref_text="Hello there, this is a test.")
        assert r.status_code == 200, r.text
        voice = r.json()["voice"]
        assert r.json()["success"] is True and voice["name"] == "Alice_1" and voice["mode"] == "icl"
        assert voice["ref_text"] == "Hello there, this is a test." and voice["consent"] == "I agree to be cloned"
        assert voice["embedding_source"] == "audio" and voice["embedding_dim"] > 0 and voice["file_size"] > 0
        r = upload(client, "bob-xvec")                           # no ref_text: x-vector only
        assert r.status_code == 200, r.text
        assert r.json()["voice"]["mode"] == "x_vector" and r.json()["voice"]["ref_text"] is None
        assert engine.voice_calls == 2 and len(xvector_calls) == 2

        listed = client.get("/v1/audio/voices").json()
        assert listed["voices"] == ["Alice_1", "bob-xvec"]
        assert [v["name"] for v in listed["uploaded_voices"]] == ["Alice_1", "bob-xvec"]
        stored = app.state.vox.voices.get("alice_1")
        assert stored.prompt["ref_codes"] and stored.prompt["ref_text"] == "Hello there, this is a test."
        assert app.state.vox.voices.get("BOB-XVEC").prompt["ref_codes"] is None

        # use it: a streaming session naming the voice (case-insensitively)
        with client.websocket_connect("/v1/audio/speech/stream") as ws:
            ws.send_json({"type": "session.config", "voice": "ALICE_1", "response_format": "pcm",
                          "stream_audio": True, "max_new_tokens": 4, "seed": 3})
            ws.send_json({"type": "input.text", "text": "Nice to meet you. Bye"})
            ws.send_json({"type": "input.done"})
            msgs = []
            while True:
                m = ws.receive()
                msgs.append(m)
                if m.get("text") and json.loads(m["text"])["type"] == "session.done":
                    break
        events = [json.loads(m["text"]) for m in msgs if m.get("text")]
        assert [e["type"] for e in events if e["type"] != "audio.start"] == ["audio.done", "audio.done",
                                                                             "session.done"]
        assert all(not e.get("error") for e in events), events
        assert sum(len(m["bytes"]) for m in msgs if m.get("bytes")) == sum(
            e["total_bytes"] for e in events if e["type"] == "audio.done") > 0
        assert len(engine.requests) == 2
        for req in engine.requests:
            assert req.voice_clone_prompt == stored.prompt and req.ref_audio is None
        assert len(xvector_calls) == 2 and engine.voice_calls == 2      # nothing recomputed per request

    # "restart": a new store on the same folder, a new app
    store2 = VoiceStore(str(voices_dir))
    assert store2.get("alice_1").prompt == stored.prompt and store2.get("Bob-Xvec").ref_text is None
    assert store2.get("alice_1").load_sample() == tone()
    app2 = make_app(engine, settings, store2, model_info=dict(core.info()))
    with TestClient(app2) as client:
        assert client.get("/v1/audio/voices").json()["voices"] == ["Alice_1", "bob-xvec"]
        r = client.delete("/v1/audio/voices/alice_1")
        assert r.status_code == 200 and r.json()["success"] is True
        assert client.get("/v1/audio/voices").json()["voices"] == ["bob-xvec"]
        r = client.delete("/v1/audio/voices/Alice_1")
        assert r.status_code == 404 and r.json()["success"] is False
        assert r.json()["error"]["code"] == "voice_not_found"
    assert sorted(os.listdir(voices_dir)) == ["bob-xvec"]
    assert VoiceStore(str(voices_dir)).names() == ["bob-xvec"]


# ============================================================================================ upload errors
class FakeCloneEngine:
    def __init__(self, task="voice_clone"):
        self.model_info = dict(name="fake", family="qwen3_tts", task=task, sample_rate=SR, voices=[],
                               languages=["auto"], supports_instructions=False)
        self.calls = []

    async def create_voice(self, ref_audio, ref_text, x_vector_only):
        self.calls.append((len(ref_audio), ref_text, x_vector_only))
        if ref_text == "REJECT":
            raise ValueError("the engine says no")
        return {"format": "fake", "dim": 4, "x_vector": "AAAA", "ref_text": ref_text}


def test_upload_errors(tmp_path):
    engine = FakeCloneEngine()
    settings = ServerSettings(voices_dir=str(tmp_path / "v"), max_ref_audio_bytes=200_000,
                              max_ref_audio_seconds=3.0, min_ref_audio_seconds=0.5)
    app = make_app(engine, settings, VoiceStore(settings.voices_dir))
    with TestClient(app) as client:
        assert upload(client, "alice").status_code == 200
        assert engine.calls == [(int(1.5 * SR) * 4, None, True)]      # resampled 16 kHz -> 24 kHz float32

        def err(r, status, param=None):
            assert r.status_code == status, r.text
            body = r.json()["error"]
            if param:
                assert body["param"] == param, body
            return body

        assert err(upload(client, "ALICE"), 409, "name")["code"] == "voice_exists"
        for bad in ("../x", "a b", "x" * 65, "-lead", "a.b", "ü"):
            err(upload(client, bad), 400, "name")
        err(client.post("/v1/audio/voices", data={"name": "n1"}, files={"audio_sample": ("a.wav", tone())}),
            400, "consent")
        err(client.post("/v1/audio/voices", data={"name": "n1", "consent": "ok"}), 400, "audio_sample")
        err(upload(client, "n1", ref_text="   "), 400, "ref_text")
        err(upload(client, "n1", x_vector_only="false"), 400, "ref_text")
        assert err(upload(client, "n1", audio=b"this is not audio at all" * 10), 400,
                   "audio_sample")["code"] == "invalid_audio"
        assert err(upload(client, "n1", audio=tone(4.0)), 400, "audio_sample")["code"] == "audio_too_long"
        assert err(upload(client, "n1", audio=tone(0.2)), 400, "audio_sample")["code"] == "audio_too_short"
        # a 278 kB file: the body passes the body cap, the file part is over the audio limit
        assert err(upload(client, "n1", audio=tone(2.9, sr=48000)), 413, "audio_sample")["code"] == "too_large"
        big = b"\0" * (settings.max_ref_audio_bytes + 300_000)            # over the body cap itself
        assert err(upload(client, "n1", audio=big), 413)["code"] == "too_large"
        err(client.post("/v1/audio/voices", json={"name": "n1", "consent": "x"}), 400)
        err(upload(client, "n1", ref_text="REJECT"), 400, "audio_sample")
        assert len(engine.calls) == 2                                   # only the successful one + REJECT
        assert [v["name"] for v in client.get("/v1/audio/voices").json()["uploaded_voices"]] == ["alice"]
        assert sorted(os.listdir(settings.voices_dir)) == ["alice"]      # nothing half-written

    cv = FakeCloneEngine(task="custom_voice")
    cv.model_info["voices"] = ["vivian"]
    with TestClient(make_app(cv, ServerSettings(), VoiceStore(None))) as client:
        r = upload(client, "n2")
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_model" and cv.calls == []
        assert client.get("/v1/audio/voices").json() == {"voices": ["vivian"], "uploaded_voices": []}
        r = client.delete("/v1/audio/voices/vivian")
        assert r.status_code == 400 and r.json()["success"] is False


# ============================================================================================ the store
def test_store_names_atomicity_and_memory_mode(tmp_path):
    for good in ("a", "My_Voice-2", "x" * 64):
        assert validate_name(good) == good
    for bad in ("", "..", ".hidden", "a/b", "a\\b", "x" * 65, "a\x00", None):
        with pytest.raises(ValueError):
            validate_name(bad)

    d = tmp_path / "voices"
    store = VoiceStore(str(d))
    store.add(StoredVoice(name="Eve", prompt={"p": 1}, consent="yes", mime_type="audio/wav"), b"RIFFdata")
    with pytest.raises(VoiceExistsError):
        store.add(StoredVoice(name="EVE", prompt={}, consent="yes"), b"x")
    assert sorted(os.listdir(d / "eve")) == ["sample.wav", "voice.json"]
    # leftovers of an interrupted write / delete and a broken voice are ignored (and cleaned) at start-up
    (d / ".tmp-zed-1234").mkdir()
    (d / ".trash-old-1234").mkdir()
    (d / "broken").mkdir()
    (d / "broken" / "voice.json").write_text("{not json")
    (d / "mismatch").mkdir()
    (d / "mismatch" / "voice.json").write_text(json.dumps({"name": "other", "prompt": {}, "consent": "x"}))
    again = VoiceStore(str(d))
    assert again.names() == ["Eve"] and again.get("eve").prompt == {"p": 1}
    assert again.get("eve").load_sample() == b"RIFFdata"
    assert not (d / ".tmp-zed-1234").exists() and not (d / ".trash-old-1234").exists()
    assert again.delete("EVE") and not again.delete("eve") and not (d / "eve").exists()

    mem = VoiceStore(None)
    mem.add(StoredVoice(name="m", prompt={}, consent="c"), b"abc")
    assert mem.get("M").load_sample() == b"abc" and mem.get("M").file_size == 3 and "m" in mem


def test_prompt_recomputed_once_for_another_model(tmp_path):
    engine = FakeCloneEngine()
    store = VoiceStore(str(tmp_path))
    store.add(StoredVoice(name="old", prompt={"from": "model-a"}, consent="c", ref_text="hi", model="model-a",
                          mime_type="audio/wav"), tone())

    async def main():
        info = dict(engine.model_info)
        p1 = await store.prompt_for(store.get("old"), engine, info)
        p2 = await store.prompt_for(store.get("old"), engine, info)
        return p1, p2
    p1, p2 = asyncio.run(main())
    assert p1 == p2 and p1["format"] == "fake" and engine.calls == [(int(1.5 * SR) * 4, "hi", False)]
    assert VoiceStore(str(tmp_path)).get("old").model == "fake"


# ============================================================================================ media
def run(coro):
    return asyncio.run(coro)


def resolve(value, settings=None, sr=SR):
    return run(media.resolve_ref_audio(value, settings or ServerSettings(), target_sr=sr))


def api_error(value, settings=None, status=400) -> APIError:
    with pytest.raises(APIError) as info:
        resolve(value, settings)
    assert info.value.status == status, info.value.message
    assert info.value.param == "ref_audio"
    return info.value


def test_media_inline_forms():
    wav = tone(1.0, sr=16000)
    b64 = base64.b64encode(wav).decode()
    out = resolve("data:audio/wav;base64," + b64)
    assert out.dtype == np.float32 and out.ndim == 1 and out.shape[0] == SR
    assert np.array_equal(resolve(b64), out)
    assert np.array_equal(resolve("data:;base64," + b64), out)
    assert resolve("data:audio/wav;base64," + b64, sr=16000).shape[0] == 16000
    assert api_error("data:text/plain;base64," + b64).code == "invalid_data_uri"
    assert api_error("data:audio/wav;base64," + "!!!!" * 40).code == "invalid_base64"
    assert api_error(base64.b64encode(b"garbage!" * 40).decode()).code == "invalid_audio"
    assert api_error("ftp://example.com/a.wav").code == "unsupported_scheme"
    assert api_error("").code == "invalid_value"


def test_media_limits():
    small = ServerSettings(max_ref_audio_bytes=50_000, max_ref_audio_seconds=2.0, min_ref_audio_seconds=0.5)
    assert api_error("data:audio/wav;base64," + base64.b64encode(tone(2.0)).decode(), small, 413).code == "too_large"
    assert api_error(base64.b64encode(tone(2.0)).decode(), small, 413).code == "too_large"
    long = ServerSettings(max_ref_audio_seconds=2.0)
    assert api_error("data:audio/wav;base64," + base64.b64encode(tone(3.0, sr=8000)).decode(),
                     long).code == "audio_too_long"
    assert api_error("data:audio/wav;base64," + base64.b64encode(tone(0.2)).decode()).code == "audio_too_short"


@pytest.fixture
def media_dir(tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "ok.wav").write_bytes(tone(1.0))
    (allowed / "sub").mkdir()
    (allowed / "sub" / "nested.wav").write_bytes(tone(1.0))
    (tmp_path / "secret.wav").write_bytes(tone(1.0))
    os.symlink(tmp_path / "secret.wav", allowed / "link_out.wav")
    os.symlink(allowed / "ok.wav", allowed / "link_in.wav")
    return tmp_path


def test_media_local_files_allowed_inside_only(media_dir, monkeypatch):
    allowed = media_dir / "allowed"
    settings = ServerSettings(allowed_local_media_path=str(allowed))
    for value in (str(allowed / "ok.wav"), "ok.wav", "sub/nested.wav", f"file://{allowed}/ok.wav",
                  "link_in.wav", "sub/../ok.wav"):
        assert resolve(value, settings).shape[0] == SR, value

    opened = []
    real_read = media._read_file_capped
    monkeypatch.setattr(media, "_read_file_capped", lambda *a: opened.append(a) or real_read(*a))
    for value in ("../secret.wav", str(media_dir / "secret.wav"), f"file://{media_dir}/secret.wav",
                  "link_out.wav", "sub/../../secret.wav", "/etc/passwd"):
        assert api_error(value, settings).code == "path_not_allowed", value
    assert opened == []                                   # rejected before anything was opened
    assert api_error("missing.wav", settings).code == "file_not_found"
    assert api_error("sub", settings).code == "file_unreadable"
    assert api_error("file://otherhost/x.wav", settings).code == "invalid_url"
    tiny = ServerSettings(allowed_local_media_path=str(allowed), max_ref_audio_bytes=1000)
    assert api_error("ok.wav", tiny, 413).code == "too_large"


def test_media_no_filesystem_when_local_files_disabled(media_dir, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the filesystem must not be touched")
    for name in ("realpath", "isfile", "exists", "lexists"):
        monkeypatch.setattr(media.os.path, name, boom)
    monkeypatch.setattr(media.os, "open", boom)
    monkeypatch.setattr(media.os, "stat", boom)
    settings = ServerSettings()                                   # allowed_local_media_path=None
    for value in (str(media_dir / "allowed" / "ok.wav"), "ok.wav", f"file://{media_dir}/allowed/ok.wav",
                  "../secret.wav"):
        assert api_error(value, settings).code == "local_files_disabled"
    lexical = ServerSettings(allowed_local_media_path=str(media_dir / "allowed"))
    assert api_error("../secret.wav", lexical).code == "path_not_allowed"      # lexical check: no realpath


def test_media_urls_only_from_allowed_hosts(monkeypatch):
    class NoNetwork:
        def __init__(self, *a, **k):
            raise AssertionError("no connection may be made")
    monkeypatch.setattr(httpx, "AsyncClient", NoNetwork)
    assert api_error("https://example.com/a.wav").code == "url_not_allowed"                  # URLs disabled
    settings = ServerSettings(allowed_media_domains=("media.example.com", ".cdn.example.org"))
    for url in ("https://evil.com/a.wav", "http://example.com/a.wav", "https://media.example.com.evil.com/a",
                "https://xmedia.example.com/a.wav", "https://user@evil.com/a.wav"):
        assert api_error(url, settings).code == "url_not_allowed", url
    assert media.host_allowed("a.b.cdn.example.org", settings.allowed_media_domains)
    assert media.host_allowed("cdn.example.org", settings.allowed_media_domains)


def test_media_url_fetch_redirects_and_size(monkeypatch):
    wav = tone(1.0)
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        path, host = request.url.path, request.url.host
        if host != "media.example.com":
            raise AssertionError(f"connected to {host}")
        if path == "/ok.wav":
            return httpx.Response(200, content=wav, headers={"content-type": "audio/wav"})
        if path == "/hop":
            return httpx.Response(302, headers={"location": "/ok.wav"})
        if path == "/away":
            return httpx.Response(302, headers={"location": "https://evil.com/x.wav"})
        if path == "/loop":
            return httpx.Response(302, headers={"location": "/loop"})
        if path == "/declared-big":
            return httpx.Response(200, content=b"\0" * 5000)
        if path == "/streamed-big":
            async def body():
                for _ in range(100):
                    yield b"\0" * 1000
            return httpx.Response(200, content=body())
        return httpx.Response(404)

    real_client = httpx.AsyncClient

    class Mocked(real_client):
        def __init__(self, *a, **k):
            assert k.get("follow_redirects") is False and k.get("timeout") is not None
            super().__init__(*a, transport=httpx.MockTransport(handler), **k)
    monkeypatch.setattr(httpx, "AsyncClient", Mocked)
    settings = ServerSettings(allowed_media_domains=("media.example.com",))
    assert resolve("https://media.example.com/ok.wav", settings).shape[0] == SR
    assert resolve("https://media.example.com/hop", settings).shape[0] == SR
    assert api_error("https://media.example.com/away", settings).code == "url_not_allowed"
    assert api_error("https://media.example.com/loop", settings).code == "fetch_failed"
    assert api_error("https://media.example.com/missing", settings).code == "fetch_failed"
    small = ServerSettings(allowed_media_domains=("media.example.com",), max_ref_audio_bytes=4000)
    assert api_error("https://media.example.com/declared-big", small, 413).code == "too_large"
    assert api_error("https://media.example.com/streamed-big", small, 413).code == "too_large"
    assert all("evil" not in u for u in seen)


def test_an_in_memory_store_bounds_the_samples_it_holds():
    """Without --voices-dir the samples are held in memory: their total is capped (1000 voices of 10 MiB would be
    10 GiB); an upload past it is refused with a VoiceLimitError saying what to do, and a deletion frees room."""
    from voxflow.api.voices import VoiceLimitError
    mem = VoiceStore(None, max_memory_bytes=10)
    mem.add(StoredVoice(name="a", prompt={}, consent="c"), b"123456")
    with pytest.raises(VoiceLimitError, match="--voices-dir"):
        mem.add(StoredVoice(name="b", prompt={}, consent="c"), b"12345")
    assert mem.names() == ["a"]
    mem.add(StoredVoice(name="c", prompt={}, consent="c"), b"1234")      # exactly at the cap
    assert mem.delete("a")
    mem.add(StoredVoice(name="b", prompt={}, consent="c"), b"12345")
    assert sorted(mem.names()) == ["b", "c"]
