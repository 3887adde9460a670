"""engine/gpu_memory.py: the whole-footprint figures and the allocator cap, with the CUDA queries stood in for (the
real ones run in tests/gpu/test_gpu_engine.py)."""
import pytest
import torch

from voxflow.engine import gpu_memory
from voxflow.engine.config import EngineConfig
from voxflow.engine.engine import EngineCore

GB = 10 ** 9


@pytest.fixture
def fake_cuda(monkeypatch):
    state = dict(free=130 * GB, total=140 * GB, reserved=6 * GB, peak_reserved=7 * GB, fraction=None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["free"], state["total"]))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: state["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: state["peak_reserved"])
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: state.update(fraction=fraction, index=device))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return state


def test_footprint_counts_what_lies_outside_the_allocator(fake_cuda):
    got = gpu_memory.footprint(torch.device("cuda", 0))
    # 10 GB in use on the device, 6 of them reserved by the allocator: 4 outside (context, modules, graphs)
    assert got == {"gpu_memory_used_bytes": 10 * GB, "gpu_memory_outside_allocator_bytes": 4 * GB,
                   "peak_gpu_memory_reserved_bytes": 7 * GB, "peak_gpu_memory_total_bytes": 11 * GB}


def test_outside_allocator_is_never_negative(fake_cuda):
    fake_cuda["reserved"] = 12 * GB                 # a driver figure a moment behind the allocator's
    assert gpu_memory.outside_allocator_bytes(torch.device("cuda", 0)) == 0


def test_room_within_a_cap_counts_everything_in_use(fake_cuda):
    assert gpu_memory.room_within(torch.device("cuda", 0), 16 * GB) == 6 * GB        # 10 GB in use
    assert gpu_memory.room_within(torch.device("cuda", 0), 8 * GB) == 0


def test_the_cap_leaves_the_allocator_the_limit_less_what_is_outside_it(fake_cuda):
    budget = gpu_memory.limit_allocator(torch.device("cuda"), 8 * GB)      # no index: the current device's
    assert budget == 4 * GB and fake_cuda["fraction"] == pytest.approx(4 / 140) and fake_cuda["index"] == 0
    with pytest.raises(ValueError, match="below what the CUDA context already uses"):
        gpu_memory.limit_allocator(torch.device("cuda", 0), 4 * GB)


def test_a_cap_on_a_cpu_engine_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(ValueError, match="needs a CUDA device"):
        EngineCore.from_config(EngineConfig(model=str(tmp_path / "absent"), gpu_memory_limit_bytes=8 * GB))


@pytest.fixture
def fake_stack(monkeypatch):
    """The runtime's stack limit stood in for: the local memory outside the allocator follows it (1 MB a byte)."""
    state = dict(limit=5344, sets=[])
    monkeypatch.setattr(gpu_memory, "stack_limit_bytes", lambda: state["limit"])

    def set_limit(value):
        state["sets"].append(value)
        state["limit"] = value
        return True
    monkeypatch.setattr(gpu_memory, "set_stack_limit_bytes", set_limit)
    monkeypatch.setattr(gpu_memory, "outside_allocator_bytes", lambda device: state["limit"] * 10 ** 6)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return state


def test_a_grown_stack_limit_is_put_back_and_what_it_freed_is_reported(fake_stack):
    got = gpu_memory.shrink_stack_to(torch.device("cuda", 0), 1024)
    assert fake_stack["sets"] == [1024]
    assert got == {"from": 5344, "to": 1024, "freed_bytes": (5344 - 1024) * 10 ** 6}


def test_a_stack_limit_that_did_not_grow_or_is_unknown_is_left_alone(fake_stack):
    assert gpu_memory.shrink_stack_to(torch.device("cuda", 0), 5344) is None          # not grown
    assert gpu_memory.shrink_stack_to(torch.device("cuda", 0), None) is None          # not read before
    assert gpu_memory.shrink_stack_to(torch.device("cpu"), 1024) is None              # no GPU
    fake_stack["limit"] = None                                                        # the runtime not found
    assert gpu_memory.shrink_stack_to(torch.device("cuda", 0), 1024) is None
    assert fake_stack["sets"] == []


def test_without_a_cuda_runtime_the_stack_calls_say_so():
    """On this CPU machine there is no libcudart in the process (or it is PyTorch's CPU build): None / False,
    never an exception."""
    if gpu_memory._cudart() is not None:
        pytest.skip("a CUDA runtime is loaded in this process")
    assert gpu_memory.stack_limit_bytes() is None and gpu_memory.set_stack_limit_bytes(1024) is False
