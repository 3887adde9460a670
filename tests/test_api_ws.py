"""WS /v1/audio/speech/stream (routes_ws.py) and the incremental sentence splitter (text_split.py).

The protocol tests run a real uvicorn server on a free local port and talk to it with the `websockets`
client, so every receive has a timeout: a broken pipeline fails instead of hanging. Nothing asserts on
timing. Most sessions use a fake engine client (deterministic, no model); one runs the tiny CustomVoice
checkpoint through the real in-process engine.
"""
import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

from fastapi import FastAPI

from voxflow.api import routes_voices, routes_ws, ws_session
from voxflow.api.errors import install_error_handlers
from voxflow.api.state import AppState, ServerSettings
from voxflow.api.text_split import SentenceSplitter
from voxflow.api.voices import VoiceStore
from voxflow.audio.io import wav_bytes
from voxflow.engine.request import AudioChunk, FinalRecord, FinishReason

HANG = 20.0          # seconds: only to turn a hang into a failure
WS_PATH = "/v1/audio/speech/stream"


# ============================================================================================ text splitting
def feed_all(splitter, pieces):
    out = []
    for p in pieces:
        out += splitter.feed(p)
    return out + splitter.flush()


def test_split_incremental_latin_and_cjk():
    s = SentenceSplitter()
    assert s.feed("Hello Dr. Smi") == []
    assert s.feed("th. How are") == ["Hello Dr. Smith."]
    assert s.feed(" you? 你好。再") == ["How are you?", "你好。"]
    assert s.flush() == ["再"]
    assert s.flush() == []


def test_split_waits_at_end_of_buffer_and_keeps_decimals_and_abbreviations():
    s = SentenceSplitter()
    assert s.feed("Pi is 3.") == []                       # "3." may become "3.14"
    assert s.feed("14 exactly! Use e.g. apples. Mr. Brown and J. R. R. Tolkien met at a U.S. Army base. Then") == [
        "Pi is 3.14 exactly!", "Use e.g. apples.", "Mr. Brown and J. R. R. Tolkien met at a U.S. Army base."]
    assert s.flush() == ["Then"]


def test_split_terminators_newlines_quotes():
    pieces = ['He said "Stop." The', "n he left; she stayed… Why?! ", "Line one\nLine two", "\n1. Buy milk\n"]
    assert feed_all(SentenceSplitter(), pieces) == [
        'He said "Stop."', "Then he left;", "she stayed…", "Why?!", "Line one", "Line two", "1. Buy milk"]


def test_split_cjk_terminators_split_at_once():
    s = SentenceSplitter()
    assert s.feed("今天天气很好！我们去公园吧？") == ["今天天气很好！", "我们去公园吧？"]
    assert s.feed("「好。」然后") == ["「好。」"]
    assert s.flush() == ["然后"]


def test_split_clause_commas_only_in_long_sentences_or_clause_mode():
    short = "我们在这里，等你回来。"
    assert feed_all(SentenceSplitter(), [short]) == [short]
    long = "这是一个非常长的句子" * 3 + "，" + "后面还有更多的内容" * 2 + "、还有"
    out = SentenceSplitter(long_sentence_chars=20).feed(long)
    assert out == [long.split("，")[0] + "，"]
    assert feed_all(SentenceSplitter("clause"), ["one, two, three. Four"]) == ["one,", "two,", "three.", "Four"]
    assert feed_all(SentenceSplitter(), ["one, two, three."]) == ["one, two, three."]
    assert feed_all(SentenceSplitter("clause"), ["1,000 people, 10:30 today."]) == ["1,000 people,",
                                                                                     "10:30 today."]


