"""WS /v1/text-to-speech/{voice_id}/stream-input (routes_ws_elevenlabs.py): the ElevenLabs-style protocol on the
same pipelined session as /v1/audio/speech/stream. A real uvicorn server and the `websockets` client, the fake engine
of test_api_ws (request n's chunk i is 120 samples of the value n * 100 + i), a timeout on every receive."""
import asyncio
import base64
import io
import json
import time

import numpy as np
import pytest
import websockets

from test_api_ws import HANG, WS_PATH, FakeEngine, make_app, serving  # tests/test_api_ws.py
from voxflow.api import elevenlabs_compat, routes_ws_elevenlabs
from voxflow.api.app import AuthMiddleware

BOS = {"text": " ", "voice_settings": {"stability": 0.5, "similarity_boost": 0.8}}


def app_for(engine):
    app = make_app(engine)
    app.include_router(routes_ws_elevenlabs.router)
    return app


def url_of(base: str, voice: str = "vivian", query: str = "output_format=pcm_24000&model_id=eleven_turbo_v2_5"):
    return base.replace(WS_PATH, f"/v1/text-to-speech/{voice}/stream-input") + (f"?{query}" if query else "")


def session(url, scenario):
    async def main():
        async with websockets.connect(url, max_size=None, open_timeout=HANG, close_timeout=HANG) as ws:
            async def send(**msg):
                await ws.send(json.dumps(msg))

            async def recv():
                return json.loads(await asyncio.wait_for(ws.recv(), HANG))
            result = await scenario(ws, send, recv)
            return result
    return asyncio.run(main())


async def until_final(recv) -> list[dict]:
    got = []
    while True:
        m = await recv()
        got.append(m)
        if m.get("isFinal") is True or "error" in m:
            return got


def audio_of(messages) -> bytes:
    out = b""
    for m in messages:
        assert set(m) >= {"audio", "isFinal", "normalizedAlignment", "alignment"}, m
        if m["audio"] is not None:
            out += base64.b64decode(m["audio"])
    return out


def expected_pcm(requests: int, chunks: int = 2, samples: int = 120) -> bytes:
    return b"".join(np.full(samples, n * 100 + i, dtype="<i2").tobytes()
                    for n in range(1, requests + 1) for i in range(chunks))


def test_a_session_speaks_sentences_as_they_complete_and_ends_with_is_final():
    """Text cut anywhere; the first sentence's audio arrives before EOS is sent; the audio is every sentence's PCM
    in order; isFinal after the last of it; then the server closes (1000)."""
    engine = FakeEngine()

    async def scenario(ws, send, recv):
        await send(**BOS)
        await send(text="Hello the")
        await send(text="re. How are ")
        first = await recv()                                    # before EOS: the first sentence is already spoken
        assert first["isFinal"] is None and base64.b64decode(first["audio"])
        await send(text="you? I am fine ")
        await send(text="")
        rest = await until_final(recv)
        with pytest.raises(websockets.ConnectionClosedOK):
            await asyncio.wait_for(ws.recv(), HANG)
        return [first] + rest

    with serving(app_for(engine)) as base:
        messages = session(url_of(base, query="output_format=pcm_24000&language_code=en"), scenario)
    assert [r.text for r in engine.requests] == ["Hello there.", "How are you?", "I am fine"]
    assert [m["isFinal"] for m in messages] == [None] * (len(messages) - 1) + [True]
    assert audio_of(messages) == expected_pcm(3)
    assert {(r.voice, r.language) for r in engine.requests} == {("vivian", "english")}


def test_flush_speaks_the_buffer_now_and_the_schedule_at_a_word_boundary():
    """flush: true speaks text without a terminator at once; with chunk_length_schedule [50] a buffer of >= 50
    characters is spoken once it ends at a space (not mid-word); the rest at EOS."""
    engine = FakeEngine()
    words = "one two three four five six seven eight nine ten eleven"       # 55 characters, no terminator

    async def scenario(ws, send, recv):
        await send(**BOS, generation_config={"chunk_length_schedule": [50]})
        await send(text="no terminator here ", flush=True)
        await recv(), await recv()                              # its two chunks
        await send(text=words[:52])                             # >= 50 but mid-word: nothing yet
        await send(text=words[52:] + " ")                        # the word ends: spoken
        await recv()                                            # its first chunk
        assert [r.text for r in engine.requests] == ["no terminator here", words]
        await send(text="tail words")
        await send(text="")
        return await until_final(recv)

    with serving(app_for(engine)) as base:
        session(url_of(base), scenario)
    assert [r.text for r in engine.requests] == ["no terminator here", words, "tail words"]


def test_mp3_output_is_one_mp3_stream_at_the_models_rate():
    av = pytest.importorskip("av")
    engine = FakeEngine(chunks=4, chunk_samples=2400)

    async def scenario(ws, send, recv):
        await send(**BOS)
        await send(text="First sentence. Second one. ")
        await send(text="")
        return await until_final(recv)

    with serving(app_for(engine)) as base:
        messages = session(url_of(base, query="output_format=mp3_44100_128"), scenario)
    data = audio_of(messages)
    with av.open(io.BytesIO(data), format="mp3") as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        assert stream.codec_context.sample_rate == 24000
    assert abs(samples - 2 * 4 * 2400) <= 2400                  # the whole audio (an encoder's padding aside)


