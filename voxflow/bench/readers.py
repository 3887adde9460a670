"""Incremental readers that find the audio sample bytes in a response as its pieces arrive.

Each `feed(piece)` returns the audio bytes (s16le) that piece completed, so the caller can stamp them with the
piece's arrival time: a WAV header alone, an SSE event without audio, or a keep-alive yields b"" and does not
count as the first audio packet (benchmarking.md §1, serving_api.md §3).

- `PcmReader`: raw s16le, every byte is audio.
- `WavReader`: RIFF/WAVE (streamed with 0xFFFFFFFF sizes or not): chunks are skipped until `data`; `fmt ` gives
  the sample rate and channel count.
- `SseReader`: `data:` lines of JSON events. OpenAI / vLLM-Omni `speech.audio.delta` (base64 in `audio`),
  SGLang-Omni `audio.speech.chunk` (base64 in `audio.data`), `[DONE]`; `speech.audio.error` or any event with
  an `error` raises `StreamError`. With response_format wav the decoded deltas go through a `WavReader`.
"""
from __future__ import annotations

import base64
import binascii
import json
import struct


class StreamError(Exception):
    """The server reported a failure inside a 200 response (SSE error event, undecodable event)."""


class PcmReader:
    sample_rate: int | None = None
    channels: int | None = None

    def feed(self, piece: bytes) -> bytes:
        return piece


class WavReader:
    def __init__(self):
        self.buf = b""
        self.in_data = False
        self.sample_rate: int | None = None
        self.channels: int | None = None
        self.bits: int | None = None

    def feed(self, piece: bytes) -> bytes:
        if self.in_data:
            return piece
        self.buf += piece
        if len(self.buf) < 12:
            return b""
        if self.buf[:4] != b"RIFF" or self.buf[8:12] != b"WAVE":
            raise StreamError("response is not a RIFF/WAVE file")
        pos = 12
        while len(self.buf) >= pos + 8:
            cid, size = self.buf[pos:pos + 4], struct.unpack("<I", self.buf[pos + 4:pos + 8])[0]
            if cid == b"data":
                self.in_data = True
                rest, self.buf = self.buf[pos + 8:], b""
                return rest
            if len(self.buf) < pos + 8 + size:
                return b""
            if cid == b"fmt ":
                fmt, ch, sr, _, _, bits = struct.unpack("<HHIIHH", self.buf[pos + 8:pos + 24])
                if fmt not in (1, 0xFFFE) or bits != 16:
                    raise StreamError(f"WAV is not 16-bit PCM (format {fmt}, {bits} bits)")
                self.sample_rate, self.channels, self.bits = sr, ch, bits
            pos += 8 + size + (size & 1)
        return b""


class SseReader:
    def __init__(self, inner=None):
        self.buf = b""
        self.inner = inner or PcmReader()
        self.done = False
        self.events = 0

    @property
    def sample_rate(self):
        return self.inner.sample_rate

    @property
    def channels(self):
        return self.inner.channels

    def feed(self, piece: bytes) -> bytes:
        self.buf += piece
        out = []
        while True:
            cut = _event_end(self.buf)
            if cut is None:
                break
            raw, self.buf = self.buf[:cut[0]], self.buf[cut[1]:]
            audio = self._event(raw)
            if audio:
                out.append(self.inner.feed(audio))
        return b"".join(out)

    def _event(self, raw: bytes) -> bytes:
        data = [line[5:].lstrip() for line in raw.decode("utf-8", "replace").splitlines()
                if line.startswith("data:")]
        if not data:
            return b""                       # comments, keep-alives, event:/id: lines only
        payload = "\n".join(data)
        if payload.strip() == "[DONE]":
            self.done = True
            return b""
        try:
            ev = json.loads(payload)
        except json.JSONDecodeError:
            raise StreamError(f"SSE event is not JSON: {payload[:120]!r}") from None
        self.events += 1
        if not isinstance(ev, dict):
            return b""
        kind = str(ev.get("type", ""))
        if kind.endswith(".error") or ev.get("error"):
            raise StreamError(f"server error event: {json.dumps(ev)[:300]}")
        if kind.endswith(".done"):
            self.done = True
        audio = ev.get("audio")
        if isinstance(audio, dict):             # SGLang-Omni: {"audio": {"data": b64}}
            audio = audio.get("data")
        if not audio or not isinstance(audio, str):
            return b""
        try:
            return base64.b64decode(audio)
        except (binascii.Error, ValueError):
            raise StreamError("SSE audio is not base64") from None


def _event_end(buf: bytes) -> tuple[int, int] | None:
    """(end of event, start of next) at the first blank line, for \\n\\n, \\r\\n\\r\\n or \\r\\r."""
    best = None
    for sep in (b"\r\n\r\n", b"\n\n", b"\r\r"):
        i = buf.find(sep)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, i + len(sep))
    return best


def make_reader(stream: str, response_format: str):
    inner = WavReader() if response_format == "wav" else PcmReader()
    return SseReader(inner) if stream == "sse" else inner
