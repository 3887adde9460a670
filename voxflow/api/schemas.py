"""`POST /v1/audio/speech`: the request body (every OpenAI field, the vLLM-Omni extensions, voxflow's own) and
what it means for the served model (`plan_speech` -> `SpeechPlan`: engine request, response mode, encoder).

Only what does not depend on the served model or the server's settings is checked here (types, enums, fixed
ranges); limits from `ServerSettings` and everything model-specific (voices, languages, tasks) are checked by the
route, which names the field in its 400. A pydantic failure becomes a 400 naming the field too (errors.py).
Unknown fields are ignored (gateways and SDKs add their own); `null` means a field's default.
"""
from __future__ import annotations

import base64
import math
import os
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from voxflow.engine.request import (CHUNK_FRAMES_MAX, FLOAT_MAX, MAX_NEW_TOKENS_MAX, TOP_K_MAX, SamplingOptions,
                                    SpeechRequest, StreamingOptions)

from .errors import APIError, bad_request
from .voice_names import find_model_voice, is_openai_voice, map_openai_voice

RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
SEED_MAX = 2 ** 63 - 1

# task_type spellings -> voxflow's task names (voxflow.engine.request.TASKS)
TASK_TYPES = {
    "customvoice": "custom_voice", "custom_voice": "custom_voice",
    "voicedesign": "voice_design", "voice_design": "voice_design",
    "base": "voice_clone", "voice_clone": "voice_clone", "voiceclone": "voice_clone",
}


class VoiceObject(BaseModel):
    """OpenAI's custom-voice object: {"id": "voice_..."}."""
    model_config = ConfigDict(extra="ignore")
    id: str


class Reference(BaseModel):
    """SGLang-Omni / Higgs `references` item (one reference clip and its transcript)."""
    model_config = ConfigDict(extra="ignore")
    audio_path: str
    text: str | None = None


