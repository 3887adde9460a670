"""What voxflow's ElevenLabs-style routes share (routes_elevenlabs.py: HTTP; routes_ws_elevenlabs.py: stream-input):
the `output_format` query values it serves, and the ISO 639-1 `language_code`s of the languages it knows."""
from __future__ import annotations

import re

_PCM = re.compile(r"pcm_(\d+)")
_MP3 = re.compile(r"mp3_(\d+)_(\d+)")

# language_code -> the language names the models take (Qwen3-TTS's ten; any other code is passed on as it is, for
# the model's own check to refuse or take)
LANGUAGE_CODES = {"zh": "chinese", "en": "english", "ja": "japanese", "ko": "korean", "de": "german", "fr": "french",
                  "ru": "russian", "pt": "portuguese", "es": "spanish", "it": "italian"}


class ProtocolError(ValueError):
    """A message or option this endpoint refuses: its text goes to the client as the error's message."""


def output_format(value: str | None, sample_rate: int) -> str:
    """'pcm' or 'mp3' for an output_format query value (None: pcm at the model's rate); ProtocolError otherwise."""
    if value is None:
        return "pcm"
    if (m := _PCM.fullmatch(value)) and int(m.group(1)) == sample_rate:
        return "pcm"
    if _MP3.fullmatch(value):
        return "mp3"
    raise ProtocolError(f"output_format {value!r} is not supported: this model speaks at {sample_rate} Hz; use "
                        f"pcm_{sample_rate} or mp3_<rate>_<kbps> (MP3 at {sample_rate} Hz)")


def language(code: str | None) -> str | None:
    """The language name for an ISO 639-1 `language_code` (None: the model's own choice)."""
    if code is None:
        return None
    return LANGUAGE_CODES.get(code.lower(), code)
