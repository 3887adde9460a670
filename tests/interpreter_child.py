"""Running a test module again under Triton's interpreter, in a fresh pytest process (shared by the kernel tests).

TRITON_INTERPRET must be set before `triton` is first imported: Triton's own library functions (tl.sum, ...) are
@triton.jit functions decorated at import time, and imported without the variable they cannot be called by the
interpreter. By the time a kernel test module is collected, other modules (and voxflow.kernels) have imported
triton, and setting the variable in-process would also leak interpreted kernels into GPU tests of the same
session. So each kernel test module defines its checks only when `in_child(FLAG)`, and otherwise one launcher
test that calls `run_child(__file__, FLAG)`: every test of the child run must pass, none skipped or deselected.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_child(flag: str) -> bool:
    return os.environ.get(flag) == "1" and os.environ.get("TRITON_INTERPRET") == "1"


def run_child(test_file: str, flag: str, timeout: float = 600) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", flag: "1"}
    cmd = [sys.executable, "-m", "pytest", os.path.abspath(test_file), "-o", "addopts=", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    report = (proc.stdout + proc.stderr)[-8000:]
    assert proc.returncode == 0, f"interpreted kernel tests failed (rc {proc.returncode}):\n{report}"
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.match(r"\d+ passed in ", summary), report       # all ran: nothing skipped or deselected
