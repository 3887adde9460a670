"""engine/sm_partition.py: a codec stream confined to a share of the GPU's SMs (a CUDA green context). The GPU
itself is in tests/gpu (test_gpu_codec.py); here the checks and the call into PyTorch, against stand-ins."""
import os
import types

import pytest
import torch

from voxflow.engine.sm_partition import SMPartitionError, auto_sms, check_setting, partitioned_stream, stream_for
from voxflow.models.qwen3_tts.codec_runner import Qwen3CodecRunner
from voxflow.tools.codec_snr import load_codec_decoder


@pytest.fixture
def h200(monkeypatch):
    from voxflow.engine import sm_partition
    monkeypatch.setattr(sm_partition, "_LIVE_CONTEXTS", [])          # the stand-ins stay out of the real list
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


def test_a_green_context_outlives_its_stream_and_owner(h200, monkeypatch):
    """A tensor freed after its partition's context was destroyed aborts the process (the allocator records an event
    on the dead context's stream), so the contexts stay alive after every caller has dropped them."""
    import gc
    import weakref
    from voxflow.engine import sm_partition

    class Context:                      # a stand-in that can be weakly referenced, unlike SimpleNamespace
        def Stream(self):
            return "stream"
    monkeypatch.setattr(torch.cuda.GreenContext, "create", staticmethod(lambda **kw: Context()))
    stream, context = partitioned_stream(torch.device("cuda", 0), 48)
    alive = weakref.ref(context)
    del stream, context
    gc.collect()
    assert alive() is not None and sm_partition._LIVE_CONTEXTS == [alive()]


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
    model = os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice")
    core = EngineCore.from_config(EngineConfig(model=model, max_num_seqs=2, num_kv_blocks=16, codec_sms=48))
    assert seen == [48] and core.codec.stream is None and "codec_sms" not in core.startup
    EngineCore.from_config(EngineConfig(model=model, max_num_seqs=2, num_kv_blocks=16))
    assert seen == [48, "auto"]                      # the default


def test_green_contexts_without_streams_are_an_error(h200, monkeypatch):
    monkeypatch.setattr(torch.cuda.GreenContext, "create", staticmethod(lambda **kw: object()))
    with pytest.raises(SMPartitionError, match="make no streams"):
        partitioned_stream(torch.device("cuda", 0), 48)


@pytest.mark.parametrize("total, expected", [(132, 64), (114, 56), (108, 48), (100, 48), (99, None), (16, None)])
def test_auto_takes_half_the_sms_in_whole_partition_steps(total, expected):
    assert auto_sms(total) == expected


@pytest.fixture
def plain_streams(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: ("plain", device))


@pytest.mark.parametrize("index", [0, 1])
def test_auto_is_half_an_h200_on_the_asked_device(h200, plain_streams, index):
    stream, context, sms = stream_for(torch.device("cuda", index), "auto")
    assert (stream, sms) == (("stream", 64), 64) and h200 == [context] and context.device_id == index


def refuse(**kw):
    raise RuntimeError("CUDA driver error: not supported")


@pytest.mark.parametrize("why", ["no green contexts", "the driver refuses"])
def test_auto_falls_back_to_the_whole_gpu_with_a_warning(h200, plain_streams, monkeypatch, caplog, why):
    """A default must not stop a server: where no partition can be made, "auto" is the whole GPU, and says so."""
    if why == "no green contexts":
        monkeypatch.setattr(torch.cuda.green_contexts, "SUPPORTED", False, raising=False)
    else:
        monkeypatch.setattr(torch.cuda.GreenContext, "create", staticmethod(refuse))
    device = torch.device("cuda", 0)
    with caplog.at_level("WARNING", logger="voxflow.engine.sm_partition"):
        assert stream_for(device, "auto") == (("plain", device), None, None)
    assert "no SM partition, the whole GPU" in caplog.text and h200 == []


def test_auto_leaves_a_small_gpu_whole_without_a_warning(h200, plain_streams, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(
        multi_processor_count=58))
    device = torch.device("cuda", 0)
    with caplog.at_level("WARNING", logger="voxflow.engine.sm_partition"):
        assert stream_for(device, "auto") == (("plain", device), None, None)
    assert caplog.text == "" and h200 == []


def test_auto_does_not_swallow_running_out_of_memory(h200, plain_streams, monkeypatch):
    def oom(**kw):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(torch.cuda.GreenContext, "create", staticmethod(oom))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        stream_for(torch.device("cuda", 0), "auto")


def test_an_asked_count_is_not_silently_dropped(h200, plain_streams, monkeypatch):
    monkeypatch.setattr(torch.cuda.GreenContext, "create", staticmethod(refuse))
    with pytest.raises(RuntimeError, match="driver error"):
        stream_for(torch.device("cuda", 0), 64)
    monkeypatch.setattr(torch.cuda.green_contexts, "SUPPORTED", False, raising=False)
    with pytest.raises(SMPartitionError):
        stream_for(torch.device("cuda", 0), 64)
    device = torch.device("cuda", 0)
    assert stream_for(device, None) == (("plain", device), None, None)


@pytest.mark.parametrize("setting", ["half", 0, -8, 1.5, True])
def test_a_bad_setting_is_a_clear_error_even_on_a_cpu(setting):
    with pytest.raises(ValueError, match='None, "auto" or a number of SMs'):
        check_setting(setting)
    decoder = load_codec_decoder(os.path.join(os.environ["VOXFLOW_TINY_DIR"], "custom_voice"))
    with pytest.raises(ValueError, match='None, "auto" or a number of SMs'):
        Qwen3CodecRunner.from_decoder(decoder, stream_sms=setting)


def test_the_loader_rejects_a_bad_setting_before_loading(monkeypatch):
    import voxflow.models.qwen3_tts.engine_loader as loader

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr(loader.Qwen3TTS, "from_pretrained", no_load)
    with pytest.raises(ValueError, match='None, "auto" or a number of SMs'):
        loader.load("unused", codec_sms="Auto")


def test_engine_args_read_auto_counts_and_none():
    from voxflow.engine.engine_args import parse_engine_args
    assert parse_engine_args(["codec_sms=auto"]) == {"codec_sms": "auto"}
    assert parse_engine_args(["codec_sms=64"]) == {"codec_sms": 64}
    assert parse_engine_args(["codec_sms=none"]) == {"codec_sms": None}