@pytest.mark.parametrize("query, bos, expect", [
    ("output_format=pcm_16000", None, "not supported"),
    ("output_format=ulaw_8000", None, "not supported"),
    ("inactivity_timeout=0", None, "inactivity_timeout"),
    ("", {**BOS, "generation_config": {"chunk_length_schedule": [10]}}, "chunk_length_schedule"),
    ("", {**BOS, "voice_settings": {"speed": 1.2}}, "speed"),
], ids=["pcm-rate", "ulaw", "timeout", "schedule", "speed"])
def test_bad_options_get_a_clear_error_and_end_the_session(query, bos, expect):
    """A bad query option: the error, then close 1008 before any message is read; a bad first message: the error,
    then the session ends. Nothing reaches the engine."""
    engine = FakeEngine()

    async def scenario(ws, send, recv):
        if bos is not None:
            await send(**bos)
        m = await recv()
        assert m["error"] and expect in m["message"], m
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), HANG)
        if bos is None:
            assert closed.value.rcvd.code == 1008

    with serving(app_for(engine)) as base:
        session(url_of(base, query=query), scenario)
    assert engine.requests == []


def test_a_malformed_message_is_reported_and_the_session_goes_on():
    engine = FakeEngine()

    async def scenario(ws, send, recv):
        await ws.send("{not json")
        assert "invalid JSON" in (await recv())["message"]
        await send(voice_settings={})
        assert "string field 'text'" in (await recv())["message"]
        await send(**BOS)
        await send(text="Still here. ")
        await send(text="")
        return await until_final(recv)

    with serving(app_for(engine)) as base:
        messages = session(url_of(base), scenario)
    assert audio_of(messages) == expected_pcm(1) and messages[-1]["isFinal"] is True


def test_an_unknown_voice_is_refused_and_nothing_is_generated():
    engine = FakeEngine()

    async def scenario(ws, send, recv):
        await send(**BOS)
        m = await recv()
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), HANG)
        return m

    with serving(app_for(engine)) as base:
        m = session(url_of(base, voice="nobody"), scenario)
    assert "nobody" in m["message"] and m["error"]
    assert engine.requests == []


def test_a_client_that_leaves_aborts_its_text_in_the_engine():
    engine = FakeEngine()

    async def scenario(ws, send, recv):
        await send(**BOS)
        await send(text="Please HOLD this one. ")
        deadline = time.monotonic() + HANG
        while not engine.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await ws.close()

    with serving(app_for(engine)) as base:
        session(url_of(base), scenario)
        deadline = time.monotonic() + HANG
        while not engine.aborted and time.monotonic() < deadline:
            time.sleep(0.01)
    assert engine.aborted == ["Please HOLD this one."]


def test_the_api_key_may_come_as_elevenlabs_clients_send_it():
    """xi-api-key header (HTTP and WebSocket) or ?xi_api_key= on a WebSocket, as well as Bearer / ?api_key=."""
    auth = AuthMiddleware(None, ("secret",))

    def scope(kind="websocket", headers=(), query=b""):
        return {"type": kind, "headers": list(headers), "query_string": query}
    assert auth.allowed(scope(headers=[(b"xi-api-key", b"secret")]))
    assert auth.allowed(scope("http", headers=[(b"xi-api-key", b"secret")]))
    assert auth.allowed(scope(query=b"xi_api_key=secret"))
    assert auth.allowed(scope(headers=[(b"authorization", b"Bearer secret")]))
    assert not auth.allowed(scope(headers=[(b"xi-api-key", b"wrong")]))
    assert not auth.allowed(scope("http", query=b"xi_api_key=secret"))          # query keys: WebSockets only
    assert not auth.allowed(scope())


def test_output_format_and_schedule_parsing():
    of = elevenlabs_compat.output_format
    assert of(None, 24000) == of("pcm_24000", 24000) == "pcm" and of("mp3_22050_32", 24000) == "mp3"
    for bad in ("pcm_22050", "ulaw_8000", "opus_48000_64", "pcm", "mp3_44100"):
        with pytest.raises(elevenlabs_compat.ProtocolError):
            of(bad, 24000)
    cs = routes_ws_elevenlabs.chunk_schedule
    assert cs(None) == cs({}) == (120, 160, 250, 290) and cs({"chunk_length_schedule": [50, 500]}) == (50, 500)
    for bad in ([], [49], [501], [True], ["120"], "120"):
        with pytest.raises(routes_ws_elevenlabs.ProtocolError):
            cs({"chunk_length_schedule": bad})


def test_the_served_app_routes_it_behind_the_api_key():
    """create_app serves the endpoint; with an API key configured, an `xi-api-key` header opens a session and a
    missing key is refused at the handshake (403: the middleware closes before accepting)."""
    from voxflow.api.app import create_app
    from voxflow.api.state import ServerSettings
    engine = FakeEngine()
    app = create_app(engine, ServerSettings(model_name="fake-model", api_keys=("secret",)),
                     model_info=engine.model_info, manage_engine=False, wait_for_engine=False)

    async def speak(headers):
        url = url_of(base)
        async with websockets.connect(url, additional_headers=headers, open_timeout=HANG) as ws:
            await ws.send(json.dumps(BOS))
            await ws.send(json.dumps({"text": "Hi there. "}))
            await ws.send(json.dumps({"text": ""}))
            got = []
            while not got or got[-1].get("isFinal") is not True:
                got.append(json.loads(await asyncio.wait_for(ws.recv(), HANG)))
            return got

    with serving(app) as base:
        assert audio_of(asyncio.run(speak({"xi-api-key": "secret"}))) == expected_pcm(1)
        with pytest.raises(websockets.InvalidStatus) as refused:
            asyncio.run(speak({"xi-api-key": "wrong"}))
    assert refused.value.response.status_code == 403
