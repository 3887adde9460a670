"""POST /v1/text-to-speech/{voice_id}[/stream] (routes_elevenlabs.py): the ElevenLabs-style HTTP routes are
POST /v1/audio/speech underneath, so the same request gives the same bytes through both. A real uvicorn server (the
app from create_app), an engine stand-in whose audio depends on the text alone."""
import io

import httpx
import numpy as np
import pytest

from test_api_ws import WS_PATH, FakeEngine, serving  # tests/test_api_ws.py
from voxflow.api.app import create_app
from voxflow.api.state import ServerSettings
from voxflow.engine.request import AudioChunk, FinalRecord, FinishReason

TIMEOUT = 20.0


class TextEngine(FakeEngine):
    """Two chunks of float32 PCM a request, a tone whose pitch follows the text's length (the HTTP routes ask the
    engine for float32 PCM and encode it themselves)."""

    async def generate(self, request):
        self.requests.append(request)
        t = np.arange(2400, dtype=np.float32) / 24000
        tone = (0.3 * np.sin(2 * np.pi * (100 + 10 * len(request.text)) * t)).astype("<f4")
        for i in range(2):
            yield AudioChunk(request.request_id, i, tone.tobytes(), 24000, tone.size, i, 1)
        yield FinalRecord(request.request_id, FinishReason.EOS)


@pytest.fixture
def server():
    engine = TextEngine()
    app = create_app(engine, ServerSettings(model_name="fake-model", api_keys=("secret",)),
                     model_info=engine.model_info, manage_engine=False, wait_for_engine=False)
    with serving(app) as url:
        base = url.replace("ws://", "http://").replace(WS_PATH, "")
        with httpx.Client(base_url=base, timeout=TIMEOUT, headers={"xi-api-key": "secret"}) as client:
            yield client, engine


def openai_bytes(client, **fields) -> httpx.Response:
    return client.post("/v1/audio/speech", json={"voice": "vivian", **fields})


def test_the_stream_route_is_the_openai_route_underneath(server):
    client, engine = server
    el = client.post("/v1/text-to-speech/vivian/stream", params={"output_format": "pcm_24000"},
                     json={"text": "Hello there.", "model_id": "eleven_turbo_v2_5", "seed": 7, "language_code": "en",
                           "voice_settings": {"stability": 0.4, "speed": 1.25}})
    oa = openai_bytes(client, input="Hello there.", response_format="pcm", stream_format="audio", seed=7,
                      language="english", speed=1.25)
    assert el.status_code == oa.status_code == 200
    assert el.content == oa.content and len(el.content) > 0
    assert el.headers["content-type"] == oa.headers["content-type"]
    ours, theirs = engine.requests
    assert (ours.voice, ours.language, ours.sampling.seed) == (theirs.voice, theirs.language, theirs.sampling.seed)
    assert ours.voice == "vivian" and ours.language == "english" and ours.sampling.seed == 7


def test_the_file_route_defaults_to_mp3(server):
    av = pytest.importorskip("av")
    client, _ = server
    el = client.post("/v1/text-to-speech/vivian", json={"text": "A whole file."})
    oa = openai_bytes(client, input="A whole file.", response_format="mp3")
    assert el.status_code == 200 and el.headers["content-type"] == "audio/mpeg"
    assert el.content == oa.content
    with av.open(io.BytesIO(el.content), format="mp3") as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        assert stream.codec_context.sample_rate == 24000
    assert abs(samples - 2 * 2400) <= 2400                      # the whole audio (the encoder's padding aside)


@pytest.mark.parametrize("path, params, body, status, param", [
    ("/v1/text-to-speech/vivian", {"output_format": "ulaw_8000"}, {"text": "x"}, 400, "output_format"),
    ("/v1/text-to-speech/vivian/stream", {"output_format": "pcm_16000"}, {"text": "x"}, 400, "output_format"),
    ("/v1/text-to-speech/vivian", {}, {"text": "x", "voice_settings": {"speed": 9}}, 400, "speed"),
    ("/v1/text-to-speech/vivian", {}, {"model_id": "m"}, 400, "text"),
    ("/v1/text-to-speech/nobody", {}, {"text": "x"}, 404, None),
], ids=["ulaw", "pcm-rate", "speed", "no-text", "voice"])
def test_bad_requests_get_the_usual_error_envelope(server, path, params, body, status, param):
    client, engine = server
    r = client.post(path, params=params, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and (param is None or error["param"] == param)
    assert engine.requests == []


def test_the_key_may_come_as_xi_api_key(server):
    client, _ = server
    assert client.post("/v1/text-to-speech/vivian", json={"text": "Hi."}).status_code == 200
    wrong = client.post("/v1/text-to-speech/vivian", json={"text": "Hi."}, headers={"xi-api-key": "wrong"})
    assert wrong.status_code == 401
