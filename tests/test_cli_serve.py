"""`voxflow serve` with a model it cannot load: one clear error and a non-zero exit, not "Uvicorn running on ..."
followed by the engine's traceback twice (the console entry point in a subprocess, as a user runs it)."""
import os
import socket
import subprocess
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path, *args, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "voxflow", "serve", *args, "--port", str(_free_port()),
                           "--device", "cpu"], capture_output=True, text=True, cwd=tmp_path, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def test_a_model_that_is_not_there_is_refused_before_the_server_starts(tmp_path):
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / "config.json").write_text("{not json")
    for model, needle in [(str(tmp_path / "nonexistent"), "does not exist"), ("piper:nope", "unknown Piper voice"),
                          (str(tmp_path), "no config.json"), (str(tmp_path / "garbled"), "cannot read its config")]:
        rc, out = _serve(tmp_path, model)
        assert rc == 2, out
        assert out.splitlines() == [out] and out.startswith("voxflow serve: error: ") and needle in out, out


def test_a_model_that_fails_to_load_is_one_error_without_traceback(tmp_path):
    """A folder that looks like a model but is not one fails in the engine process, after uvicorn started: the
    engine's error is logged once, without the traceback or a doubled "engine failed to start:", and the exit
    status says it failed."""
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text('{"model_type": "qwen3_tts"}')
    rc, out = _serve(tmp_path, str(tmp_path / "broken"))
    assert rc == 1, out
    assert "Traceback" not in out, out
    assert "engine failed to start: engine failed to start" not in out, out
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "ConfigError" in errors[0], out
