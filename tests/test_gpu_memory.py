"""engine/gpu_memory.py: the whole-footprint figures, the allocator cap and the stack limit, with the CUDA queries
stood in for (the real ones run in tests/gpu/test_gpu_engine.py)."""
import os

import pytest
import torch

from voxflow.engine import gpu_memory
from voxflow.engine.config import EngineConfig
from voxflow.engine.engine import EngineCore

TINY = os.environ.get("VOXFLOW_TINY_DIR", "")           # conftest.py writes the tiny checkpoints

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
    monkeypatch.setattr(gpu_memory, "stack_limit_bytes", lambda device: state["limit"])

    def set_limit(device, value):
        state["sets"].append((device, value))
        state["limit"] = value
        return True
    monkeypatch.setattr(gpu_memory, "set_stack_limit_bytes", set_limit)
    monkeypatch.setattr(gpu_memory, "outside_allocator_bytes", lambda device: state["limit"] * 10 ** 6)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return state


def test_a_grown_stack_limit_is_put_back_and_what_it_freed_is_reported(fake_stack):
    got = gpu_memory.shrink_stack_to(torch.device("cuda", 1), 1024)
    assert fake_stack["sets"] == [(torch.device("cuda", 1), 1024)]          # on the engine's device
    assert got == {"from": 5344, "to": 1024, "freed_bytes": (5344 - 1024) * 10 ** 6}


def test_a_stack_limit_that_did_not_grow_or_is_unknown_is_left_alone(fake_stack):
    assert gpu_memory.shrink_stack_to(torch.device("cuda", 0), 5344) is None          # not grown
    assert gpu_memory.shrink_stack_to(torch.device("cuda", 0), None) is None          # not read before
    assert gpu_memory.shrink_stack_to(torch.device("cpu"), 1024) is None              # no GPU
    fake_stack["limit"] = None                                                        # the runtime not found
    assert gpu_memory.shrink_stack_to(torch.device("cuda", 0), 1024) is None
    assert fake_stack["sets"] == []


def test_without_a_cuda_runtime_or_when_it_fails_the_stack_calls_say_so(monkeypatch):
    """No runtime found: None / False. A runtime whose calls fail (a CUDA build on a host without a GPU): the same,
    never an exception or a made-up value; and the calls go to the engine's device."""
    cuda0 = torch.device("cuda", 0)
    monkeypatch.setattr(gpu_memory, "_runtime", [None])
    assert gpu_memory.stack_limit_bytes(cuda0) is None and gpu_memory.set_stack_limit_bytes(cuda0, 1024) is False

    class FailingRuntime:
        calls = []

        def cudaDeviceGetLimit(self, value, limit):
            self.calls.append(("get", limit))
            return 100                                  # cudaErrorNoDevice

        def cudaDeviceSetLimit(self, limit, value):
            self.calls.append(("set", limit, value))
            return 100
    runtime, devices = FailingRuntime(), []

    class OnDevice:                                     # torch.cuda.device, recorded (this torch may have no CUDA)
        def __init__(self, device):
            devices.append(device)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(gpu_memory, "_runtime", [runtime])
    monkeypatch.setattr(torch.cuda, "device", OnDevice)
    assert gpu_memory.stack_limit_bytes(cuda0) is None
    assert gpu_memory.set_stack_limit_bytes(cuda0, 1024) is False
    assert runtime.calls == [("get", 0), ("set", 0, 1024)] and devices == [cuda0, cuda0]


def test_the_engine_shrinks_the_stack_after_the_load_and_before_any_capture(monkeypatch):
    """from_config reads the limit before the load, shrinks it after the load and before the engine's warm-up (where
    the graphs are captured), and records what it freed; shrink_stack_after_load=False reads nothing."""
    import voxflow.engine.engine_startup as engine_startup
    import voxflow.models.registry as registry
    order, sentinel = [], {"from": 5344, "to": 1024, "freed_bytes": 7}
    monkeypatch.setattr(engine_startup, "stack_limit_bytes", lambda device: order.append("read") or 1024)
    monkeypatch.setattr(engine_startup, "shrink_stack_to",
                        lambda device, value: order.append(("shrink", value)) or (sentinel if value else None))
    load = registry.load_for_engine
    monkeypatch.setattr(registry, "load_for_engine", lambda *a, **k: order.append("load") or load(*a, **k))
    warm = EngineCore._warm_up
    monkeypatch.setattr(EngineCore, "_warm_up", lambda self: order.append("warm_up") or warm(self))
    model = os.path.join(TINY, "custom_voice")
    core = EngineCore.from_config(EngineConfig(model=model, max_num_seqs=2, num_kv_blocks=16))
    assert order == ["read", "load", ("shrink", 1024), "warm_up"]
    assert core.startup["stack_limit_shrunk"] == sentinel
    order.clear()
    core = EngineCore.from_config(EngineConfig(model=model, max_num_seqs=2, num_kv_blocks=16,
                                               shrink_stack_after_load=False))
    assert order == ["load", ("shrink", None), "warm_up"] and "stack_limit_shrunk" not in core.startup


