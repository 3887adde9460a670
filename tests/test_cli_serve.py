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


def _children(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc: the engine process `voxflow serve` spawns)."""
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(k) for k in f.read().split()]
    return kids


def test_the_server_exits_when_its_engine_process_dies(tmp_path):
    """An engine process that dies (here SIGKILL, as the kernel's out-of-memory killer would) stops the server with
    exit status 1 and one error line saying why, so a supervisor restarts it; it used to stay up answering 503."""
    import signal
    import time
    import urllib.request
    port = _free_port()
    model = os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice")
    proc = subprocess.Popen([sys.executable, "-m", "voxflow", "serve", model, "--port", str(port), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError("the server never became ready")
        engines = _children(proc.pid)
        assert engines, "no engine process"
        for pid in engines:
            os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out
    assert "the engine process died" in out and "stopping the server" in out, out


def test_a_max_new_tokens_limit_below_two_is_refused_before_the_server_starts(tmp_path):
    model = os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice")
    rc, out = _serve(tmp_path, model, "--max-new-tokens-limit", "1")
    assert rc == 2 and out == "voxflow serve: error: --max-new-tokens-limit must be >= 2", out


def test_an_http_parser_or_event_loop_package_that_is_missing_is_refused_before_the_server_starts(monkeypatch,
                                                                                                    capsys):
    """--http httptools / --loop uvloop without the package: one clear error and exit 2, before anything loads
    (uvicorn would fail later with an import traceback)."""
    import argparse
    import importlib.util

    from voxflow.api import serve
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("httptools", "uvloop") else real(name, *a))
    model = os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice")
    for option, package in (("--http", "httptools"), ("--loop", "uvloop")):
        p = argparse.ArgumentParser()
        serve.add_serve_arguments(p)
        args = p.parse_args([model, "--device", "cpu", option, package])
        assert serve.run_serve(args) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"voxflow serve: error: {option} {package} needs the {package} package (pip install {package})"
