"""A WebSocket speech session's `session.config` (routes_ws.py's protocol): its message checked into a per-sentence
request template, through the same body model and planning as POST /v1/audio/speech."""
from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import ValidationError

from voxflow.engine.client import EngineUnavailableError
from voxflow.engine.request import SpeechRequest

from .errors import validation_error
from .schemas import SpeechRequestBody, plan_speech
from .text_split import GRANULARITIES


class ConfigError(ValueError):
    pass


@dataclass
class SessionConfig:
    template: SpeechRequest              # per-sentence request, text filled in per sentence
    response_format: str = "wav"
    stream_audio: bool = False
    split_granularity: str = "sentence"
    sample_rate: int = 24000


# ---- session.config ----------------------------------------------------------------------------------------
WS_ONLY_FIELDS = ("type", "stream_audio", "split_granularity", "word_timestamps", "input", "stream",
                  "stream_format", "response_format", "speed")


def _option(msg: dict, key: str, kind, default):
    value = msg.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ConfigError(f"{key} must be {'true or false' if kind is bool else 'a string'}")
    return value


async def build_config(msg: dict, state) -> SessionConfig:
    """Validate a session.config message into a per-sentence request template (ConfigError / APIError).

    The speech fields mean exactly what they mean for POST /v1/audio/speech: they go through the same body
    model and `plan_speech` (voice aliases and defaults, task inference, languages, cloning inputs, limits).
    A reference clip (ref_audio) is then encoded once, here, into a clone prompt reused by every sentence."""
    fmt = str(_option(msg, "response_format", str, "wav")).lower()
    if fmt not in ("pcm", "wav"):
        raise ConfigError(f"response_format {fmt!r} is not supported on this endpoint; use pcm or wav")
    stream_audio = _option(msg, "stream_audio", bool, False)
    if stream_audio and fmt != "pcm":
        raise ConfigError("stream_audio=true needs response_format 'pcm'")
    gran = str(_option(msg, "split_granularity", str, "sentence")).lower()
    if gran not in GRANULARITIES:
        raise ConfigError(f"split_granularity must be one of {', '.join(GRANULARITIES)}")
    speed = msg.get("speed")
    if speed is not None and (isinstance(speed, bool) or not isinstance(speed, (int, float)) or speed != 1.0):
        raise ConfigError("speed other than 1.0 is not supported on the streaming endpoint")
    if msg.get("word_timestamps"):
        raise ConfigError("word_timestamps are not supported")
    fields = {k: v for k, v in msg.items() if k not in WS_ONLY_FIELDS}
    try:
        body = SpeechRequestBody.model_validate({**fields, "input": "-", "response_format": fmt})
    except ValidationError as e:
        raise validation_error(e.errors()) from None       # worded, and its param named, as over HTTP
    plan = await plan_speech(state, body)
    template = plan.request
    template.pcm_format = "s16"
    template.streaming = replace(template.streaming, stream=bool(stream_audio))
    if template.ref_audio is not None and hasattr(state.engine, "create_voice"):
        try:                                      # encode the reference once for the whole session
            prompt = await state.engine.create_voice(template.ref_audio, template.ref_text, template.x_vector_only)
        except ValueError as e:
            raise ConfigError(f"cannot use this reference audio: {e}") from None
        except EngineUnavailableError as e:
            raise ConfigError(f"engine unavailable: {e}") from None
        template.voice_clone_prompt, template.ref_audio = prompt, None
    return SessionConfig(template=template, response_format=fmt, stream_audio=bool(stream_audio),
                         split_granularity=gran, sample_rate=plan.sample_rate)
