"""WS /v1/text-to-speech/{voice_id}/stream-input — the ElevenLabs-style text-in / audio-out protocol (§10).

Voice-agent stacks (Pipecat's and LiveKit's ElevenLabs services, the ElevenLabs SDKs) speak this protocol; pointed at
voxflow's base URL they work unchanged. The session is ws_session.StreamSession's (sentences generated as the text
completes them, pipelined, sent in order; the same server-wide admission, limits and abort on disconnect); only the
framing differs.

    URL query: output_format  pcm_<rate> at the model's rate (pcm_24000 for Qwen3-TTS; s16le mono), or
                              mp3_<rate>_<kbps> (an MP3 stream at the model's rate, ~128 kb/s: MP3 frames carry their
                              rate, so decoders play it right); anything else is refused (error, then close 1008)
               inactivity_timeout  seconds without a message and no audio pending before the session ends
                              (default 20, 1..180)
               language_code  ISO 639-1 (en, zh, ...): the language the model is told (default: its own choice)
               model_id, auto_mode, sync_alignment, enable_ssml_parsing, apply_text_normalization: accepted and
                              ignored (the served model is the one voxflow runs; no alignment is produced)
    API key: `xi-api-key` header, `Authorization: Bearer`, or `?api_key=` / `?xi_api_key=` (AuthMiddleware).

Client -> server (JSON text frames):
    {"text": " ", "voice_settings": {...}, "generation_config": {"chunk_length_schedule": [120, 160, 250, 290]}}
                      the first message (BOS); voice_settings.speed must be 1.0 if given (the rest have no meaning
                      here and are ignored)
    {"text": "Hello ", "flush": false}    any number of times; "flush": true speaks the buffered text now
    {"text": ""}                          EOS: the rest of the text is spoken, then the session ends

Server -> client: {"audio": "<base64>", "isFinal": null, "normalizedAlignment": null, "alignment": null} as the
audio is generated, then {"isFinal": true, ...} after the last of it, then close 1000. A failure:
{"message": "...", "error": "<kind>"}: a bad first message or query option ends the session (close 1000 / 1008),
anything later is reported and the session goes on.

When text is spoken: a complete sentence at once (as on /v1/audio/speech/stream); a buffer of text that reaches the
next chunk_length_schedule threshold (in characters, 50..500; the n-th generation uses the n-th value, the last value
after) at a word boundary; and on flush or EOS.
"""
from __future__ import annotations

import base64
import contextlib

import numpy as np
from fastapi import APIRouter, WebSocket

from voxflow.audio.encode import make_encoder

from .elevenlabs_compat import ProtocolError, language, output_format
from .routes_ws import open_session
from .ws_session import _END, MAX_MESSAGE_BYTES, StreamSession, _Job, _UtteranceDone

router = APIRouter()

DEFAULT_SCHEDULE = (120, 160, 250, 290)      # ElevenLabs' default chunk_length_schedule
SCHEDULE_RANGE = (50, 500)
INACTIVITY_RANGE = (1.0, 180.0)
DEFAULT_INACTIVITY_S = 20.0


def inactivity_timeout(value: str | None) -> float:
    if value is None:
        return DEFAULT_INACTIVITY_S
    try:
        seconds = float(value)
    except ValueError:
        raise ProtocolError(f"inactivity_timeout must be a number of seconds, got {value!r}") from None
    low, high = INACTIVITY_RANGE
    if not low <= seconds <= high:
        raise ProtocolError(f"inactivity_timeout must be within {low:g}..{high:g} s, got {value}")
    return seconds


def chunk_schedule(config) -> tuple[int, ...]:
    """generation_config.chunk_length_schedule checked (a non-empty list of integers in SCHEDULE_RANGE); absent:
    DEFAULT_SCHEDULE."""
    schedule = config.get("chunk_length_schedule") if isinstance(config, dict) else config
    if schedule is None:
        return DEFAULT_SCHEDULE
    low, high = SCHEDULE_RANGE
    if (not isinstance(schedule, list) or not schedule
            or any(isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high for v in schedule)):
        raise ProtocolError(f"generation_config.chunk_length_schedule must be a list of integers within "
                            f"{low}..{high}")
    return tuple(schedule)