def test_split_granularity_none_and_over_long_and_punctuation_only():
    assert feed_all(SentenceSplitter("none"), ["One. Two. ", "Three"]) == ["One. Two. Three"]
    words = " ".join(f"w{i}" for i in range(60))
    out = feed_all(SentenceSplitter(max_sentence_chars=40), [words])
    assert all(len(x) <= 40 for x in out) and " ".join(out) == words
    assert feed_all(SentenceSplitter(max_sentence_chars=10), ["一二三四五六七八九十一二三"]) == [
        "一二三四五六七八九十", "一二三"]
    s = SentenceSplitter()
    assert s.feed("... ") == [] and s.feed("Hi. ") == ["... Hi."]   # nothing speakable: carried forward
    assert SentenceSplitter().flush() == []
    assert feed_all(SentenceSplitter(), ["?! "]) == []
    with pytest.raises(ValueError):
        SentenceSplitter("paragraph")


def test_split_lowercase_continuation():
    assert feed_all(SentenceSplitter(), ["It costs approx. ten, etc. and so on. Next"]) == [
        "It costs approx. ten, etc. and so on.", "Next"]


# ============================================================================================ harness
class FakeEngine:
    """An EngineClient stand-in. Every request gets `chunks` chunks of `chunk_samples` s16 samples, then EOS.
    Text markers: "FAIL" -> an ERROR record; "HOLD" -> waits forever (until aborted).
    hold_first: the first request of the run waits until the second one has finished (so two sentences must be
    in flight at once, and the second finishes first)."""

    def __init__(self, task="custom_voice", chunks=2, chunk_samples=120, hold_first=False):
        self.model_info = dict(name="fake-model", family="qwen3_tts", task=task, sample_rate=24000,
                               voices=["vivian", "ryan"] if task == "custom_voice" else [],
                               languages=["auto", "english", "chinese"], supports_instructions=True)
        self.chunks, self.chunk_samples, self.hold_first = chunks, chunk_samples, hold_first
        self.requests, self.finished, self.aborted, self.voice_calls = [], [], [], []
        self._second_done = None

    async def create_voice(self, ref_audio, ref_text, x_vector_only):
        self.voice_calls.append((len(ref_audio), ref_text, x_vector_only))
        return {"format": "fake.voice", "n": len(self.voice_calls), "x_vector_only": x_vector_only}

    async def generate(self, request):
        if self._second_done is None:
            self._second_done = asyncio.Event()
        self.requests.append(request)
        order = len(self.requests)
        done = False
        try:
            if "HOLD" in request.text:
                await asyncio.Event().wait()
            if self.hold_first and order == 1:
                await self._second_done.wait()
            if "FAIL" in request.text:
                done = True
                yield FinalRecord(request.request_id, FinishReason.ERROR, error="synthetic failure")
                return
            for i in range(self.chunks):
                await asyncio.sleep(0)
                pcm = np.full(self.chunk_samples, order * 100 + i, dtype="<i2").tobytes()
                yield AudioChunk(request.request_id, i, pcm, 24000, self.chunk_samples, i, 1)
            done = True
            self.finished.append(request.text)
            if order == 2:
                self._second_done.set()
            yield FinalRecord(request.request_id, FinishReason.EOS)
        finally:
            if not done:
                self.aborted.append(request.text)


def make_app(engine, settings=None, voices=None, lifespan=None):
    app = FastAPI(lifespan=lifespan)
    info = engine.model_info if not callable(getattr(engine, "model_info", None)) else engine.model_info()
    app.state.vox = AppState(engine=engine, settings=settings or ServerSettings(), model_info=dict(info),
                             voices=voices if voices is not None else VoiceStore(None))
    install_error_handlers(app)
    app.include_router(routes_ws.router)
    app.include_router(routes_voices.router)
    return app


