"""Uploaded (cloned) voices: computed once, kept on disk, found again after a restart.

    store = VoiceStore(settings.voices_dir)            # None: in memory only
    voice = store.get("My_Voice")                      # case-insensitive; None if unknown
    request.voice_clone_prompt = await store.prompt_for(voice, engine, model_info)   # or voice.prompt

A voice holds its name (as uploaded; looked up lower-cased), consent statement, optional transcript
(`ref_text`: present = in-context cloning, absent = x-vector only), creation time, the voice-clone prompt
that `EngineClient.create_voice` computed from the sample (plain JSON data: speaker embedding + reference
codes), which model computed it, and the uploaded sample itself (so the prompt can be recomputed when the
served model changes: `prompt_for` does that lazily).

On disk (`voices_dir`), one folder per voice named by its lower-cased name:

    <voices_dir>/<key>/voice.json     metadata + prompt
    <voices_dir>/<key>/sample.<ext>   the uploaded file, byte for byte

A voice is written into a hidden temporary folder (files fsynced) that is renamed into place in one step,
so a crash leaves either the whole voice or none of it (leftover `.tmp-*` folders are removed at start-up).
Deleting renames the folder away first, then removes it. Names: 1-64 characters of [A-Za-z0-9_-], starting
with a letter or digit, so a name is always one safe path component (no `..`, no separators, no dots).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_VOICES = 1000
# Without a voices folder the samples live in this process's memory: 1000 of 10 MiB would be 10 GiB. This bounds
# their total (a folder is bounded by its disk only).
MAX_MEMORY_SAMPLE_BYTES = 256 * 1024 * 1024
META_FILE = "voice.json"
FORMAT_VERSION = 1
SAMPLE_EXTENSIONS = {
    "audio/wav": ".wav", "audio/x-wav": ".wav", "audio/wave": ".wav", "audio/vnd.wave": ".wav",
    "audio/mpeg": ".mp3", "audio/mp3": ".mp3", "audio/flac": ".flac", "audio/x-flac": ".flac",
    "audio/ogg": ".ogg", "audio/opus": ".opus", "audio/webm": ".webm", "audio/mp4": ".m4a",
    "audio/x-m4a": ".m4a", "audio/aac": ".aac",
}


class VoiceExistsError(KeyError):
    """A voice of that name (case-insensitively) exists already."""


class VoiceLimitError(RuntimeError):
    """The store holds the maximum number of voices."""


def validate_name(name) -> str:
    """The name as given if it is acceptable; ValueError with a user-facing message otherwise."""
    if not isinstance(name, str) or not name:
        raise ValueError("voice name must be a non-empty string")
    if not NAME_RE.fullmatch(name):
        raise ValueError("voice name must be 1-64 characters of letters, digits, '_' or '-', starting with a "
                         "letter or digit")
    return name


def voice_key(name: str) -> str:
    return name.lower()


@dataclass
class StoredVoice:
    name: str                                    # as uploaded
    prompt: dict                                 # EngineClient.create_voice(...) result (plain data)
    consent: str
    ref_text: str | None = None                  # None: x-vector-only voice
    created_at: int = field(default_factory=lambda: int(time.time()))
    mime_type: str = "application/octet-stream"
    file_size: int = 0                           # bytes of the uploaded sample
    speaker_description: str | None = None
    model: str | None = None                     # model_info["name"] of the model that computed `prompt`
    sample_rate: int | None = None               # that model's rate
    duration_s: float | None = None
    sample_file: str | None = None               # file name inside the voice's folder
    _sample: bytes | None = field(default=None, repr=False)   # in-memory stores keep the sample here
    _dir: str | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return voice_key(self.name)

    @property
    def x_vector_only(self) -> bool:
        return self.ref_text is None

    @property
    def embedding_dim(self) -> int | None:
        dim = self.prompt.get("dim") if isinstance(self.prompt, dict) else None
        try:
            return int(dim) if dim is not None else None
        except (TypeError, ValueError):
            return None

    def public(self) -> dict:
        """The shape of vLLM-Omni's `uploaded_voices` entries (serving_api.md §7.1), plus the cloning mode."""
        return {"name": self.name, "consent": self.consent, "created_at": self.created_at,
                "file_size": self.file_size, "mime_type": self.mime_type, "embedding_source": "audio",
                "embedding_dim": self.embedding_dim, "ref_text": self.ref_text,
                "speaker_description": self.speaker_description,
                "mode": "x_vector" if self.x_vector_only else "icl", "model": self.model}

    def load_sample(self) -> bytes:
        if self._sample is not None:
            return self._sample
        if self._dir is None or self.sample_file is None:
            raise FileNotFoundError(f"voice {self.name!r} has no stored sample")
        with open(os.path.join(self._dir, self.sample_file), "rb") as f:
            return f.read()

    def _meta(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        d["version"] = FORMAT_VERSION
        return d


class VoiceStore:
    def __init__(self, voices_dir: str | os.PathLike | None = None, *, max_voices: int = MAX_VOICES,
                 max_memory_bytes: int = MAX_MEMORY_SAMPLE_BYTES):
        self.dir = os.path.abspath(os.fspath(voices_dir)) if voices_dir else None
        self.max_voices = max_voices
        self.max_memory_bytes = max_memory_bytes
        self._voices: dict[str, StoredVoice] = {}
        self._lock = threading.Lock()
        if self.dir is not None:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            self._load()

    # ---- lookup --------------------------------------------------------------------------------------------
    def get(self, name: str | None) -> StoredVoice | None:
        if not isinstance(name, str):
            return None
        return self._voices.get(voice_key(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and voice_key(name) in self._voices

    def __len__(self) -> int:
        return len(self._voices)

    def list(self) -> list[StoredVoice]:
        return sorted(self._voices.values(), key=lambda v: v.key)

    def names(self) -> list[str]:
        return [v.name for v in self.list()]

    # ---- changes -------------------------------------------------------------------------------------------
    def check_new(self, name: str) -> str:
        """Raise (ValueError / VoiceExistsError / VoiceLimitError) unless `name` could be added now."""
        validate_name(name)
        if voice_key(name) in self._voices:
            raise VoiceExistsError(name)
        if len(self._voices) >= self.max_voices:
            raise VoiceLimitError(f"the server holds the maximum of {self.max_voices} uploaded voices")
        return name

    def add(self, voice: StoredVoice, sample: bytes) -> StoredVoice:
        """Store a new voice and its sample (blocking disk I/O: call it from a worker thread in async code)."""
        with self._lock:
            self.check_new(voice.name)
            voice.file_size = len(sample)
            if self.dir is None:
                held = sum(v.file_size or 0 for v in self._voices.values())
                if held + len(sample) > self.max_memory_bytes:
                    raise VoiceLimitError(f"uploaded voices held in memory would pass {self.max_memory_bytes >> 20} "
                                          f"MiB; delete some, or serve with --voices-dir")
                voice._sample = bytes(sample)
            else:
                self._write_new(voice, sample)
            self._voices[voice.key] = voice
        return voice

    def delete(self, name: str) -> bool:
        """Remove a voice; False if there was none of that name."""
        with self._lock:
            voice = self._voices.pop(voice_key(name), None) if isinstance(name, str) else None
            if voice is None:
                return False
            if self.dir is not None and voice._dir is not None:
                trash = os.path.join(self.dir, f".trash-{voice.key}-{uuid.uuid4().hex[:8]}")
                try:
                    os.rename(voice._dir, trash)
                except FileNotFoundError:
                    return True
                shutil.rmtree(trash, ignore_errors=True)
            return True

    def update_prompt(self, name: str, prompt: dict, *, model: str | None, sample_rate: int | None) -> None:
        """Replace a voice's prompt (recomputed for another model); written atomically."""
        with self._lock:
            voice = self._voices.get(voice_key(name))
            if voice is None:
                raise KeyError(name)
            voice.prompt, voice.model, voice.sample_rate = prompt, model, sample_rate
            if voice._dir is not None:
                _write_json_atomic(os.path.join(voice._dir, META_FILE), voice._meta())

    async def prompt_for(self, voice: StoredVoice, engine, model_info: dict) -> dict:
        """The voice's clone prompt for the served model: the stored one, or recomputed once from the stored
        sample (and persisted) when another model computed it."""
        name = model_info.get("name")
        if voice.model is None or voice.model == name:
            return voice.prompt
        from .media import decode_ref_audio              # late: media imports heavier audio code

        # The sample passed the limits when it was uploaded.
        limits = SimpleNamespace(max_ref_audio_bytes=max(voice.file_size, 1), max_ref_audio_seconds=float("inf"),
                                 min_ref_audio_seconds=0.0)
        sr = int(model_info.get("sample_rate") or 24000)
        sample = await asyncio.to_thread(voice.load_sample)
        wav = await decode_ref_audio(sample, limits, target_sr=sr, param="voice")
        prompt = await engine.create_voice(wav.tobytes(), voice.ref_text, voice.x_vector_only)
        await asyncio.to_thread(self.update_prompt, voice.name, prompt, model=name, sample_rate=sr)
        log.info("voice %r: prompt recomputed for model %r (was %r)", voice.name, name, voice.model)
        return prompt

    # ---- disk ----------------------------------------------------------------------------------------------
    def _write_new(self, voice: StoredVoice, sample: bytes) -> None:
        final = os.path.join(self.dir, voice.key)
        if os.path.lexists(final):
            raise VoiceExistsError(voice.name)
        tmp = os.path.join(self.dir, f".tmp-{voice.key}-{uuid.uuid4().hex[:8]}")
        os.mkdir(tmp, 0o700)
        try:
            voice.sample_file = "sample" + SAMPLE_EXTENSIONS.get((voice.mime_type or "").lower(), ".bin")
            _write_file(os.path.join(tmp, voice.sample_file), sample)
            _write_file(os.path.join(tmp, META_FILE), _json_bytes(voice._meta()))
            _fsync_dir(tmp)
            os.rename(tmp, final)            # atomic; fails if `final` appeared meanwhile (non-empty)
            _fsync_dir(self.dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        voice._dir = final

    def _load(self) -> None:
        for entry in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, entry)
            if entry.startswith((".tmp-", ".trash-")):
                shutil.rmtree(path, ignore_errors=True)          # an interrupted write / delete
                continue
            if entry.startswith(".") or not os.path.isdir(path) or os.path.islink(path):
                continue
            try:
                voice = self._read_voice(entry, path)
            except Exception as e:
                log.warning("skipping stored voice %r: %s", entry, e)
                continue
            self._voices[voice.key] = voice
        if self._voices:
            log.info("loaded %d stored voice(s) from %s", len(self._voices), self.dir)

    @staticmethod
    def _read_voice(entry: str, path: str) -> StoredVoice:
        with open(os.path.join(path, META_FILE), "rb") as f:
            meta = json.loads(f.read())
        if not isinstance(meta, dict) or not isinstance(meta.get("prompt"), dict):
            raise ValueError("voice.json holds no prompt")
        meta.pop("version", None)
        known = {k for k in StoredVoice.__dataclass_fields__ if not k.startswith("_")}
        voice = StoredVoice(**{k: v for k, v in meta.items() if k in known})
        validate_name(voice.name)
        if voice.key != entry:
            raise ValueError(f"folder name does not match the voice name {voice.name!r}")
        if voice.sample_file is not None and (os.path.basename(voice.sample_file) != voice.sample_file
                                              or voice.sample_file.startswith(".")):
            raise ValueError("invalid sample file name")
        voice._dir = path
        return voice


def _json_bytes(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_json_atomic(path: str, obj) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        _write_file(tmp, _json_bytes(obj))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(os.path.dirname(path))


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["VoiceStore", "StoredVoice", "VoiceExistsError", "VoiceLimitError", "validate_name", "NAME_RE"]
