"""engine/sm_partition.py: a codec stream confined to a share of the GPU's SMs (a CUDA green context). The GPU
itself is in tests/gpu (test_gpu_codec.py); here the checks and the call into PyTorch, against stand-ins."""
import os
import types

import pytest
import torch

from voxflow.engine.sm_partition import SMPartitionError, partitioned_stream


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(
        multi_processor_count=132))
    made = []

    class Green:
        @staticmethod
        def create(*, num_sms, device_id):
            context = types.SimpleNamespace(num_sms=num_sms, device_id=device_id, Stream=lambda: ("stream", num_sms))
            made.append(context)
            return context
    monkeypatch.setattr(torch.cuda, "GreenContext", Green, raising=False)
    monkeypatch.setattr(torch.cuda.green_contexts, "SUPPORTED", True, raising=False)
    return made


def test_a_partition_is_a_green_context_stream_on_the_asked_device(h200):
    stream, context = partitioned_stream(torch.device("cuda", 1), 48)
    assert stream == ("stream", 48) and h200 == [context] and (context.num_sms, context.device_id) == (48, 1)


@pytest.mark.parametrize("num_sms", [0, -8, 132, 200])
def test_a_partition_must_leave_sms_on_both_sides(h200, num_sms):
    with pytest.raises(SMPartitionError, match="1..131 of this GPU's 132 SMs"):
        partitioned_stream(torch.device("cuda", 0), num_sms)
    assert h200 == []


def test_no_green_contexts_is_an_error_not_a_silent_fallback(h200, monkeypatch):
    monkeypatch.setattr(torch.cuda.green_contexts, "SUPPORTED", False, raising=False)
    with pytest.raises(SMPartitionError, match="no CUDA green contexts"):
        partitioned_stream(torch.device("cuda", 0), 48)


def test_a_cpu_has_no_partition():
    with pytest.raises(SMPartitionError, match="needs a CUDA device"):
        partitioned_stream(torch.device("cpu"), 48)


def test_the_engine_hands_codec_sms_to_the_codec_runner(monkeypatch):
    """EngineConfig.codec_sms reaches the Qwen3 loader, which gives it to the codec runner (a CPU runner has no
    stream to partition and ignores it)."""
    import voxflow.models.qwen3_tts.engine_loader as loader
    from voxflow.engine.config import EngineConfig
    from voxflow.engine.engine import EngineCore
    seen = []
    real = loader.Qwen3CodecRunner

    def runner(*args, **kwargs):
        seen.append(kwargs.get("stream_sms"))
        return real(*args, **kwargs)
    monkeypatch.setattr(loader, "Qwen3CodecRunner", runner)
    core = EngineCore.from_config(EngineConfig(model=os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice"),
                                               max_num_seqs=2, num_kv_blocks=16, codec_sms=48))
    assert seen == [48] and core.codec.stream is None


def test_green_contexts_without_streams_are_an_error(h200, monkeypatch):
    monkeypatch.setattr(torch.cuda.GreenContext, "create", staticmethod(lambda **kw: object()))
    with pytest.raises(SMPartitionError, match="make no streams"):
        partitioned_stream(torch.device("cuda", 0), 48)
