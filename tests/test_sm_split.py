"""engine/sm_split.py (VOXFLOW_TALKER_SMS=rest): one driver split of the GPU's SMs into the codec's group and the
talker's rest. The GPU itself is in tests/gpu (test_gpu_sm_split.py: the SMs each stream really runs on); here the
setting, the driver calls and their errors, against a stand-in for NVIDIA's `cuda.bindings.driver`."""
import enum
import sys
import types

import pytest
import torch

from voxflow.engine import sm_partition, sm_split
from voxflow.engine.engine_stream import talker_stream
from voxflow.engine.sm_partition import SMPartitionError


@pytest.mark.parametrize("value,on", [(None, False), ("", False), ("none", False), ("rest", True), (" REST ", True)])
def test_the_setting(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(sm_split.ENV, raising=False)
    else:
        monkeypatch.setenv(sm_split.ENV, value)
    assert sm_split.rest_enabled() is on


def test_a_wrong_setting_is_an_error_not_the_whole_gpu(monkeypatch):
    monkeypatch.setenv(sm_split.ENV, "half")
    with pytest.raises(SMPartitionError, match='"rest"'):
        sm_split.rest_enabled()


def test_a_split_needs_a_cuda_device():
    with pytest.raises(SMPartitionError, match="CUDA device"):
        sm_split.split(torch.device("cpu"), 64)


def test_without_the_driver_bindings_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)          # import fails
    monkeypatch.setattr(sm_split, "_splits", {})
    with pytest.raises(SMPartitionError, match="pip install cuda-bindings"):
        sm_split.split(torch.device("cuda", 0), 64)


def test_on_a_cpu_the_setting_makes_no_talker_stream(monkeypatch):
    monkeypatch.setenv(sm_split.ENV, "rest")
    assert talker_stream(torch.device("cpu"), False, None) is None


class FakeDriver:
    """What sm_split calls of cuda.bindings.driver, recording the calls; `fail` names a call that returns an error."""

    class CUresult(enum.IntEnum):
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 914

    CUdevResourceType = types.SimpleNamespace(CU_DEV_RESOURCE_TYPE_SM="sm")
    CUgreenCtxCreate_flags = types.SimpleNamespace(CU_GREEN_CTX_DEFAULT_STREAM=1)
    CUstream_flags = types.SimpleNamespace(CU_STREAM_NON_BLOCKING=1)

    def __init__(self, total=132, fail=None):
        self.total, self.fail, self.calls = total, fail, []

    def _ok(self, name, *values):
        self.calls.append(name)
        if name == self.fail:
            return (self.CUresult.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, *[None] * len(values))
        return (self.CUresult.CUDA_SUCCESS, *values)

    @staticmethod
    def _sm(count):
        return types.SimpleNamespace(sm=types.SimpleNamespace(smCount=count))

    def cuInit(self, flags):
        return self._ok("cuInit")

    def cuDeviceGet(self, index):
        return self._ok("cuDeviceGet", f"dev{index}")

    def cuDeviceGetDevResource(self, dev, kind):
        return self._ok("cuDeviceGetDevResource", self._sm(self.total))

    def cuDevSmResourceSplitByCount(self, groups, whole, flags, count):
        count = -(-count // 8) * 8                                   # the driver's granularity on Hopper
        return self._ok("cuDevSmResourceSplitByCount", [self._sm(count)], groups, self._sm(whole.sm.smCount - count))

    def cuDevResourceGenerateDesc(self, resources, n):
        return self._ok("cuDevResourceGenerateDesc", ("desc", resources[0].sm.smCount))

    def cuGreenCtxCreate(self, desc, dev, flags):
        return self._ok("cuGreenCtxCreate", ("green", desc[1]))

    def cuGreenCtxStreamCreate(self, context, flags, priority):
        return self._ok("cuGreenCtxStreamCreate", 1000 + context[1])      # a "handle" telling the group apart

    def cuGreenCtxDestroy(self, context):
        return self._ok(f"cuGreenCtxDestroy {context}")


@pytest.fixture
def fake(monkeypatch):
    """The stand-in driver, with PyTorch's CUDA calls that a CPU build lacks replaced."""
    driver = FakeDriver()
    package = types.ModuleType("cuda.bindings")
    package.driver = driver
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", package)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle, device: types.SimpleNamespace(
        cuda_stream=handle, device=device))
    monkeypatch.setattr(sm_split, "_splits", {})
    monkeypatch.setattr(sm_split, "_split_stream_ids", set())
    return driver


def test_the_split_gives_the_group_and_the_rest_each_its_own_green_context_and_stream(fake):
    made = sm_split.split(torch.device("cuda", 1), 60)
    assert (made.first_sms, made.rest_sms) == (64, 68)                 # 60 rounded up by the driver, and the rest
    assert (made.first.cuda_stream, made.rest.cuda_stream) == (1064, 1068)
    assert made.first.device == made.rest.device == torch.device("cuda", 1)
    assert made.contexts == (("green", 64), ("green", 68))
    assert fake.calls == ["cuInit", "cuDeviceGet", "cuDeviceGetDevResource", "cuDevSmResourceSplitByCount"] + [
        "cuDevResourceGenerateDesc", "cuGreenCtxCreate", "cuGreenCtxStreamCreate"] * 2
    assert sm_split.is_split_stream(made.first) and sm_split.is_split_stream(made.rest)
    assert not sm_split.is_split_stream(types.SimpleNamespace(cuda_stream=1))
    # the codec runner and the engine ask separately: one split, the same streams
    assert sm_split.split(torch.device("cuda", 1), 60) is made and len(fake.calls) == 10


@pytest.mark.parametrize("call", ["cuDevSmResourceSplitByCount", "cuGreenCtxCreate", "cuGreenCtxStreamCreate"])
def test_a_driver_error_names_the_call_and_the_error(fake, call):
    fake.fail = call
    with pytest.raises(SMPartitionError, match=f"{call} failed: CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"):
        sm_split.split(torch.device("cuda", 0), 64)
    assert sm_split._splits == {}                                       # nothing half-made is kept
    made = fake.calls.count("cuGreenCtxCreate") - (call == "cuGreenCtxCreate")
    assert [c for c in fake.calls if c.startswith("cuGreenCtxDestroy")] == [
        "cuGreenCtxDestroy ('green', 64)"] * made                        # ... nor a green context


def test_with_the_setting_the_codec_and_the_talker_get_the_two_sides_of_one_split(fake, monkeypatch):
    monkeypatch.setenv(sm_split.ENV, "rest")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(
        multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "loading stream")
    device = torch.device("cuda", 0)
    codec_stream, owner, sms = sm_partition.stream_for(device, "auto")
    assert sms == 64 and codec_stream is owner.first
    waited = []
    owner.rest.wait_stream = waited.append
    assert talker_stream(device, False, sms) is owner.rest and waited == ["loading stream"]
    with pytest.raises(SMPartitionError, match="needs the codec on a partition"):
        talker_stream(device, False, None)
    with pytest.raises(SMPartitionError, match="do not combine"):
        talker_stream(device, True, sms)
