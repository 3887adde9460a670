"""Voices: list presets and uploaded voices, upload a voice to clone, delete it (serving_api.md §7).

GET    /v1/audio/voices          {"voices": [sorted names: presets + uploaded], "uploaded_voices": [{...}]}
POST   /v1/audio/voices          multipart/form-data:
           name                  required; 1-64 of [A-Za-z0-9_-] (case-insensitive when used)
           consent               required; the speaker's consent statement or id (stored, listed)
           audio_sample          required; the audio file (aliases: audio, file); <= max_ref_audio_bytes,
                                 min..max_ref_audio_seconds long
           ref_text              optional; the transcript of the sample. Given: in-context cloning (reference
                                 codes + speaker embedding). Absent: x-vector-only cloning (speaker embedding)
           x_vector_only         optional bool; default: true exactly when ref_text is absent. true with a
                                 ref_text ignores the transcript; false without one is a 400
           speaker_description   optional free text
       -> {"success": true, "voice": {...}}
DELETE /v1/audio/voices/{name}   -> {"success": true, "message": "..."}; unknown: 404
                                 {"success": false, "error": {OpenAI error envelope}}

Upload only on voice-clone (Base) models (else 400 `unsupported_model`). The clone prompt is computed ONCE
here, through `engine.create_voice`, and persisted with the sample; requests naming the voice send that
prompt (`SpeechRequest.voice_clone_prompt`) and the engine encodes nothing per request.
Status codes: 409 `voice_exists` for a name already taken (uploaded or preset, case-insensitively), 413 for
an oversize upload (checked on Content-Length and again while reading, before parsing), 400 for unreadable or
too short / long audio and for missing fields, 503 when the engine is not available.
"""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile

from voxflow.engine.client import EngineUnavailableError

from .errors import APIError, bad_request
from .media import decode_ref_audio
from .voices import StoredVoice, VoiceExistsError, VoiceLimitError, VoiceStore, validate_name

router = APIRouter()

FORM_OVERHEAD_BYTES = 256 * 1024        # multipart framing + the text fields, on top of the audio limit
MAX_TEXT_FIELD_CHARS = 4096
AUDIO_FIELDS = ("audio_sample", "audio", "file")


def voice_store(state) -> VoiceStore:
    """The app's VoiceStore, created on first use from settings.voices_dir when the app did not set one."""
    if state.voices is None:
        state.voices = VoiceStore(state.settings.voices_dir)
    return state.voices


def preset_voices(model_info: dict) -> list[str]:
    return [str(v) for v in (model_info or {}).get("voices") or []]


@router.get("/v1/audio/voices")
async def list_voices(request: Request):
    state = request.app.state.vox
    store = voice_store(state)
    uploaded = store.list()
    names: dict[str, str] = {}
    for n in preset_voices(state.model_info):
        names.setdefault(n.lower(), n)
    for v in uploaded:
        names.setdefault(v.key, v.name)
    return {"voices": [names[k] for k in sorted(names)], "uploaded_voices": [v.public() for v in uploaded]}


@router.post("/v1/audio/voices")
async def upload_voice(request: Request):
    state = request.app.state.vox
    settings, info = state.settings, state.model_info or {}
    if info.get("task") != "voice_clone":
        raise bad_request(f"uploading voices needs a voice-clone (Base) model; this server's model serves "
                          f"{info.get('task')!r}", code="unsupported_model")
    store = voice_store(state)
    audio_limit = int(settings.max_ref_audio_bytes)
    body = await _read_body_capped(request, audio_limit + FORM_OVERHEAD_BYTES)
    form = await _parse_form(request, body, audio_limit + FORM_OVERHEAD_BYTES)
    try:
        name = _text(form, "name", required=True)
        try:
            validate_name(name)
        except ValueError as e:
            raise bad_request(str(e), "name") from None
        consent = _text(form, "consent", required=True)
        ref_text = _text(form, "ref_text")
        if ref_text is not None and not ref_text.strip():
            raise bad_request("ref_text must not be empty or whitespace; omit it for x-vector-only cloning",
                              "ref_text")
        description = _text(form, "speaker_description")
        x_vector_only = _bool(form, "x_vector_only", default=ref_text is None)
        if not x_vector_only and ref_text is None:
            raise bad_request("x_vector_only=false needs ref_text (the transcript of the sample)", "ref_text")
        if x_vector_only:
            ref_text = None
        if form.get("speaker_embedding") is not None:
            raise bad_request("uploading a speaker_embedding is not supported; upload an audio_sample",
                              "speaker_embedding", code="unsupported_value")
        if any(p.lower() == name.lower() for p in preset_voices(info)):
            raise APIError(409, f"{name!r} is a preset voice of this model", param="name", code="voice_exists")
        _check_new(store, name)
        upload, field_name = _audio_part(form)
        sample = await upload.read()
        mime = (upload.content_type or "application/octet-stream").split(";")[0].strip().lower()
    finally:
        await form.close()

    if len(sample) > audio_limit:
        raise APIError(413, f"audio_sample is too large ({len(sample)} bytes); the limit is {audio_limit} bytes",
                       param=field_name, code="too_large")
    sr = int(info.get("sample_rate") or 24000)
    wav = await decode_ref_audio(sample, settings, target_sr=sr, param=field_name)
    try:
        prompt = await state.engine.create_voice(wav.tobytes(), ref_text, x_vector_only)
    except ValueError as e:
        raise bad_request(f"cannot clone this voice: {e}", field_name) from None
    except EngineUnavailableError as e:
        raise APIError(503, f"engine unavailable: {e}", retry_after=5) from None
    voice = StoredVoice(name=name, prompt=prompt, consent=consent, ref_text=ref_text, mime_type=mime,
                        speaker_description=description, model=info.get("name"), sample_rate=sr,
                        duration_s=round(wav.shape[0] / sr, 3))
    try:
        await asyncio.to_thread(store.add, voice, sample)
    except (VoiceExistsError, VoiceLimitError, ValueError) as e:
        _raise_for_add(e, name)
    return {"success": True, "voice": voice.public()}