class ElevenLabsSession(StreamSession):
    """One stream-input connection: the voice from the path, the format and timeout from the query, the rest from the
    first message; one utterance, ended by EOS."""

    def __init__(self, ws: WebSocket, state, voice_id: str):
        super().__init__(ws, state)
        self.voice_id = voice_id
        self.fmt = "pcm"                    # output_format and inactivity_timeout: from the query (run)
        self.language = language(ws.query_params.get("language_code"))
        self.schedule = DEFAULT_SCHEDULE
        self.generations = 0                # sentences and schedule-triggered pieces sent to the engine
        self.encoder = None                 # mp3: one encoder for the whole stream

    async def error(self, message: str, code: str | None = None, **extra) -> None:
        with contextlib.suppress(Exception):
            await self.send_json({"message": message, "error": code or "invalid_request"})

    # ---- receiving -------------------------------------------------------------------------------------------
    async def _handle(self, message: dict) -> str | None:
        parsed = await self._json_message(message, MAX_MESSAGE_BYTES)
        if parsed is None:
            return None
        msg = parsed[0]
        if not isinstance(msg.get("text"), str):
            await self.error("messages need a string field 'text'")
            return None
        if self.cfg is None:
            return await self._begin(msg)
        if msg["text"] == "":                                   # EOS: speak the rest, then end
            self._input_done()
            return "close"
        await self._input_text({"text": msg["text"]})
        if msg.get("flush") is True:
            self._speak_buffer()
        else:
            self._apply_schedule()
        return None

    async def _begin(self, msg: dict) -> str | None:
        """The first message: the session's config (and any text it carries); a bad one ends the session."""
        settings = msg.get("voice_settings") or {}
        try:
            if not isinstance(settings, dict):
                raise ProtocolError("voice_settings must be an object")
            self.schedule = chunk_schedule(msg.get("generation_config"))
        except ProtocolError as e:
            await self.error(str(e))
            return "close"
        config = {"type": "session.config", "voice": self.voice_id, "response_format": "pcm", "stream_audio": True,
                  "language": self.language}
        if settings.get("speed") is not None:
            config["speed"] = settings["speed"]
        await self._configure(config)
        if self.cfg is None:                                    # refused: its error was sent
            return "close"
        if self.fmt == "mp3":
            self.encoder = make_encoder("mp3", self.cfg.sample_rate)
        if msg["text"].strip():
            await self._input_text({"text": msg["text"]})
        if msg["text"] == "":
            self._input_done()
            return "close"
        return None

    def _submit(self, sentence: str) -> None:
        self.generations += 1
        super()._submit(sentence)

    def _speak_buffer(self) -> None:
        """flush: the buffered text spoken now, as its own generation."""
        for sentence in self.splitter.flush():
            self._submit(sentence)

    def _apply_schedule(self) -> None:
        """The buffer spoken once it reaches this generation's threshold and ends at a word boundary (the text
        pieces clients send end with a space by convention)."""
        pending = self.splitter.pending
        threshold = self.schedule[min(self.generations, len(self.schedule) - 1)]
        if len(pending.strip()) >= threshold and pending[-1:].isspace():
            self._speak_buffer()

    # ---- sending (ws_session.StreamSession's loop: in sentence order) ----------------------------------------------
    async def run(self) -> None:
        query = self.ws.query_params
        try:
            self.fmt = output_format(query.get("output_format"), int(self.state.model_info.get("sample_rate") or 24000))
            self.idle_timeout_s = inactivity_timeout(query.get("inactivity_timeout"))
        except ProtocolError as e:                  # a bad query option: said, then the connection refused
            await self.ws.accept()
            await self.error(str(e))
            await self._close(1008)
            return
        try:
            await super().run()
        finally:
            if self.encoder is not None:
                self.encoder.close()

    async def _send_utterance_done(self, item: _UtteranceDone) -> None:
        if self.encoder is not None:
            await self._send_audio(self.encoder.finish())
        await self.send_json({"isFinal": True, "audio": None, "normalizedAlignment": None, "alignment": None})

    async def _send_job(self, job: _Job) -> None:
        while True:
            piece = await job.queue.get()
            if piece is _END:
                break
            if job.tracker is not None:
                job.tracker.sent(len(piece) / (2 * self.cfg.sample_rate))         # s16 mono
            if self.encoder is not None:
                piece = self.encoder.feed(np.frombuffer(piece, dtype="<i2").astype(np.float32) / 32768.0)
            await self._send_audio(piece)
        if job.tracker is not None:
            job.tracker.finish(200 if job.error is None else 500, "error" if job.error else "eos")
        if job.error is not None:
            await self.error(f"generation failed for the text {job.text[:60]!r}: {job.error}", code="generation_failed")

    async def _send_audio(self, data: bytes) -> None:
        if data:
            await self.send_json({"audio": base64.b64encode(data).decode("ascii"), "isFinal": None,
                                  "normalizedAlignment": None, "alignment": None})


@router.websocket("/v1/text-to-speech/{voice_id}/stream-input")
async def stream_input(websocket: WebSocket, voice_id: str):
    await open_session(websocket, lambda ws: ElevenLabsSession(ws, websocket.app.state.vox, voice_id))


__all__ = ["router", "ElevenLabsSession", "output_format", "chunk_schedule", "inactivity_timeout"]