def test_the_runtime_is_the_libcudart_of_pytorchs_cuda_major(monkeypatch):
    """Where an extension has mapped another libcudart beside PyTorch's, the one of PyTorch's CUDA major is used
    (the versioned file name a symlink resolves to counts), and its argument types are declared."""
    import io
    maps = ("7f00-7f01 r-xp 0 08:01 1 /x/ext/lib/libcudart.so.12.8.90\n"
            "7f02-7f03 r-xp 0 08:01 2 /x/nvidia/cu13/lib/libcudart.so.13.0.96\n"
            "7f04-7f05 r-xp 0 08:01 3 /usr/lib/libc.so.6\n")
    monkeypatch.setattr(gpu_memory, "open", lambda path: io.StringIO(maps), raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    loaded = []

    class Lib:
        def __init__(self, path):
            loaded.append(path)
            self.cudaDeviceGetLimit = type("F", (), {})()
            self.cudaDeviceSetLimit = type("F", (), {})()
    monkeypatch.setattr(gpu_memory.ctypes, "CDLL", Lib)
    monkeypatch.setattr(gpu_memory, "_runtime", [])
    lib = gpu_memory._cudart()
    assert loaded == ["/x/nvidia/cu13/lib/libcudart.so.13.0.96"]
    assert lib.cudaDeviceSetLimit.argtypes[1] is gpu_memory.ctypes.c_size_t
    assert gpu_memory._cudart() is lib                              # looked up once


def test_the_allocator_events_are_its_retries_and_device_allocations_and_none_off_cuda(fake_cuda, monkeypatch):
    """From the nested counters (its flattening skipped): the retries after a failed cudaMalloc, the device
    allocations and frees; none on a CPU device; the engine's memory record carries them."""
    nested = {"num_alloc_retries": 2, "num_device_alloc": 31, "num_device_free": 4, "num_ooms": 0,
              "allocated_bytes": {"all": {"current": 1}}}
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device=None: nested)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 5 * GB)
    cuda0 = torch.device("cuda", 0)
    assert gpu_memory.allocator_events(cuda0) == {"alloc_retries": 2, "cuda_mallocs": 31, "cuda_frees": 4}
    assert gpu_memory.allocator_events(torch.device("cpu")) is None
    stats = gpu_memory.memory_stats(cuda0)
    assert stats["alloc_retries"] == 2 and stats["cuda_mallocs"] == 31 and stats["peak_gpu_memory_bytes"] == 5 * GB


def test_a_step_whose_allocations_retry_or_grow_the_stack_says_so_in_its_trace_line(tmp_path, monkeypatch):
    """The engine's wiring, on the CPU engine with the CUDA counters stood in for: the allocator's retries and
    device allocations and the stack's growth during a step's prefill show in that step's line only, as counts
    since the line before; a CPU engine's lines carry none of them."""
    import json
    import voxflow.engine.step_trace as step_trace_mod
    from test_engine import drive, greedy, make_engine
    from voxflow.engine.prefill_dispatch import PrefillDispatch
    counts = {"alloc_retries": 3, "cuda_mallocs": 40, "cuda_frees": 1, "stack": 1024}     # (startup's, not counted)
    monkeypatch.setattr(step_trace_mod, "allocator_events",
                        lambda device: {k: counts[k] for k in ("alloc_retries", "cuda_mallocs", "cuda_frees")})
    monkeypatch.setattr(step_trace_mod, "stack_limit_bytes", lambda device: counts["stack"])
    path = tmp_path / "steps.jsonl"
    core = make_engine(trace_steps=str(path))
    run, prefill_steps = PrefillDispatch.run, []

    def run_near_the_limit(self, pairs):
        prefill_steps.append(core.steps)
        if len(prefill_steps) == 2:                 # the second prefill: a retry, two mallocs, a 4 KiB stack growth
            counts.update(alloc_retries=4, cuda_mallocs=42, stack=5120)
        return run(self, pairs)
    monkeypatch.setattr(PrefillDispatch, "run", run_near_the_limit)
    drive(core, {0: [greedy("Hello there.", 6, voice="vivian", request_id="a")],
                 3: [greedy("Hello again.", 6, voice="vivian", request_id="b")]})
    core.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    flagged = {r["step"]: (r["alloc_retries"], r["cuda_mallocs"], r["cuda_frees"], r["stack_grown_bytes"])
               for r in lines if r["alloc_retries"] or r["cuda_mallocs"] or r["stack_grown_bytes"]}
    assert len(prefill_steps) == 2 and flagged == {prefill_steps[1]: (1, 2, 0, 4096)}
    monkeypatch.undo()
    plain = tmp_path / "plain.jsonl"
    core = make_engine(trace_steps=str(plain))
    drive(core, {0: [greedy("Hello there.", 4, voice="vivian", request_id="c")]})
    core.shutdown()
    first = json.loads(plain.read_text().splitlines()[0])
    assert "compiles" in first and not {"alloc_retries", "cuda_mallocs", "stack_grown_bytes"} & set(first)
