"""Test-session setup: tiny Qwen3-TTS checkpoints, regenerated deterministically (never committed).

They are written once per session into a temporary folder (or reused from VOXFLOW_TINY_DIR when that points at
a folder that already holds them) and the folder is exported as VOXFLOW_TINY_DIR for every test module.
Layout: $VOXFLOW_TINY_DIR/{custom_voice, voice_design, base, custom_voice_1b7} — the checkpoints the golden
fixtures were dumped from (voxflow/tools/tiny_set.py, tools/oracle/dump_goldens.py).
"""
import os
import random
import shutil
import sys
import tempfile

import numpy as np
import pytest
import torch

# Shared test helpers (float_compare.py, interpreter_child.py) importable from tests/gpu as well.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# At most two torch threads a process, and the cores shared among pytest-xdist's workers (CI: two cores, two
# workers, one thread each: a second thread would only contend with the other worker).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads(), (os.cpu_count() or 1) // _workers)))
_made_here = None

if os.environ.get("TRITON_INTERPRET") == "1":         # an interpreter child (tests/interpreter_child.py)
    import interpreter_speedups
    interpreter_speedups.install()


def pytest_configure(config):
    global _made_here
    from voxflow.tools.tiny_set import has_tiny_set, write_tiny_set
    root = os.environ.get("VOXFLOW_TINY_DIR")
    if has_tiny_set(root):
        return
    if not root:
        root = _made_here = tempfile.mkdtemp(prefix="voxflow-tiny-")
    write_tiny_set(root)
    os.environ["VOXFLOW_TINY_DIR"] = root


def pytest_unconfigure(config):
    if _made_here:
        shutil.rmtree(_made_here, ignore_errors=True)


@pytest.fixture(autouse=True)
def _seeded_global_rngs():
    """Every test starts from the same global random state, whichever tests ran before it in its process (with
    pytest-xdist that depends on how the tests were shared out): a test drawing unseeded inputs sees the same ones
    on every run."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