class SpeechRequestBody(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    # ---- OpenAI ---------------------------------------------------------------------------------------------
    input: str = Field(description="text to speak (at most settings.max_input_chars characters)")
    model: str | None = Field(None, description="served model id, its basename, or tts-1 / tts-1-hd / "
                                                "gpt-4o-mini-tts*; omitted = the served model")
    voice: str | VoiceObject | None = Field(
        None, validation_alias=AliasChoices("voice", "speaker"),
        description="model voice (case-insensitive), stored voice, or an OpenAI voice name (aliased)")
    instructions: str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] | None = None

    # ---- vLLM-Omni extensions -------------------------------------------------------------------------------
    stream: bool | None = None
    task_type: str | None = None
    language: str | None = None
    ref_audio: str | list[str] | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool | None = None
    speaker_embedding: list[float] | list[list[float]] | None = None
    # Every number has an upper bound: unbounded ints killed the engine process (top_k 2**63 overflowed an int64
    # tensor in its step; initial_codec_chunk_frames 2**70 did not fit msgpack). The engine's own bounds
    # (request.check_options), checked here too so that a client gets a 400 naming the field as it spells it.
    # max_new_tokens: >= 2 (_max_new_tokens); the server's limit, lower, is a setting (plan_speech)
    max_new_tokens: int | None = Field(None, le=MAX_NEW_TOKENS_MAX)
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    initial_codec_chunk_frames: int | None = Field(None, ge=0, le=CHUNK_FRAMES_MAX)
    extra_params: dict[str, Any] | None = None
    references: list[Reference] | None = None

    # ---- voxflow ---------------------------------------------------------------------------------------------
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    top_k: int | None = Field(None, ge=0, le=TOP_K_MAX)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    greedy: bool | None = None
    ignore_eos: bool | None = None        # fixed-length output (benchmarks with random weights)

    @model_validator(mode="before")
    @classmethod
    def _lift_extra_params(cls, data):
        """vLLM-Omni `extra_params` carries sampling settings: lift the known ones unless given at top level."""
        if isinstance(data, dict) and isinstance(data.get("extra_params"), dict):
            data = dict(data)
            for key in SAMPLING_EXTRAS:
                if key in data["extra_params"] and data.get(key) is None:
                    data[key] = data["extra_params"][key]
        return data

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        """`null` for a field with a default means that default (speed 1.0, response_format mp3): SDKs send null
        for fields the caller left unset. Fields whose default is null take it anyway; required ones stay
        required."""
        if isinstance(data, dict):
            unset = [name for name, f in cls.model_fields.items()
                     if name in data and data[name] is None and f.default is not None and not f.is_required()]
            if unset:
                data = {k: v for k, v in data.items() if k not in unset}
        return data

    @field_validator("voice", mode="before")
    @classmethod
    def _voice_type(cls, v):
        # Checked before the union: one message saying what a voice may be, not one per union member tried.
        if v is not None and not isinstance(v, (str, dict, VoiceObject)):
            raise ValueError('voice must be a voice name (a string) or an object {"id": "<name>"}')
        return v

    @field_validator("max_new_tokens")
    @classmethod
    def _max_new_tokens(cls, v: int | None) -> int | None:
        # The last sampled token gets no residual codes (official Qwen3-TTS): 1 would give no audio at all.
        if v is not None and v < 2:
            raise ValueError(f"max_new_tokens must be >= 2: N tokens give N - 1 frames of 80 ms (got {v})")
        return v

    @field_validator("speed")
    @classmethod
    def _finite_speed(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("speed must be a finite number")
        return v

    @field_validator("task_type")
    @classmethod
    def _task(cls, v: str | None) -> str | None:
        if v is None:
            return None
        key = v.strip().lower()
        if key not in TASK_TYPES:
            raise ValueError("task_type must be one of CustomVoice, VoiceDesign, Base "
                             "(or custom_voice, voice_design, voice_clone)")
        return TASK_TYPES[key]

    @field_validator("speaker_embedding")
    @classmethod
    def _embedding(cls, v):
        if v is None:
            return None
        flat = [x for row in v for x in row] if v and isinstance(v[0], list) else v
        if not flat:
            raise ValueError("speaker_embedding is empty")
        if len(flat) > 8192:
            raise ValueError("speaker_embedding has more than 8192 values")
        if not all(math.isfinite(x) and abs(x) <= FLOAT_MAX for x in flat):     # (it becomes float32)
            raise ValueError("speaker_embedding holds non-finite values (or values beyond float32's range)")
        return v

    @model_validator(mode="after")
    def _references(self) -> "SpeechRequestBody":
        if self.references:
            if len(self.references) != 1:
                raise ValueError("references: exactly one reference is supported")
            if self.ref_audio is None:
                self.ref_audio = self.references[0].audio_path
            if self.ref_text is None:
                self.ref_text = self.references[0].text
        return self

    # ---- helpers ---------------------------------------------------------------------------------------------
    @property
    def voice_name(self) -> str | None:
        if isinstance(self.voice, VoiceObject):
            return self.voice.id
        return self.voice

    @property
    def mode(self) -> str:
        """"sse", "audio" (raw chunked bytes) or "file" (whole file). stream_format wins; `stream: true` alone is
        SSE (vLLM-Omni since #4679); neither is a whole file."""
        if self.stream_format is not None:
            return self.stream_format
        return "sse" if self.stream else "file"

    @property
    def ref_audio_value(self) -> str | None:
        if isinstance(self.ref_audio, list):
            return self.ref_audio[0] if self.ref_audio else None
        return self.ref_audio

    def flat_speaker_embedding(self) -> list[float] | None:
        v = self.speaker_embedding
        if v is None:
            return None
        return [x for row in v for x in row] if v and isinstance(v[0], list) else list(v)


# ============================================================================================ request -> plan
# What a validated body means for the served model: the engine request, the response mode, the encoder.
# Every rejection names its field; nothing here talks to the engine except through a stored voice's prompt
# (VoiceStore.prompt_for) and the reference-audio fetch (media.resolve_ref_audio).

OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
SAMPLING_EXTRAS = ("temperature", "top_k", "top_p", "repetition_penalty", "greedy", "ignore_eos", "seed",
                   "max_new_tokens")


@dataclass
class SpeechPlan:
    request: SpeechRequest
    mode: str                       # file | audio | sse
    response_format: str
    speed: float
    sample_rate: int                # of the engine's PCM

    def make_encoder(self):
        from voxflow.audio.encode import make_encoder
        return make_encoder(self.response_format, self.sample_rate, speed=self.speed,
                            streaming=self.mode != "file")

    def headers(self, encoder) -> dict[str, str]:
        fmt = self.response_format
        return {"X-Request-Id": self.request.request_id,
                "X-Sample-Rate": str(getattr(encoder, "output_sample_rate", self.sample_rate)),
                "X-Channels": "1",
                "X-Audio-Format": "s16le" if fmt == "pcm" else fmt}


def accepted_model_ids(settings, model_info: dict) -> list[str]:
    """Ids accepted as `model` (case-insensitive): the served name, its basename, the model's own name, and the
    OpenAI TTS model ids (tts-1, tts-1-hd, gpt-4o-mini-tts, gpt-4o-mini-tts-2025-12-15), which all mean the
    served model."""
    ids = [settings.model_name, os.path.basename(os.path.normpath(settings.model_name)), model_info.get("name")]
    return [i for i in dict.fromkeys(ids) if i] + list(OPENAI_MODELS)


def check_model(settings, model_info: dict, model: str | None) -> None:
    """404 unless `model` (None: not given) names the served model (accepted_model_ids)."""
    if model is None:
        return
    if model.strip().lower() not in {i.lower() for i in accepted_model_ids(settings, model_info)}:
        raise APIError(404, f"model '{model}' is not served here; this server serves '{settings.model_name}'",
                       param="model", code="model_not_found")


def _default_preset(settings, voices: list[str]) -> str | None:
    if settings.default_voice:
        found = find_model_voice(settings.default_voice, voices)
        if found:
            return found
    if not voices:
        return None
    return find_model_voice("vivian", voices) or sorted(voices, key=str.lower)[0]


def _unknown_voice(name: str, voices: list[str], state) -> APIError:
    stored = state.voices.names() if state.voices is not None else []
    known = ", ".join(list(voices) + stored) or "none"
    return APIError(404, f"voice '{name}' not found; available voices: {known} (OpenAI voice names are aliased)",
                    param="voice", code="voice_not_found")


async def ref_audio_pcm(state, value: str) -> bytes:
    """The reference clip `value` names (media.resolve_ref_audio: its permissions and limits) as
    SpeechRequest.ref_audio takes it: float32 little-endian mono PCM at the model's rate."""
    from . import media
    wav = await media.resolve_ref_audio(value, state.settings,
                                        target_sr=int(state.model_info.get("sample_rate") or 24000))
    return np.ascontiguousarray(wav, dtype="<f4").tobytes()


def _max_new_tokens_or_cap(body: SpeechRequestBody, settings, info: dict) -> int | None:
    """The request's max_new_tokens; one that names none gets the model's default (None), or the operator's limit
    where that is lower (the released Qwen3-TTS defaults to 8192 frames, ~11 minutes: with ignore_eos, or a model
    that never ends, that much audio from one word). Models without such a default (the CPU voice): None."""
    if body.max_new_tokens is not None:
        return body.max_new_tokens
    default = info.get("default_max_new_tokens")
    return settings.max_new_tokens_limit if default and settings.max_new_tokens_limit < default else None


async def plan_speech(state, body: SpeechRequestBody, *, resolve_ref_audio=None) -> SpeechPlan:
    """resolve_ref_audio: `async (value) -> bytes` in place of ref_audio_pcm(state, value), e.g. one that decodes
    a clip shared by several requests once (POST /v1/audio/speech/batch)."""
    settings, info = state.settings, state.model_info
    check_model(settings, info, body.model)

    text = body.input
    if not text or not text.strip():
        raise bad_request("Input text cannot be empty", "input", code="empty_input")
    if len(text) > settings.max_input_chars:
        raise bad_request(f"input is {len(text)} characters long; the maximum is {settings.max_input_chars}",
                          "input", code="string_too_long")
    if body.instructions is not None and len(body.instructions) > settings.max_instructions_chars:
        raise bad_request(f"instructions are {len(body.instructions)} characters long; the maximum is "
                          f"{settings.max_instructions_chars}", "instructions", code="string_too_long")
    if body.max_new_tokens is not None and body.max_new_tokens > settings.max_new_tokens_limit:
        raise bad_request(f"max_new_tokens must be <= {settings.max_new_tokens_limit}", "max_new_tokens")
    try:
        from voxflow.audio.encode import FORMATS
    except ImportError:
        FORMATS = RESPONSE_FORMATS
    if body.response_format not in FORMATS:
        raise bad_request(f"response_format '{body.response_format}' is not supported here", "response_format")

    model_task = info.get("task") or "custom_voice"
    voices = list(info.get("voices") or [])
    ref_value = body.ref_audio_value
    if isinstance(body.ref_audio, list) and len(body.ref_audio) != 1:
        raise bad_request("ref_audio: give exactly one reference clip", "ref_audio")
    embedding = body.flat_speaker_embedding()
    cloning_fields = [f for f, v in (("ref_audio", ref_value), ("ref_text", body.ref_text),
                                     ("x_vector_only_mode", body.x_vector_only_mode),
                                     ("speaker_embedding", embedding)) if v not in (None, False)]

    # ---- voice -> preset speaker, stored voice, or nothing ------------------------------------------------
    name = body.voice_name
    preset, stored = None, None
    if name is not None and not name.strip():
        name = None
    if name is not None:
        preset = find_model_voice(name, voices)
        if preset is None:
            stored = state.voices.get(name) if state.voices is not None else None
        if preset is None and stored is None:
            if is_openai_voice(name):
                preset = map_openai_voice(name, voices)
            elif not (model_task == "voice_clone" and (ref_value is not None or embedding is not None)):
                raise _unknown_voice(name, voices, state)
    if preset is None and stored is None and model_task == "custom_voice":
        preset = _default_preset(settings, voices)
    if (model_task == "voice_clone" and stored is None and ref_value is None and embedding is None
            and settings.default_voice and state.voices is not None):
        stored = state.voices.get(settings.default_voice)
    if ref_value is not None or embedding is not None:
        stored = None                               # an explicit reference wins over a named voice

    # ---- task ---------------------------------------------------------------------------------------------
    wanted = body.task_type or ("voice_clone" if (cloning_fields or stored is not None) else model_task)
    if wanted != model_task:
        why = "task_type" if body.task_type else (cloning_fields[0] if cloning_fields else "voice")
        raise bad_request(f"this model ('{settings.model_name}') serves {model_task} requests, not {wanted}"
                          + (" (ref_audio / ref_text / x_vector_only_mode / speaker_embedding and stored voices "
                             "need a Base voice-clone model)" if wanted == "voice_clone" else ""),
                          why, code="unsupported_task")
    if model_task == "voice_design" and not (body.instructions and body.instructions.strip()):
        raise bad_request("a VoiceDesign model needs `instructions` describing the voice", "instructions")

    # ---- voice cloning inputs -------------------------------------------------------------------------------
    ref_audio, clone_prompt = None, None
    x_vector_only = bool(body.x_vector_only_mode)
    ref_text = body.ref_text
    if ref_text is not None and not ref_text.strip():
        raise bad_request("ref_text is empty; give the transcript of ref_audio or set x_vector_only_mode", "ref_text")
    if model_task == "voice_clone":
        if embedding is not None:
            if ref_value is not None:
                raise bad_request("speaker_embedding and ref_audio are mutually exclusive", "speaker_embedding")
            clone_prompt = _embedding_prompt(info, embedding)
        elif ref_value is not None:
            if not x_vector_only and ref_text is None:
                raise bad_request("ref_text (the transcript of ref_audio) is required for in-context voice cloning; "
                                  "or set x_vector_only_mode: true", "ref_text")
            ref_audio = await (resolve_ref_audio(ref_value) if resolve_ref_audio is not None
                               else ref_audio_pcm(state, ref_value))
        elif stored is not None:
            clone_prompt = await state.voices.prompt_for(stored, state.engine, info)
        else:
            raise bad_request("this model clones voices: give ref_audio (with ref_text), speaker_embedding, or the "
                              "name of an uploaded voice", "ref_audio")

    # ---- language -------------------------------------------------------------------------------------------
    language = None
    if body.language is not None and body.language.strip().lower() not in ("", "auto"):
        languages = [lang for lang in (info.get("languages") or []) if lang.lower() != "auto"]
        found = [lang for lang in languages if lang.lower() == body.language.strip().lower()]
        if not found:
            raise bad_request(f"unsupported language '{body.language}'; supported: Auto, "
                              + ", ".join(lang.title() for lang in languages), "language")
        language = found[0]

    mode = body.mode
    sampling = SamplingOptions(seed=body.seed, greedy=bool(body.greedy), temperature=body.temperature,
                               top_k=body.top_k, top_p=body.top_p, repetition_penalty=body.repetition_penalty,
                               max_new_tokens=_max_new_tokens_or_cap(body, settings, info),
                               ignore_eos=bool(body.ignore_eos))
    streaming = StreamingOptions(stream=mode != "file", initial_chunk_frames=body.initial_codec_chunk_frames or None)
    request = SpeechRequest(
        text=text, task=model_task, voice=preset if model_task == "custom_voice" else None,
        instructions=body.instructions if body.instructions and body.instructions.strip() else None,
        language=language, ref_audio=ref_audio, ref_text=ref_text if model_task == "voice_clone" else None,
        x_vector_only=x_vector_only, sampling=sampling, streaming=streaming, pcm_format="f32",
        request_id=f"speech-{uuid.uuid4().hex}")
    if clone_prompt is not None:
        request.voice_clone_prompt = clone_prompt
    return SpeechPlan(request=request, mode=mode, response_format=body.response_format, speed=body.speed,
                      sample_rate=int(info.get("sample_rate") or 24000))


def _embedding_prompt(info: dict, embedding: list[float]) -> dict:
    """A precomputed x-vector as a stored-voice prompt. Supported when the engine states the embedding size
    (model_info["speaker_embedding_dim"]) of a family whose prompt format we know (qwen3_tts)."""
    dim = info.get("speaker_embedding_dim")
    if info.get("family") != "qwen3_tts" or not dim:
        raise bad_request("speaker_embedding is not supported by this server for this model; upload the voice "
                          "(POST /v1/audio/voices) or send ref_audio", "speaker_embedding", code="unsupported")
    if len(embedding) != int(dim):
        raise bad_request(f"speaker_embedding has {len(embedding)} values; this model needs {dim}",
                          "speaker_embedding")
    x = np.asarray(embedding, dtype="<f4")
    return {"format": "qwen3_tts.voice.v1", "x_vector": base64.b64encode(x.tobytes()).decode(), "dim": int(dim),
            "ref_text": None, "ref_codes": None, "frames": 0}
