"""GPU check: the serving loop never makes the host wait for the GPU behind its back.

A blocking host<->device copy (`torch.tensor(ids, device="cuda")`, `.item()`, `.cpu()`, boolean-mask indexing ...)
synchronises the stream: the host then waits for the decode step in flight (5-10 ms) and the GPU runs dry while the
host catches up, which showed as first-packet latency under load. The only waits the engine means to make are on
CUDA events (a step's flags one step late, a codec chunk's PCM), which PyTorch's sync debug mode does not flag; so
requests are added between steps and run to completion with the mode set to raise on any other synchronisation.
"""
import os
import traceback
import warnings

import numpy as np
import pytest
import torch

from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.request import AudioChunk, SamplingOptions, SpeechRequest, StreamingOptions

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
TINY = os.environ.get("VOXFLOW_TINY_DIR", "")
TEXTS = ["Hello world.", "The quick brown fox jumps over the lazy dog.", "Speak happily.", "This is a tiny test."]


def serve_round(core: EngineCore, tag: str, voice: dict) -> dict[str, int]:
    """Two requests at once, two more joining while they run (prefill beside running decodes); streamed chunks."""
    def add(i: int, text: str) -> None:
        core.add_request(SpeechRequest(text=text, request_id=f"{tag}{i}", streaming=StreamingOptions(stream=True),
                                       sampling=SamplingOptions(max_new_tokens=40, ignore_eos=True), **voice))
    add(0, TEXTS[0])
    add(1, TEXTS[1])
    chunks: dict[str, int] = {}
    steps = 0
    while core.has_work():
        for out in core.step():
            if isinstance(out, AudioChunk):
                chunks[out.request_id] = chunks.get(out.request_id, 0) + 1
        steps += 1
        if steps in (3, 7):
            add(steps, TEXTS[2 if steps == 3 else 3])
    return chunks


@pytest.mark.parametrize("model", ["custom_voice", "base"])
def test_gpu_serving_loop_has_no_hidden_synchronisation(monkeypatch, model):
    """custom_voice: a preset speaker; base: a stored voice-clone voice (ICL: x-vector and reference frames), made
    before the measured round (computing a voice from a clip is GPU work that reads its results back)."""
    core = EngineCore.from_config(EngineConfig(model=os.path.join(TINY, model), device="cuda",
                                               dtype="bfloat16", max_num_seqs=8, num_kv_blocks=512))
    if model == "base":
        t = np.linspace(0.0, 1.0, core.sample_rate, dtype=np.float32)
        clip = (0.1 * np.sin(2 * np.pi * 220.0 * t)).astype("<f4").tobytes()
        voice = {"voice_clone_prompt": core.create_voice(clip, "A short reference clip.", False)}
    else:
        voice = {"voice": "vivian"}
    serve_round(core, "warm", voice)   # first use: lazy initialisation and compilation may synchronise
    # "warn" rather than "error": every synchronising call site is collected (with where it came from) in one run.
    sites = []

    def record(message, category, filename, lineno, file=None, line=None):
        if "called a synchronizing CUDA operation" in str(message):
            ours = [f"{f.filename.split('voxflow/')[-1]}:{f.lineno}" for f in traceback.extract_stack()[:-1]
                    if "/voxflow/" in f.filename and "/tests/" not in f.filename]
            sites.append(" <- ".join(reversed(ours[-4:])))
    monkeypatch.setattr(warnings, "showwarning", record)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            chunks = serve_round(core, "run", voice)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert not sites, "synchronising calls on the serving path:\n" + "\n".join(sorted(set(sites)))
    assert sorted(chunks) == ["run0", "run1", "run3", "run7"]
    assert all(n >= 2 for n in chunks.values()), chunks       # streamed: several chunks each