@router.delete("/v1/audio/voices/{name}")
async def delete_voice(name: str, request: Request):
    state = request.app.state.vox
    store = voice_store(state)
    if store.get(name) is None:
        if any(p.lower() == name.lower() for p in preset_voices(state.model_info)):
            err = bad_request(f"{name!r} is a preset voice and cannot be deleted", "name")
        else:
            err = APIError(404, f"voice {name!r} not found", param="name", code="voice_not_found")
        return JSONResponse({"success": False, **err.body()}, status_code=err.status)
    await asyncio.to_thread(store.delete, name)
    return {"success": True, "message": f"voice {name!r} deleted"}


# ---- helpers -----------------------------------------------------------------------------------------------
def _check_new(store: VoiceStore, name: str) -> None:
    try:
        store.check_new(name)
    except (VoiceExistsError, VoiceLimitError, ValueError) as e:
        _raise_for_add(e, name)


def _raise_for_add(e: Exception, name: str):
    if isinstance(e, VoiceExistsError):
        raise APIError(409, f"a voice named {name!r} exists already; delete it first or choose another name",
                       param="name", code="voice_exists") from None
    if isinstance(e, VoiceLimitError):
        raise bad_request(str(e), "name", code="voice_limit") from None
    raise bad_request(str(e), "name") from None


async def _read_body_capped(request: Request, cap: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > cap:
        raise APIError(413, f"upload too large ({declared} bytes); the limit is {cap} bytes", code="too_large")
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > cap:
            raise APIError(413, f"upload too large; the limit is {cap} bytes", code="too_large")
    return bytes(buf)


async def _parse_form(request: Request, body: bytes, cap: int):
    ctype = request.headers.get("content-type", "")
    if not ctype.lower().startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise bad_request("POST /v1/audio/voices takes multipart/form-data (name, consent, audio_sample, "
                          "ref_text)", code="invalid_content_type")
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return {"type": "http.request", "body": b"", "more_body": False}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        return await Request(request.scope, receive=replay).form(max_files=4, max_fields=32,
                                                                 max_part_size=cap)
    except APIError:
        raise
    except Exception as e:          # malformed multipart (starlette raises its own HTTPException / parser errors)
        raise bad_request(f"malformed multipart body: {getattr(e, 'detail', None) or e}",
                          code="invalid_multipart") from None


def _text(form, key: str, *, required: bool = False) -> str | None:
    value = form.get(key)
    if value is None or (isinstance(value, str) and value == "" and not required):   # "" = not given
        if required:
            raise bad_request(f"{key} is required", key, code="missing_field")
        return None
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a text field, not a file", key)
    if required and not value.strip():
        raise bad_request(f"{key} must not be empty", key, code="missing_field")
    if len(value) > MAX_TEXT_FIELD_CHARS:
        raise bad_request(f"{key} is longer than {MAX_TEXT_FIELD_CHARS} characters", key)
    return value


def _bool(form, key: str, *, default: bool) -> bool:
    value = form.get(key)
    if value is None or value == "":
        return default
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise bad_request(f"{key} must be true or false", key)


def _audio_part(form) -> tuple[UploadFile, str]:
    for key in AUDIO_FIELDS:
        value = form.get(key)
        if value is None:
            continue
        if not isinstance(value, UploadFile):
            raise bad_request(f"{key} must be a file upload", key)
        return value, key
    raise bad_request("audio_sample (the audio file to clone) is required", "audio_sample", code="missing_field")


__all__ = ["router", "voice_store", "preset_voices"]
