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


def _one_line_error(capsys, rc, *needles):
    """rc 2 with one stderr line holding every needle (what the README promises for bad input)."""
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_max_new_tokens_below_2_is_refused(tmp_path, monkeypatch, capsys):
    """N sampled tokens give N - 1 frames: --max-new-tokens 1 used to 'succeed' with an empty WAV (RTF 6149130)."""
    monkeypatch.chdir(tmp_path)
    model = os.path.join(TINY, "custom_voice")
    (tmp_path / "lines.txt").write_text("Hello.\n")
    for extra in (["--text", "Hi.", "-o", str(tmp_path / "x.wav")],
                  ["--input-file", str(tmp_path / "lines.txt"), "--output-dir", str(tmp_path / "out")]):
        rc = main(["synthesize", model, "--voice", "vivian", "--max-new-tokens", "1", *extra])
        _one_line_error(capsys, rc, "max_new_tokens must be >= 2: N tokens give N - 1 frames of 80 ms")
    assert not (tmp_path / "x.wav").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["-o", "--save-codes"])
@pytest.mark.parametrize("target, message", [("missing/x.out", "does not exist"), (".", "is a folder")])
def test_unwritable_output_fails_before_synthesis(tmp_path, monkeypatch, capsys, flag, target, message):
    """Checked up front: the write used to fail with a traceback after the whole synthesis."""
    import voxflow.models.qwen3_tts.generate as generate
    monkeypatch.chdir(tmp_path)

    def no_synthesis(*a, **k):
        raise AssertionError("synthesized although the output cannot be written")
    monkeypatch.setattr(generate, "synthesize", no_synthesis)
    rc = main(["synthesize", os.path.join(TINY, "custom_voice"), "--text", "Hi.", "--voice", "vivian",
               "--max-new-tokens", "3", flag, str(tmp_path / target)])
    _one_line_error(capsys, rc, flag, message)


def test_single_mode_refuses_output_dir(tmp_path, monkeypatch, capsys):
    """--output-dir is for --input-file: with --text it used to be ignored (the WAV went to ./out.wav)."""
    monkeypatch.chdir(tmp_path)
    rc = main(["synthesize", os.path.join(TINY, "custom_voice"), "--text", "Hi.", "--voice", "vivian",
               "--max-new-tokens", "3", "--output-dir", str(tmp_path / "out")])
    _one_line_error(capsys, rc, "--output-dir")


def test_input_file_that_is_not_utf8_is_one_line(tmp_path, capsys):
    (tmp_path / "lines.txt").write_bytes(b"Hello \xff\xfe there.\n")
    rc = main(["synthesize", os.path.join(TINY, "custom_voice"), "--input-file", str(tmp_path / "lines.txt"),
               "--output-dir", str(tmp_path / "out"), "--voice", "vivian", "--max-new-tokens", "3"])
    _one_line_error(capsys, rc, "UTF-8")


