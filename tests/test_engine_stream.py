"""talker_high_priority (engine_stream.py): every EngineCore entry point that queues GPU work runs under the
engine's stream context. CPU-only machines have no CUDA streams, so the stream is a sentinel and the context a
recorder; the GPU side (same codes on a high-priority stream) is tests/gpu/test_gpu_engine.py."""
from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from voxflow.engine import engine as engine_module
from voxflow.engine import engine_stream
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.request import SamplingOptions, SpeechRequest

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")


def test_no_stream_on_a_cpu_or_when_off():
    assert engine_stream.talker_stream(torch.device("cpu"), True) is None
    assert engine_stream.talker_stream(torch.device("cuda"), False) is None      # off: never touches CUDA


def test_engine_entry_points_run_on_the_engine_stream(monkeypatch):
    entered: list[str] = []
    sentinel = object()

    @contextlib.contextmanager
    def recording(stream):
        assert stream is sentinel
        entered.append(current[0])
        yield
    monkeypatch.setattr(torch.cuda, "stream", recording)
    monkeypatch.setattr(engine_module, "talker_stream", lambda device, high: sentinel if high else None)
    current = ["constructor"]
    core = EngineCore.from_config(EngineConfig(model=os.path.join(TINY, "custom_voice"), max_num_seqs=2,
                                               num_kv_blocks=64, block_size=16, talker_high_priority=True))
    assert core._stream is sentinel
    current[0] = "add_request"
    core.add_request(SpeechRequest(text="Hello.", voice="vivian", request_id="a",
                                   sampling=SamplingOptions(greedy=True, max_new_tokens=3)))
    current[0] = "step"
    while core.has_work():
        core.step()
    current[0] = "create_voice"
    try:
        core.create_voice(np.zeros(100, dtype="<f4").tobytes(), None, True)
    except ValueError:
        pass                                               # a CustomVoice model has no voice cloning: still entered
    current[0] = "abort"
    core.abort("gone")
    assert {"constructor", "add_request", "step", "create_voice", "abort"} <= set(entered)
