"""`voxflow synthesize` end to end on the tiny checkpoints: valid WAV, codes equal to the official ones, and
one-line errors with exit status 2 for bad input."""
import os
import subprocess
import sys
import wave

import numpy as np
import pytest
import torch

from voxflow.cli import main

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")
GOLDEN = os.path.join(os.path.dirname(__file__), "fixtures", "golden")


def _golden(name):
    path = os.path.join(GOLDEN, name + ".pt")
    if not os.path.exists(path):
        pytest.skip(f"golden fixture {name}.pt not present (run tools/oracle/dump_goldens.py)")
    return torch.load(path, weights_only=False)


def test_synthesize_writes_wav_and_codes_matching_official(tmp_path):
    g = _golden("cv_nonstream")
    out, codes_path = tmp_path / "hello.wav", tmp_path / "codes.npy"
    rc = main(["synthesize", os.path.join(TINY, "custom_voice"), "--text", "Hello world.", "--voice", "vivian",
               "--language", "English", "--greedy", "--max-new-tokens", str(g["meta"]["max_new_tokens"]),
               "--output", str(out), "--save-codes", str(codes_path)])
    assert rc == 0
    codes = np.load(codes_path)
    assert codes.dtype == np.int64 and codes.ndim == 2 and codes.shape[1] == 16
    np.testing.assert_array_equal(codes, g["codes"][0].numpy())
    with wave.open(str(out)) as w:
        assert w.getframerate() == 24000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        assert w.getnframes() == codes.shape[0] * 1920
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768
    assert np.abs(pcm - g["wav"][0].numpy()).max() < 2e-4   # 16-bit quantisation of the official waveform


def _run_cli(args, tmp_path):
    """Run the real console entry point in a subprocess: exit status and stderr as a user sees them."""
    proc = subprocess.run([sys.executable, "-m", "voxflow", *args], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    return proc.returncode, proc.stderr.strip()


@pytest.mark.parametrize("args, message", [
    (["custom_voice", "--text", "Hi.", "--voice", "nobody"], "nobody"),
    (["custom_voice", "--text", "   ", "--voice", "vivian"], "empty"),
    (["custom_voice", "--text", "Hi.", "--voice", "vivian", "--language", "klingon"], "klingon"),
    (["base", "--text", "Hi.", "--ref-audio", "missing.wav", "--ref-text", "x"], "missing.wav"),
    (["base", "--text", "Hi.", "--ref-audio", "ref.wav"], "ref"),          # ICL without --ref-text
    (["does/not/exist/model", "--text", "Hi."], "does/not/exist/model"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    sr = 24000
    t = np.arange(sr) / sr
    from voxflow.audio.io import write_wav
    write_wav(str(tmp_path / "ref.wav"), (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), sr)
    model = args[0] if "/" in args[0] else os.path.join(TINY, args[0])
    monkeypatch.chdir(tmp_path)
    rc = main(["synthesize", model, *args[1:], "--max-new-tokens", "4", "-o", "x.wav"])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert message.lower() in err.lower()
    assert not (tmp_path / "x.wav").exists()


def test_console_entry_point_reports_bad_input_with_status_2(tmp_path):
    """The real `python -m voxflow` process, as a user runs it: one line on stderr, exit status 2."""
    rc, err = _run_cli(["synthesize", os.path.join(TINY, "custom_voice"), "--text", "Hi.", "--voice", "nobody",
                        "-o", "x.wav"], tmp_path)
    assert rc == 2 and len(err.splitlines()) == 1 and "nobody" in err


def test_input_file_batch_equals_one_by_one(tmp_path):
    """Two dozen lines through the batched engine give the files the eager loop writes one at a time."""
    lines = [["Hello world.", "The quick brown fox.", "Speak happily.", "This is a tiny test."][i % 4] + " " * (i % 3)
             for i in range(24)]
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n\n")
    model = os.path.join(TINY, "custom_voice")
    common = ["--voice", "ryan", "--greedy", "--max-new-tokens", "9"]
    rc = main(["synthesize", model, "--input-file", str(tmp_path / "lines.txt"), "--output-dir",
               str(tmp_path / "out"), "--max-num-seqs", "8", *common])
    assert rc == 0
    files = sorted(os.listdir(tmp_path / "out"))
    assert files == [f"{i:04d}.wav" for i in range(1, 25)]
    for i in (0, 1, 2, 3, 13, 23):          # one-by-one reference for a sample of lines (each text is covered)
        single = tmp_path / f"single{i}.wav"
        assert main(["synthesize", model, "--text", lines[i].strip(), *common, "-o", str(single)]) == 0
        with wave.open(str(single)) as a, wave.open(str(tmp_path / "out" / files[i])) as b:
            pa = np.frombuffer(a.readframes(a.getnframes()), np.int16).astype(int)
            pb = np.frombuffer(b.readframes(b.getnframes()), np.int16).astype(int)
        assert pa.shape == pb.shape == (8 * 1920,)
        assert np.abs(pa - pb).max() <= 1                    # same audio up to one 16-bit step of rounding


def test_input_file_errors(tmp_path):
    rc, err = _run_cli(["synthesize", os.path.join(TINY, "custom_voice"), "--input-file", "nope.txt",
                        "--output-dir", "out"], tmp_path)
    assert rc == 2 and "nope.txt" in err and len(err.splitlines()) == 1
