"""Loading Qwen3-TTS: hub ids offline, broken checkpoints, caller-chosen dtype; seeded eager sampling."""
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from voxflow.models.qwen3_tts.generate import SynthesisRequest, synthesize
from voxflow.models.qwen3_tts.model import Qwen3TTS
from voxflow.models.qwen3_tts.weights import WeightLoadError

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")


def test_unreachable_hub_id_names_the_model():
    code = ("from voxflow.models.hub import resolve_model_dir, ModelNotFoundError\n"
            "try:\n    resolve_model_dir('voxflow-tests/no-such-model')\n"
            "except ModelNotFoundError as e:\n    print('ERR', e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": "/nonexistent-hf-home"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert out.startswith("ERR") and "voxflow-tests/no-such-model" in out and "could not be reached" in out


def _broken_copy(tmp_path, edit):
    dst = tmp_path / "ckpt"
    shutil.copytree(os.path.join(TINY, "custom_voice"), dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


def test_missing_key_is_named(tmp_path):
    path = _broken_copy(tmp_path, lambda t: t.pop("talker.codec_head.weight"))
    with pytest.raises(WeightLoadError, match="missing key.*talker.codec_head.weight"):
        Qwen3TTS.from_pretrained(path)


def test_misshaped_and_unexpected_keys_are_named(tmp_path):
    def edit(t):
        t["talker.model.norm.weight"] = torch.ones(3)
        t["talker.model.extra.weight"] = torch.ones(2)
    path = _broken_copy(tmp_path, edit)
    with pytest.raises(WeightLoadError) as e:
        Qwen3TTS.from_pretrained(path)
    assert "talker.model.norm.weight: checkpoint (3,)" in str(e.value)
    assert "talker.model.extra.weight" in str(e.value)


def test_dtype_is_the_callers_choice_and_the_codec_stays_fp32():
    model = Qwen3TTS.from_pretrained(os.path.join(TINY, "custom_voice"), dtype=torch.bfloat16)
    assert model.talker.codec_head.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.codec_decoder.parameters())
    result = synthesize(model, SynthesisRequest(text="Hello world.", speaker="vivian", greedy=True, max_new_tokens=4))
    assert result.codes.shape == (3, 16) and result.wav.shape == (3 * 1920,)


def test_seeded_sampling_is_reproducible():
    model = Qwen3TTS.from_pretrained(os.path.join(TINY, "custom_voice"))

    def run(seed):
        return synthesize(model, SynthesisRequest(text="Hello world.", speaker="ryan", seed=seed,
                                                  max_new_tokens=12)).codes
    a, b, c = run(3), run(3), run(4)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


class _Probe(torch.nn.Module):
    """Records the default dtype it was constructed under; an fp32 RoPE-like buffer built with an explicit dtype."""
    def __init__(self, cfg):
        super().__init__()
        self.built_under = torch.get_default_dtype()
        self.lin = torch.nn.Linear(4, 3)
        self.emb = torch.nn.Embedding(5, 4)
        self.register_buffer("inv_freq", torch.arange(2, dtype=torch.float32), persistent=False)
        if cfg == "default-dtype buffer":
            self.register_buffer("bad", torch.ones(2), persistent=False)


def test_build_makes_parameters_in_the_target_dtype_and_keeps_buffers_fp32():
    from voxflow.models.qwen3_tts.model import _build
    m = _build(_Probe, None, torch.device("cpu"), torch.bfloat16)
    # born in bf16 (no fp32 copy first, whose freed blocks a GPU's allocator would keep), default dtype restored
    assert m.built_under == torch.bfloat16 and torch.get_default_dtype() == torch.float32
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16} and m.inv_freq.dtype == torch.float32
    assert not any(p.requires_grad for p in m.parameters())
    with pytest.raises(TypeError, match="buffer bad was built in torch.bfloat16"):
        _build(_Probe, "default-dtype buffer", torch.device("cpu"), torch.bfloat16)
    assert torch.get_default_dtype() == torch.float32


def test_load_into_copies_into_the_modules_own_tensors():
    from voxflow.models.qwen3_tts.weights import load_into
    m = _Probe(None)
    m.second = torch.nn.Linear(4, 3)
    m.second.weight = m.lin.weight          # one tensor under two names
    where = {n: p.data_ptr() for n, p in m.named_parameters()}
    values = {k: torch.randn(v.shape, dtype=torch.float64) for k, v in m.state_dict().items()}
    load_into(m, values, what="probe")
    assert m.lin.weight.data_ptr() == where["lin.weight"] and m.emb.weight.data_ptr() == where["emb.weight"]
    assert m.lin.weight.dtype == torch.float32 and not m.lin.weight.requires_grad
    # each name keeps its own value: the shared tensor's second name got a copy of its own
    assert torch.equal(m.lin.weight, values["lin.weight"].float())
    assert torch.equal(m.second.weight, values["second.weight"].float())
    assert m.second.weight.data_ptr() != m.lin.weight.data_ptr()


@pytest.mark.parametrize("device, on_host, passed", [("cuda", True, True), ("cuda", False, False),
                                                     ("cpu", True, False)])
def test_the_engine_keeps_the_text_table_in_host_memory_on_a_gpu_by_default(monkeypatch, device, on_host, passed):
    """EngineConfig.text_embedding_on_host (default on) reaches the model's loader on a GPU only (on a CPU the table
    is in host memory anyway); the loader then loads the table there (model.py, tests/test_text_rows.py)."""
    import voxflow.engine.engine_startup as engine_startup
    import voxflow.models.registry as registry
    from voxflow.engine.config import EngineConfig
    from voxflow.engine.engine import EngineCore
    assert EngineConfig(model="m").text_embedding_on_host is True
    seen = {}

    class Stop(Exception):
        pass

    def load(*args, **options):
        seen.update(options)
        raise Stop
    monkeypatch.setattr(engine_startup, "outside_allocator_bytes", lambda d: 0)    # no GPU to ask here
    monkeypatch.setattr(registry, "load_for_engine", load)
    with pytest.raises(Stop):
        EngineCore.from_config(EngineConfig(model="m", device=device, text_embedding_on_host=on_host,
                                            shrink_stack_after_load=False))
    assert seen.get("text_embedding_on_host", False) is passed


def test_cast_parameters_casts_fused_groups_whole_and_every_other_parameter():
    """The fused gate|up is cast as one tensor and its Linears stay views of it (cast one by one, the old fused
    weight stayed alive beside split copies); the other parameters are cast, buffers are not."""
    from voxflow.layers.cast import cast_parameters
    from voxflow.layers.fused_linear import still_fused
    from voxflow.layers.mlp import SwiGLU
    m = _Probe(None)
    m.mlp = SwiGLU(4, 6)
    want = {n: p.detach().clone() for n, p in m.named_parameters()}
    cast_parameters(m, torch.float16)
    assert {p.dtype for p in m.parameters()} == {torch.float16} and m.inv_freq.dtype == torch.float32
    assert all(torch.equal(p, want[n].half()) for n, p in m.named_parameters())
    assert m.mlp._gate_up.dtype == torch.float16 and still_fused(m.mlp._gate_up, [m.mlp.gate_proj, m.mlp.up_proj])
