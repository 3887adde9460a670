"""OpenAI voice names -> the served model's own voices (deterministic, documented).

Clients written for OpenAI (Pipecat, LiveKit, Open WebUI, the SDK's examples) send one of OpenAI's built-in voice
names. A model with preset speakers answers each of them with one of its own voices:

1. `PREFERRED[name]`: the first of these candidates the model has (Qwen3-TTS CustomVoice speakers, chosen by
   rough character: alloy -> serena, ash -> aiden, ballad -> ryan, coral -> vivian, echo -> ryan, fable -> aiden,
   onyx -> uncle_fu, nova -> vivian, sage -> serena, shimmer -> sohee, verse -> dylan, marin -> ono_anna,
   cedar -> eric);
2. otherwise (a model with other speakers): its voices sorted by name, taken round-robin in the order of
   `OPENAI_VOICES` (alloy -> 1st, ash -> 2nd, ...).

The model's own voices always win: a model speaker that happens to be called like an OpenAI voice is that speaker.
Names are case-insensitive (`Vivian`, `VIVIAN`, `vivian`). A model without presets (VoiceDesign, Base) has nothing
to map to: `map_openai_voice` returns None and the caller uses the server's default voice, if any, or none.
"""
from __future__ import annotations

OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
                 "marin", "cedar")

PREFERRED: dict[str, tuple[str, ...]] = {
    "alloy": ("serena", "vivian"),
    "ash": ("aiden", "ryan"),
    "ballad": ("ryan", "aiden"),
    "coral": ("vivian", "serena"),
    "echo": ("ryan", "aiden"),
    "fable": ("aiden", "ryan"),
    "onyx": ("uncle_fu", "ryan"),
    "nova": ("vivian", "serena"),
    "sage": ("serena", "vivian"),
    "shimmer": ("sohee", "vivian"),
    "verse": ("dylan", "ryan"),
    "marin": ("ono_anna", "sohee"),
    "cedar": ("eric", "uncle_fu"),
}


def is_openai_voice(name: str) -> bool:
    return name.strip().lower() in OPENAI_VOICES


def find_model_voice(name: str, model_voices: list[str] | tuple[str, ...]) -> str | None:
    """The model's own spelling of `name` (case-insensitive), or None."""
    wanted = name.strip().lower()
    for v in model_voices:
        if v.lower() == wanted:
            return v
    return None


def map_openai_voice(name: str, model_voices: list[str] | tuple[str, ...]) -> str | None:
    """The model voice an OpenAI voice name stands for; None if `name` is not an OpenAI voice or the model has no
    preset voices."""
    key = name.strip().lower()
    if key not in OPENAI_VOICES or not model_voices:
        return None
    for candidate in PREFERRED.get(key, ()):
        found = find_model_voice(candidate, model_voices)
        if found is not None:
            return found
    ordered = sorted(model_voices, key=str.lower)
    return ordered[OPENAI_VOICES.index(key) % len(ordered)]


def openai_voice_table(model_voices: list[str] | tuple[str, ...]) -> dict[str, str]:
    """{openai name: model voice} for every OpenAI name (empty when the model has no presets); shown in /v1/models."""
    table = {}
    for name in OPENAI_VOICES:
        mapped = map_openai_voice(name, model_voices)
        if mapped is not None:
            table[name] = mapped
    return table
