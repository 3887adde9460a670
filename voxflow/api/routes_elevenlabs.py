"""POST /v1/text-to-speech/{voice_id}[/stream] — the ElevenLabs-style HTTP speech routes, for clients built on them.

    POST /v1/text-to-speech/{voice_id}?output_format=mp3_44100_128          the whole file
    POST /v1/text-to-speech/{voice_id}/stream?output_format=pcm_24000       chunked audio as it is generated
    body: {"text": "...", "model_id": "...", "voice_settings": {"speed": 1.0, ...}, "seed": 7, "language_code": "en"}

They are POST /v1/audio/speech underneath (routes_speech.speak: the same planning, voices, admission, limits, metrics
and errors, which keep voxflow's OpenAI shape): `text` is its input, the path's voice its voice, `seed` and
`voice_settings.speed` (0.25-4.0) its own fields, `language_code` (ISO 639-1) the language it names.
`output_format`: mp3_<rate>_<kbps> (the default, mp3_44100_128: an MP3 at the model's rate, whose frames state it) or
pcm_<the model's rate> (s16le mono); anything else is a 400 naming it. model_id, the other voice_settings, and the
query's optimize_streaming_latency / enable_logging are accepted and ignored. The API key may come as `xi-api-key`.
"""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .elevenlabs_compat import ProtocolError, language, output_format
from .errors import bad_request, validation_error
from .routes_speech import speak
from .schemas import SpeechRequestBody
from .state import get_state

router = APIRouter()

DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"          # ElevenLabs' default


class VoiceSettings(BaseModel):
    model_config = ConfigDict(extra="ignore")
    speed: float | None = None


class TextToSpeechBody(BaseModel):
    model_config = ConfigDict(extra="ignore")           # previous_text, pronunciation_dictionary_locators, ...
    text: str = Field(description="text to speak")
    model_id: str | None = None                         # an ElevenLabs model id: the served model speaks
    voice_settings: VoiceSettings | None = None
    seed: int | None = None
    language_code: str | None = None


def speech_body(voice_id: str, body: TextToSpeechBody, fmt: str, stream: bool) -> SpeechRequestBody:
    """The POST /v1/audio/speech request this one is (its checks and their 400s, field names and all)."""
    fields = {"input": body.text, "voice": voice_id, "response_format": fmt, "language": language(body.language_code),
              "seed": body.seed, "stream_format": "audio" if stream else None}
    if body.voice_settings is not None and body.voice_settings.speed is not None:
        fields["speed"] = body.voice_settings.speed
    try:
        return SpeechRequestBody.model_validate(fields)
    except ValidationError as e:
        raise validation_error(e.errors()) from None


async def _text_to_speech(voice_id: str, body: TextToSpeechBody, request: Request, stream: bool):
    arrived = time.monotonic()
    state = get_state(request)
    sample_rate = int(state.model_info.get("sample_rate") or 24000)
    try:
        fmt = output_format(request.query_params.get("output_format", DEFAULT_OUTPUT_FORMAT), sample_rate)
    except ProtocolError as e:
        raise bad_request(str(e), param="output_format", code="unsupported_output_format") from None
    return await speak(speech_body(voice_id, body, fmt, stream), request, arrived)


@router.post("/v1/text-to-speech/{voice_id}")
async def text_to_speech(voice_id: str, body: TextToSpeechBody, request: Request):
    return await _text_to_speech(voice_id, body, request, stream=False)


@router.post("/v1/text-to-speech/{voice_id}/stream")
async def text_to_speech_stream(voice_id: str, body: TextToSpeechBody, request: Request):
    return await _text_to_speech(voice_id, body, request, stream=True)


__all__ = ["router", "TextToSpeechBody", "speech_body"]
