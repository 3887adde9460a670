"""What the benchmark sends: prompts (bundled or a file), their order, and the request each one becomes.

Bundled set (`prompts/prompts.jsonl`, written for this project): 66 prompts in the ten Qwen3-TTS languages,
each tagged short / medium / long. Other sets: a `.jsonl` file (`text`, optional `id`, `language`, `length`,
`ref_audio`, `ref_text`), a seed-tts-eval `meta.lst` (`utt|prompt_text|prompt_wav|target_text`, or `utt|text`;
reference paths relative to the file), or a `.txt` file with one prompt per line.

Order: the selected prompts are shuffled with `seed` and cycled to the requested count, so every system sees the
same prompts in the same order. `--unique-prompts` gives every request of the run its own text (a lead-in naming
the run and the request: `unique`), so that a server's prefix cache holds nothing from the text on (what comes
before the text in the prompt, e.g. a shared voice-clone reference, may still be cached):
the bundled set has 66 prompts, and a level of more requests, a later level, or a second run against the same
server otherwise repeats texts whose KV the server still has (H200 session 25: an HTTP c=64 run of 256 prompts
computed ~9 prompt positions a request). Voice clone: each prompt's own reference clip, else `--ref-audio`, else a
generated speech-like clip (deterministic, 3 s at 24 kHz) with `DEFAULT_REF_TEXT`. Fixed-length runs (random
weights never emit EOS) send `max_new_tokens` and `ignore_eos`; whatever else a target server needs goes in
`extra_body` (merged last; a null value removes a key).

This module needs only numpy and the standard library (tools/bench_official.py imports it in its own venv).
"""
from __future__ import annotations

import base64
import json
import os
import random
from dataclasses import dataclass, field, replace
from typing import Iterable

import numpy as np

from ..audio.io import wav_bytes

BUNDLED = os.path.join(os.path.dirname(__file__), "prompts", "prompts.jsonl")
LENGTHS = ("short", "medium", "long")
DEFAULT_REF_TEXT = "The morning light came in through the kitchen window while the kettle began to sing."
# what a voice_design request describes when the run gives no --instructions (the model needs one)
DEFAULT_VOICE_DESCRIPTION = "A calm adult voice, speaking clearly at a moderate pace."
TASK_TYPE_NAMES = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "voice_clone": "Base"}
MIME = {".wav": "audio/wav", ".flac": "audio/flac", ".mp3": "audio/mpeg", ".ogg": "audio/ogg",
        ".opus": "audio/ogg", ".m4a": "audio/mp4", ".aac": "audio/aac"}


class WorkloadError(ValueError):
    """A bad workload option or prompt file (shown to the user as one line)."""


@dataclass
class Prompt:
    id: str
    text: str
    language: str | None = None         # lower-case language name ("english"), None = unknown / auto
    length: str | None = None           # short | medium | long
    ref_audio: str | None = None        # voice clone: path of this prompt's reference clip
    ref_text: str | None = None