def _torch_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("command", [
    ["synthesize", "{tiny}", "--text", "Hi.", "--voice", "vivian", "-o", "x.wav"],
    ["synthesize", "{tiny}", "--input-file", "lines.txt", "--output-dir", "out"],
    ["serve", "{tiny}", "--port", "1"],                  # refused before uvicorn binds anything
    ["bench", "--model", "{tiny}", "--num-prompts", "1", "--no-plots", "-o", "b.json"],
])
def test_cuda_device_on_a_torch_without_cuda_is_one_line(tmp_path, monkeypatch, capsys, command):
    """Not torch's AssertionError "Torch not compiled with CUDA enabled" as a traceback (after loading the model)."""
    _torch_without_cuda(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lines.txt").write_text("Hello.\n")
    args = [a.format(tiny=os.path.join(TINY, "custom_voice")) for a in command]
    rc = main([*args, "--device", "cuda"])
    _one_line_error(capsys, rc, "CUDA is not available in this torch build")
    assert not (tmp_path / "x.wav").exists() and not (tmp_path / "b.json").exists()


def test_unknown_device_is_one_line(tmp_path, capsys):
    rc = main(["synthesize", os.path.join(TINY, "custom_voice"), "--text", "Hi.", "--voice", "vivian",
               "--device", "foo", "-o", str(tmp_path / "x.wav")])
    _one_line_error(capsys, rc, "'foo'")


def test_batch_numbers_files_and_errors_by_file_line(tmp_path, capsys):
    """Blank lines are skipped but keep their numbers: line 4's WAV is 0004.wav and line 3's error says line 3
    (it used to say the line's rank among the non-blank ones, and the files were renumbered)."""
    too_long = "word " * 11000                     # over the engine's max_model_len: refused, alone
    (tmp_path / "lines.txt").write_text(f"Hello there.\n\n{too_long}\nGood bye.\n")
    rc = main(["synthesize", os.path.join(TINY, "custom_voice"), "--input-file", str(tmp_path / "lines.txt"),
               "--output-dir", str(tmp_path / "out"), "--voice", "vivian", "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    assert rc == 2
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "error: line 3: " in errors[0], err
    assert sorted(os.listdir(tmp_path / "out")) == ["0001.wav", "0004.wav"]


@pytest.mark.parametrize("voice, message", [("nobody", "nobody"), (None, "speaker")])
def test_batch_reports_a_bad_setting_once(tmp_path, capsys, voice, message):
    """A bad or missing --voice is wrong for every line alike: one error line, not one per line."""
    (tmp_path / "lines.txt").write_text("One.\nTwo.\n\nThree.\n")
    rc = main(["synthesize", os.path.join(TINY, "custom_voice"), "--input-file", str(tmp_path / "lines.txt"),
               "--output-dir", str(tmp_path / "out"), "--max-new-tokens", "3",
               *(["--voice", voice] if voice else [])])
    _one_line_error(capsys, rc, message)
    assert not list((tmp_path / "out").glob("*.wav"))


@pytest.mark.parametrize("extra, message", [
    (["-o", "x.wav"], "-o"),
    (["--save-codes", "codes.npy"], "--save-codes"),
])
def test_batch_refuses_single_file_outputs(tmp_path, capsys, extra, message):
    """-o (and a --save-codes PATH) name one file: with --input-file they used to be ignored silently."""
    (tmp_path / "lines.txt").write_text("One.\n")
    rc = main(["synthesize", os.path.join(TINY, "custom_voice"), "--input-file", str(tmp_path / "lines.txt"),
               "--output-dir", str(tmp_path / "out"), "--voice", "vivian", "--max-new-tokens", "3", *extra])
    _one_line_error(capsys, rc, message)


def test_batch_save_codes_writes_each_lines_codes(tmp_path):
    """--save-codes in batch mode: NNNN.npy beside NNNN.wav, the codes the one-by-one run saves for that line."""
    lines = ["Hello world.", "", "The quick brown fox."]
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n")
    model = os.path.join(TINY, "custom_voice")
    common = ["--voice", "ryan", "--greedy", "--max-new-tokens", "6"]
    rc = main(["synthesize", model, "--input-file", str(tmp_path / "lines.txt"), "--output-dir",
               str(tmp_path / "out"), "--save-codes", *common])
    assert rc == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["0001.npy", "0001.wav", "0003.npy", "0003.wav"]
    for n in (1, 3):
        single = tmp_path / f"single{n}.wav"
        assert main(["synthesize", model, "--text", lines[n - 1], *common, "-o", str(single), "--save-codes"]) == 0
        expected = np.load(tmp_path / f"single{n}.npy")           # bare --save-codes: beside the WAV
        got = np.load(tmp_path / "out" / f"{n:04d}.npy")
        assert got.dtype == np.int64 and got.shape == expected.shape == (5, 16)
        np.testing.assert_array_equal(got, expected)
        with wave.open(str(tmp_path / "out" / f"{n:04d}.wav")) as w:
            assert w.getnframes() == got.shape[0] * 1920


def _subcommands():
    import argparse

    from voxflow.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = dict(sub.choices)
    bench_sub = next(a for a in out["bench"]._actions if isinstance(a, argparse._SubParsersAction))
    out["bench compare"] = bench_sub.choices["compare"]
    return out


def test_every_option_has_help_and_defaults_are_shown():
    import argparse
    commands = _subcommands()
    assert set(commands) == {"synthesize", "serve", "bench", "bench compare", "make-tiny-checkpoint"}
    for name, parser in commands.items():
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"voxflow {name} {'/'.join(action.option_strings) or action.dest}: no help"
    helps = {name: " ".join(p.format_help().split()) for name, p in commands.items()}
    assert "--port PORT TCP port to listen on (default: 8000)" in helps["serve"]
    assert "(default: 256)" in helps["serve"] and "(default: 30.0)" in helps["serve"]
    assert "--max-num-seqs MAX_NUM_SEQS batch mode: requests decoded at once (default: 32)" in helps["synthesize"]
    assert "(default: /v1/audio/speech)" in helps["bench"] and "(default: 600.0)" in helps["bench"]
    assert "(default: 1234)" in helps["make-tiny-checkpoint"]
    assert "(default: None)" not in " ".join(helps.values())       # nothing to show is not shown
    assert "--input-file" in commands["synthesize"].description    # batch mode is part of what it does
    default_voice = next(a for a in commands["serve"]._actions if "--default-voice" in a.option_strings)
    assert "Base model" in default_voice.help and "no voice" in default_voice.help


def test_version(capsys):
    from importlib.metadata import version
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"voxflow {version('voxflow')}"


def test_serve_trace_requests_reaches_the_server_settings(tmp_path):
    """`voxflow serve --trace-requests PATH` -> ServerSettings.trace_requests (the app writes request_trace.py's
    lines there); unset by default."""
    from voxflow.api.serve import settings_from_args
    serve = _subcommands()["serve"]
    path = str(tmp_path / "requests.jsonl")
    assert settings_from_args(serve.parse_args(["m", "--trace-requests", path])).trace_requests == path
    assert settings_from_args(serve.parse_args(["m"])).trace_requests is None