@contextlib.contextmanager
def serving(app):
    """Run `app` under uvicorn on a free local port in a thread; yields the ws:// URL of the endpoint."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", ws_ping_interval=None))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + HANG
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"ws://127.0.0.1:{port}{WS_PATH}"
    finally:
        server.should_exit = True
        thread.join(HANG)
        sock.close()


class Client:
    """A websockets client with a timeout on every receive."""

    def __init__(self, ws):
        self.ws = ws

    async def send(self, **msg):
        await self.ws.send(json.dumps(msg))

    async def recv(self):
        m = await asyncio.wait_for(self.ws.recv(), HANG)
        return m if isinstance(m, bytes) else json.loads(m)

    async def recv_json(self):
        m = await self.recv()
        assert isinstance(m, dict), f"expected a JSON message, got {len(m)} bytes"
        return m

    async def until(self, kind):
        """Everything received up to and including the first message of type `kind`."""
        got = []
        while True:
            m = await self.recv()
            got.append(m)
            if isinstance(m, dict) and m.get("type") == kind:
                return got


def run_client(url, scenario):
    import websockets

    async def main():
        async with websockets.connect(url, max_size=None, open_timeout=HANG, close_timeout=HANG) as ws:
            return await scenario(Client(ws))
    return asyncio.run(main())


def check_framing(messages, *, expect_sentences, fmt="pcm", streamed=True):
    """audio.start / binary... / audio.done per sentence, indices 0.. in order, total_bytes = binary bytes."""
    sentences, current, binary = [], None, 0
    for m in messages:
        if isinstance(m, bytes):
            assert current is not None, "audio outside audio.start/audio.done"
            binary += len(m)
            current["frames"].append(m)
            continue
        if m["type"] == "audio.start":
            assert current is None
            assert m["sentence_index"] == len(sentences) and m["sentence_text"]
            assert m["format"] == fmt and m["sample_rate"] == 24000 and m["channels"] == 1
            current, binary = {"start": m, "frames": []}, 0
        elif m["type"] == "audio.done":
            assert current is not None and m["sentence_index"] == current["start"]["sentence_index"]
            assert m["total_bytes"] == binary and m["error"] is False
            assert m["utterance_index"] == current["start"]["utterance_index"]
            assert len(current["frames"]) >= 1 if streamed else len(current["frames"]) == 1
            sentences.append(current)
            current = None
        elif m["type"] == "session.done":
            assert current is None and m["total_sentences"] == len(sentences) == expect_sentences
    assert [s["start"]["sentence_index"] for s in sentences] == list(range(expect_sentences))
    return sentences


# ============================================================================================ sessions
def test_pipelined_session_audio_before_text_ends():
    """Text arrives in pieces cut mid-word / mid-sentence. The first two sentences are generated concurrently
    (the first one cannot finish before the second has: hold_first) and their audio — in order — arrives
    BEFORE the last piece of text is sent."""
    engine = FakeEngine(hold_first=True)

    async def scenario(c):
        await c.send(type="session.config", voice="Vivian", response_format="pcm", stream_audio=True,
                     language="English", seed=7, max_new_tokens=20)
        await c.send(type="input.text", text="Hello wor")
        await c.send(type="input.text", text="ld. How are")
        await c.send(type="input.text", text=" you? I am fi")
        early = await c.until("audio.done")
        early += await c.until("audio.done")              # both sentences done, input still open
        assert not engine.requests[2:], "the unfinished third sentence must not have been submitted"
        await c.send(type="input.text", text="ne, thanks.")
        await c.send(type="input.done")
        rest = await c.until("session.done")
        return early, rest

    with serving(make_app(engine)) as url:
        early, rest = run_client(url, scenario)
    sentences = check_framing(early + rest, expect_sentences=3)
    assert [s["start"]["sentence_text"] for s in sentences] == ["Hello world.", "How are you?",
                                                                 "I am fine, thanks."]
    assert [m["type"] for m in early if isinstance(m, dict)] == ["audio.start", "audio.done"] * 2
    assert engine.finished[:2] == ["How are you?", "Hello world."]   # generated out of order, sent in order
    first = b"".join(sentences[0]["frames"])
    assert np.all(np.frombuffer(first, "<i2") // 100 == 1)          # sentence 0 carries request 1's audio
    assert all(r.voice == "vivian" and r.pcm_format == "s16" and r.streaming.stream for r in engine.requests)
    assert all(r.language == "english" and r.sampling.seed == 7 and r.sampling.max_new_tokens == 20
               for r in engine.requests)
    assert len({r.request_id for r in engine.requests}) == 3


def test_wav_files_multi_utterance_and_session_close():
    engine = FakeEngine(chunks=3, chunk_samples=50)

    async def scenario(c):
        await c.send(type="session.config", voice="ryan")              # response_format defaults to wav
        await c.send(type="input.text", text="One. Two")
        await c.send(type="input.done")
        first = await c.until("session.done")
        await c.send(type="input.text", text="Three! Four?")
        await c.send(type="input.done")
        await c.send(type="session.close")
        second = await c.until("session.done")
        with pytest.raises(Exception):                                  # the server closes the socket
            await c.recv()
        return first, second

    with serving(make_app(engine)) as url:
        first, second = run_client(url, scenario)
    for part, texts, u in ((first, ["One.", "Two"], 0), (second, ["Three!", "Four?"], 1)):
        sentences = check_framing(part, expect_sentences=2, fmt="wav", streamed=False)
        assert [s["start"]["sentence_text"] for s in sentences] == texts
        assert part[-1]["utterance_index"] == u and all(s["start"]["utterance_index"] == u for s in sentences)
        for s in sentences:
            wav = s["frames"][0]
            assert wav[:4] == b"RIFF" and wav[8:16] == b"WAVEfmt "
            assert struct.unpack("<I", wav[24:28])[0] == 24000 and struct.unpack("<I", wav[40:44])[0] == 300
            assert len(wav) == 44 + 3 * 50 * 2
    assert all(not r.streaming.stream for r in engine.requests)


def test_session_close_speaks_the_buffered_text():
    """session.close without input.done: the text still buffered (no sentence terminator yet) is spoken and its
    utterance ends with session.done, as if input.done had come first, before the socket closes."""
    engine = FakeEngine()

    async def scenario(c):
        await c.send(type="session.config", voice="vivian", response_format="pcm")
        await c.send(type="input.text", text="Hi. Hello there")
        await c.send(type="session.close")
        got = await c.until("session.done")
        with pytest.raises(Exception):                                  # then the server closes the socket
            await c.recv()
        return got

    with serving(make_app(engine)) as url:
        got = run_client(url, scenario)
    sentences = check_framing(got, expect_sentences=2, streamed=False)
    assert [s["start"]["sentence_text"] for s in sentences] == ["Hi.", "Hello there"]
    assert engine.finished == ["Hi.", "Hello there"]


def test_protocol_errors_do_not_end_the_session():
    engine = FakeEngine()
    settings = ServerSettings(ws_max_text_chars=60)

    async def scenario(c):
        errors = []
        await c.ws.send("{not json")
        errors.append(await c.recv_json())
        await c.send(type="input.text", text="too early")
        errors.append(await c.recv_json())
        await c.send(type="session.config", response_format="mp3")
        errors.append(await c.recv_json())
        await c.send(type="session.config", voice="nobody")
        errors.append(await c.recv_json())
        await c.send(type="session.config", voice=5, speed=None, max_new_tokens=1)
        errors.append(await c.recv_json())
        await c.send(type="session.config", voice="vivian", max_new_tokens=1)
        errors.append(await c.recv_json())
        await c.send(type="session.config", response_format="wav", stream_audio=True)
        errors.append(await c.recv_json())
        await c.send(type="session.config", voice="vivian", response_format="pcm", stream_audio=True)
        await c.send(type="bogus")
        errors.append(await c.recv_json())
        await c.ws.send(b"\x00\x01")
        errors.append(await c.recv_json())
        await c.send(type="input.text", text=5)
        errors.append(await c.recv_json())
        await c.ws.send(json.dumps([1, 2]))
        errors.append(await c.recv_json())
        await c.send(type="input.text", text="x" * 61)                  # over the per-utterance text limit
        errors.append(await c.recv_json())
        await c.send(type="input.text", text="This will FAIL. This works.")
        await c.send(type="input.done")
        rest = await c.until("session.done")
        return errors, rest

    with serving(make_app(engine, settings)) as url:
        errors, rest = run_client(url, scenario)
    assert all(e["type"] == "error" and e["message"] for e in errors), errors
    assert "JSON" in errors[0]["message"] and "session.config" in errors[1]["message"]
    assert "mp3" in errors[2]["message"] and "nobody" in errors[3]["message"]
    assert errors[4]["param"] == "voice" and "voice.str" not in errors[4]["message"]   # a union's member: no param
    assert errors[5]["param"] == "max_new_tokens" and ">= 2" in errors[5]["message"]
    del errors[4:6]
    assert "stream_audio" in errors[4]["message"] and "bogus" in errors[5]["message"]
    assert "binary" in errors[6]["message"] and errors[9]["code"] == "text_limit"
    kinds = [m["type"] if isinstance(m, dict) else "bytes" for m in rest]
    assert kinds[:3] == ["audio.start", "error", "audio.done"]
    failed_done = rest[2]
    assert failed_done["error"] is True and failed_done["total_bytes"] == 0 and rest[1]["sentence_index"] == 0
    assert "synthetic failure" in rest[1]["message"]
    assert rest[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}
    ok_done = [m for m in rest if isinstance(m, dict) and m["type"] == "audio.done"][1]
    assert ok_done["error"] is False and ok_done["total_bytes"] == 2 * 120 * 2
    assert [r.text for r in engine.requests] == ["This will FAIL.", "This works."]


def test_client_disconnect_aborts_in_flight_sentences():
    engine = FakeEngine()

    async def scenario(c):
        await c.send(type="session.config", voice="vivian", response_format="pcm", stream_audio=True)
        await c.send(type="input.text", text="Please HOLD this one. HOLD that one too. ")
        start = await c.recv_json()
        assert start["type"] == "audio.start"
        await c.ws.close()                                              # leave mid-sentence

    with serving(make_app(engine)) as url:
        run_client(url, scenario)
        deadline = time.monotonic() + HANG
        while len(engine.aborted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sorted(engine.aborted) == ["HOLD that one too.", "Please HOLD this one."]
    assert engine.finished == []


def _metric(app, name: str, **labels) -> float:
    return app.state.vox.metrics.registry.get_sample_value(name, labels or None) or 0.0


def _until(predicate) -> None:
    deadline = time.monotonic() + HANG
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("refused", [False, True], ids=["generated_not_sent", "refused_by_the_limit"])
def test_a_session_that_leaves_closes_every_sentences_record(refused, monkeypatch):
    """A client that leaves while sentence 0 is held: sentence 1 had either finished generating (its audio queued
    behind sentence 0's, never sent) or been refused by the server's concurrency limit (no slot within the bounded
    wait, here none). Every sentence's record closes: the in-flight gauge is back to 0, the finished-but-unsent one
    counts as a client disconnect (499), a refused one only as a rejection (as an HTTP 429), and nothing as a server
    error (500). (The gauge counts slots held, and sentence 1 gave its slot back before the session's end closed its
    record: the wait is for the records too.)"""
    from voxflow.api.metrics import Metrics
    monkeypatch.setattr(ws_session, "ADMIT_WAIT_S", 0.0)
    engine = FakeEngine()
    app = make_app(engine, ServerSettings(max_concurrent_requests=1 if refused else 8))
    app.state.vox.metrics = Metrics()

    async def scenario(c):
        await c.send(type="session.config", voice="vivian", response_format="pcm", stream_audio=True)
        await c.send(type="input.text", text="Please HOLD this one. Two. ")
        assert (await c.recv_json())["type"] == "audio.start"
        await asyncio.sleep(0.2)                    # sentence 1 generates (or is refused) meanwhile
        await c.ws.close()

    closed = 1 if refused else 2
    with serving(app) as url:
        run_client(url, scenario)
        _until(lambda: _metric(app, "voxflow_api_requests_in_flight") == 0
               and _metric(app, "voxflow_requests_total", status="499") == closed)
    assert _metric(app, "voxflow_api_requests_in_flight") == 0
    assert _metric(app, "voxflow_api_requests_waiting") == 0
    assert _metric(app, "voxflow_requests_total", status="500") == 0
    assert _metric(app, "voxflow_requests_total", status="499") == closed
    assert _metric(app, "voxflow_requests_rejected_total", reason="concurrency") == (1 if refused else 0)
    assert engine.finished == ([] if refused else ["Two."])


def test_idle_timeout_closes_the_session():
    engine = FakeEngine()

    async def scenario(c):
        await c.send(type="session.config", voice="vivian")
        err = await c.recv_json()
        with pytest.raises(Exception):
            await c.recv()
        return err

    with serving(make_app(engine, ServerSettings(ws_idle_timeout_s=0.2))) as url:
        err = run_client(url, scenario)
    assert err["type"] == "error" and err["code"] == "timeout"


def test_ref_audio_is_encoded_once_per_session():
    engine = FakeEngine(task="voice_clone")
    t = np.arange(24000, dtype=np.float32) / 24000
    uri = "data:audio/wav;base64," + base64.b64encode(wav_bytes(0.3 * np.sin(2 * np.pi * 220 * t), 24000)).decode()

    async def scenario(c):
        await c.send(type="session.config", ref_audio=uri, ref_text="a reference", response_format="pcm")
        await c.send(type="input.text", text="First. Second. Third.")
        await c.send(type="input.done")
        return await c.until("session.done")

    with serving(make_app(engine)) as url:
        got = run_client(url, scenario)
    check_framing(got, expect_sentences=3, streamed=False)
    assert engine.voice_calls == [(24000 * 4, "a reference", False)]
    assert all(r.voice_clone_prompt == {"format": "fake.voice", "n": 1, "x_vector_only": False}
               and r.ref_audio is None for r in engine.requests)


def test_real_engine_session_custom_voice():
    """The tiny CustomVoice checkpoint through the in-process engine: real PCM, streamed and in order."""
    from voxflow.engine.engine import EngineConfig, EngineCore
    from voxflow.engine.inprocess import InProcessEngineClient

    core = EngineCore.from_config(EngineConfig(model=os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice"),
                                               max_num_seqs=8, max_num_batched_tokens=128, num_kv_blocks=256,
                                               block_size=4))
    client = InProcessEngineClient(core)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await client.start()
        yield
        await client.shutdown(drain=False)

    app = make_app(client, lifespan=lifespan)
    app.state.vox.model_info = dict(core.info())
    from voxflow.api.metrics import Metrics
    metrics = app.state.vox.metrics = Metrics()

    async def scenario(c):
        await c.send(type="session.config", voice="Serena", response_format="pcm", stream_audio=True,
                     max_new_tokens=4, seed=1, initial_codec_chunk_frames=1)
        await c.send(type="input.text", text="Good morni")
        await c.send(type="input.text", text="ng. See you soon")
        await c.send(type="input.done")
        return await c.until("session.done")

    with serving(app) as url:
        got = run_client(url, scenario)
    sentences = check_framing(got, expect_sentences=2)
    for s in sentences:
        pcm = b"".join(s["frames"])
        assert len(pcm) > 0 and len(pcm) % (2 * 1920) == 0          # whole codec frames of s16 samples
    # each sentence is a request for the metrics (and for the server-wide concurrency limit)
    sample = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for m in metrics.registry.collect() for s in m.samples}
    assert sample[("voxflow_requests_total", (("status", "200"),))] == 2
    assert sample[("voxflow_api_requests_in_flight", ())] == 0
    assert sample[("voxflow_audio_ttfp_seconds_count", ())] == 2
    assert app.state.vox.admission.running == 0 and app.state.vox.admission.waiting == 0