# ------------------------------------------------------------------------------------------------ loading
def load_prompts(dataset: str = "bundled") -> list[Prompt]:
    path = BUNDLED if dataset in ("bundled", "", None) else dataset
    if not os.path.isfile(path):
        raise WorkloadError(f"prompt set {dataset!r}: no such file")
    base = os.path.dirname(os.path.abspath(path))
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    prompts: list[Prompt] = []
    if path.endswith(".jsonl") or path.endswith(".json"):
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise WorkloadError(f"{path}:{n}: not JSON ({e})") from None
            text = d.get("text") or d.get("input")
            if not text:
                raise WorkloadError(f"{path}:{n}: no 'text'")
            ref = d.get("ref_audio")
            prompts.append(Prompt(str(d.get("id", n)), text, _lang(d.get("language")), d.get("length"),
                                  os.path.join(base, ref) if ref else None, d.get("ref_text")))
    elif path.endswith(".lst"):
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            parts = line.split("|")
            if len(parts) >= 4:
                utt, ref_text, ref_wav, text = parts[0], parts[1], parts[2], parts[3]
                prompts.append(Prompt(utt, text, None, None, os.path.join(base, ref_wav), ref_text))
            elif len(parts) == 2:
                prompts.append(Prompt(parts[0], parts[1]))
            else:
                raise WorkloadError(f"{path}:{n}: expected utt|prompt_text|prompt_wav|target_text or utt|text")
    else:
        prompts = [Prompt(str(n), line.strip()) for n, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise WorkloadError(f"prompt set {path} is empty")
    return prompts


def _lang(x) -> str | None:
    return str(x).strip().lower() if x else None


def select(prompts: list[Prompt], *, languages: Iterable[str] | None = None,
           lengths: Iterable[str] | None = None) -> list[Prompt]:
    out = prompts
    if languages:
        want = {_lang(x) for x in languages}
        out = [p for p in out if p.language in want]
    if lengths:
        want_len = {x.strip().lower() for x in lengths}
        bad = want_len - set(LENGTHS)
        if bad:
            raise WorkloadError(f"unknown length class {sorted(bad)}; use {', '.join(LENGTHS)}")
        out = [p for p in out if p.length in want_len]
    if not out:
        raise WorkloadError("no prompt matches the --languages / --lengths selection")
    return out


def ordered(prompts: list[Prompt], count: int, seed: int) -> list[Prompt]:
    """`count` prompts: the set shuffled with `seed`, cycled (each cycle reshuffled) - same for every system."""
    rng = random.Random(seed)
    out: list[Prompt] = []
    while len(out) < count:
        cycle = list(prompts)
        rng.shuffle(cycle)
        out.extend(cycle)
    return out[:count]


def unique_tag() -> str:
    """A run's tag for `unique`: four random digits (every digit is one token in Qwen's tokenizer, so every run's
    lead-ins have the same length)."""
    return f"{random.SystemRandom().randrange(10000):04d}"


def unique(prompts: list[Prompt], tag: str, start: int = 0) -> list[Prompt]:
    """The prompts with texts no other request shares: "Take <tag>-<n>. " before each text (n = start, start+1,
    ..., five digits; the tag names the run, so a second run differs too), ids suffixed "-u<n>" (each record names
    its own text)."""
    return [replace(p, id=f"{p.id}-u{start + i}", text=f"Take {tag}-{start + i:05d}. {p.text}")
            for i, p in enumerate(prompts)]


# ------------------------------------------------------------------------------------------------ reference clip
def reference_clip(seconds: float = 3.0, sr: int = 24000, seed: int = 0) -> np.ndarray:
    """A deterministic speech-like signal (gliding harmonics, syllable envelope, a little noise), float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    f0 = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t) ** 2
    x = env * (0.25 * np.sin(phase) + 0.12 * np.sin(2 * phase + 0.3) + 0.05 * np.sin(3 * phase))
    return (x + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def data_url(data: bytes, name: str = "x.wav") -> str:
    mime = MIME.get(os.path.splitext(name)[1].lower(), "application/octet-stream")
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


# ------------------------------------------------------------------------------------------------ requests
@dataclass
class RequestSpec:
    """Everything a request carries besides its text; one per benchmark run."""
    task: str | None = None              # custom_voice | voice_design | voice_clone | None (the server's own)
    voice: str | None = None
    instructions: str | None = None
    language: str | None = None          # override every prompt's language ("auto", "english", ...)
    send_language: bool = True
    ref_audio: str | None = None         # voice clone: one clip for all prompts without their own
    ref_text: str | None = None
    x_vector_only: bool = False
    max_new_tokens: int | None = None
    ignore_eos: bool = False
    seed: int | None = None              # sampling seed sent with every request
    greedy: bool = False
    stream: str = "audio"                # audio (raw chunked pcm) | sse | off
    response_format: str = "pcm"         # pcm | wav
    served_model: str | None = None
    extra_body: dict = field(default_factory=dict)
    _clips: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.stream not in ("audio", "sse", "off"):
            raise WorkloadError("stream must be audio, sse or off")
        if self.response_format not in ("pcm", "wav"):
            raise WorkloadError("response_format must be pcm or wav (the benchmark measures s16 sample bytes)")
        if self.task is not None and self.task not in TASK_TYPE_NAMES:
            raise WorkloadError(f"task must be one of {', '.join(TASK_TYPE_NAMES)}")

    def use_model_task(self, tasks) -> None:
        """No --task given: the model's own when it has exactly one (offline: the model folder's; online: what
        /v1/models lists), with what that task needs that the run did not give: voice_clone clones --ref-audio or
        the generated clip (reference_for), voice_design gets DEFAULT_VOICE_DESCRIPTION. Left as None, a Base or
        VoiceDesign model refused every request (no reference audio, no description)."""
        known = {t for t in tasks if isinstance(t, str) and t in TASK_TYPE_NAMES} if isinstance(tasks, list) else set()
        if self.task is not None or len(known) != 1:
            return
        self.task = known.pop()
        if self.task == "voice_design" and not self.instructions:
            self.instructions = DEFAULT_VOICE_DESCRIPTION

    # -- reference audio
    def reference_for(self, prompt: Prompt) -> tuple[bytes, str, str] | None:
        """(encoded file bytes, file name, transcript) of the clip this prompt clones, None if not cloning."""
        if self.task != "voice_clone":
            return None
        path = prompt.ref_audio or self.ref_audio
        text = prompt.ref_text if prompt.ref_audio else self.ref_text
        key = path or "<generated>"
        if key not in self._clips:
            if path:
                try:
                    with open(path, "rb") as f:
                        self._clips[key] = f.read()
                except OSError as e:
                    raise WorkloadError(f"reference audio {path}: {e.strerror}") from None
            else:
                self._clips[key] = wav_bytes(reference_clip(), 24000)
        if text is None and not path:
            text = DEFAULT_REF_TEXT
        return self._clips[key], os.path.basename(path or "generated.wav"), text

    def language_of(self, prompt: Prompt) -> str | None:
        lang = self.language or prompt.language
        return lang if lang and self.send_language else None

    # -- HTTP body
    def body(self, prompt: Prompt) -> dict:
        b: dict = {"input": prompt.text, "response_format": self.response_format}
        if self.served_model:
            b["model"] = self.served_model
        if self.voice:
            b["voice"] = self.voice
        if self.instructions:
            b["instructions"] = self.instructions
        lang = self.language_of(prompt)
        if lang:
            b["language"] = "Auto" if lang == "auto" else lang.capitalize()
        if self.stream != "off":
            b["stream_format"] = self.stream
        if self.task:
            b["task_type"] = TASK_TYPE_NAMES[self.task]
        ref = self.reference_for(prompt)
        if ref is not None:
            data, name, text = ref
            b["ref_audio"] = data_url(data, name)
            if text and not self.x_vector_only:
                b["ref_text"] = text
            if self.x_vector_only:
                b["x_vector_only_mode"] = True
        if self.max_new_tokens is not None:
            b["max_new_tokens"] = self.max_new_tokens
        if self.ignore_eos:
            b["ignore_eos"] = True
        if self.seed is not None:
            b["seed"] = self.seed
        if self.greedy:
            b["greedy"] = True
        return merge_body(b, self.extra_body)

    def describe(self) -> dict:
        """The request settings as recorded in the result (no audio bytes)."""
        d = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        return d


def merge_body(body: dict, extra: dict) -> dict:
    """`extra` merged into `body`, nested dicts merged key by key; a None value removes the key."""
    out = dict(body)
    for k, v in (extra or {}).items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_body(out[k], v)
        else:
            out[k] = v
    return out


def parse_extra_body(text: str | None) -> dict:
    """`--extra-body` value: a JSON object, or @path of a file holding one."""
    if not text:
        return {}
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise WorkloadError(f"--extra-body {text}: {e.strerror}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"--extra-body is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise WorkloadError("--extra-body must be a JSON object")
    return value


def describe_prompts(prompts: list[Prompt]) -> dict:
    langs: dict[str, int] = {}
    lens: dict[str, int] = {}
    for p in prompts:
        langs[p.language or "unknown"] = langs.get(p.language or "unknown", 0) + 1
        lens[p.length or "unknown"] = lens.get(p.length or "unknown", 0) + 1
    return {"count": len(prompts), "languages": langs, "lengths": lens,
            "mean_chars": round(sum(len(p.text) for p in prompts) / max(1, len(prompts)), 1)}
