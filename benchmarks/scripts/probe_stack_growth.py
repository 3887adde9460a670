"""Which kernel grows the GPU's per-thread stack limit, and so the driver's local-memory reservation.

Session 20 call 1: the limit stood at 5,344 B per thread after the engine's startup (1,024 at start), and resetting it
to 1,024 freed 1.1 GiB (the reservation is that stack for every thread the GPU can hold at once). It grew while the
weights loaded and the codec's fp16 check ran. This runs the engine's startup with every aten op and every Triton
launch followed by a read of the limit, and prints the op or kernel after which it grew. After the load (weights and
codec check) it resets the limit to 1,024 B, so growth during graph capture, warm-up and serving shows separately.
At each of the engine's startup stages it also prints the allocator's reservation and peak of tensors (what the
other ~7 GiB of the 0.6B configuration's footprint is made of).

    python benchmarks/scripts/probe_stack_growth.py MODEL_DIR CONCURRENCY [KEY=VALUE engine args]
"""
import ctypes
import sys

import torch
import triton.runtime.jit as triton_jit
from torch.utils._python_dispatch import TorchDispatchMode

import voxflow.engine.engine as engine_module
import voxflow.models.registry as registry
from voxflow.bench.offline import parse_engine_args
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.gpu_memory import outside_allocator_bytes
from voxflow.engine.request import SamplingOptions, SpeechRequest

STACK_SIZE = 0          # cudaLimitStackSize
MIB = 2 ** 20


def cudart() -> ctypes.CDLL:
    """The CUDA runtime this process already loaded (torch's), found in its memory map."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libcudart" in line}
    return ctypes.CDLL(sorted(paths)[0])


class Watch:
    def __init__(self):
        torch.zeros(1, device="cuda")
        self.rt = cudart()
        self.last = self.limit()
        self.where = "start"

    def limit(self) -> int:
        value = ctypes.c_size_t()
        assert self.rt.cudaDeviceGetLimit(ctypes.byref(value), STACK_SIZE) == 0
        return value.value

    def check(self, what) -> None:
        now = self.limit()
        if now != self.last:
            print(f"  [{self.where}] stack {self.last} -> {now} B after {what() if callable(what) else what}",
                  flush=True)
            self.last = now

    def reset(self, label: str) -> None:
        torch.cuda.synchronize()
        before = outside_allocator_bytes(torch.device("cuda"))
        rc = self.rt.cudaDeviceSetLimit(STACK_SIZE, ctypes.c_size_t(1024))
        after = outside_allocator_bytes(torch.device("cuda"))
        print(f"{label}: stack {self.last} -> 1024 B (rc {rc}); outside the allocator {before / MIB:.0f} -> "
              f"{after / MIB:.0f} MiB", flush=True)
        self.last = self.limit()


def describe(func, args) -> str:
    shapes = [f"{tuple(a.shape)}:{str(a.dtype).removeprefix('torch.')}" for a in args if isinstance(a, torch.Tensor)]
    return f"{func} {' '.join(shapes[:4])}"


class OpWatch(TorchDispatchMode):
    def __init__(self, watch: Watch):
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.watch.check(lambda: describe(func, args))
        return out


def main() -> None:
    model, concurrency = sys.argv[1], int(sys.argv[2])
    watch = Watch()
    launch = triton_jit.JITFunction.run

    def run(self, *args, **kwargs):                     # every Triton launch (autotuned ones end here too)
        out = launch(self, *args, **kwargs)
        watch.check(lambda: f"triton {self.fn.__name__}")
        return out
    triton_jit.JITFunction.run = run
    load = registry.load_for_engine

    def load_then_reset(*args, **kwargs):               # the weights and the codec's check, then a clean limit
        watch.where = "load"
        out = load(*args, **kwargs)
        watch.reset("after the load")
        watch.where = "engine startup"
        return out
    registry.load_for_engine = load_then_reset
    outside = engine_module.outside_allocator_bytes

    def outside_and_reserved(device):                   # the engine's per-stage memory record, printed with more
        value = outside(device)
        print(f"  stage: outside {value / MIB:.0f} MiB, reserved {torch.cuda.memory_reserved(device) / MIB:.0f} MiB,"
              f" peak of tensors {torch.cuda.max_memory_allocated(device) / MIB:.0f} MiB", flush=True)
        return value
    engine_module.outside_allocator_bytes = outside_and_reserved
    cfg = dict(model=model, device="cuda", dtype="bfloat16", max_num_seqs=concurrency)
    cfg.update(parse_engine_args(sys.argv[3:]))
    with OpWatch(watch):
        core = EngineCore.from_config(EngineConfig(**cfg))
        print(f"startup done; stack {watch.limit()} B; outside the allocator by stage (MiB): "
              f"{ {k: round(v / MIB) for k, v in core.startup['gpu_memory_outside_allocator_by_stage'].items()} }",
              flush=True)
        watch.where = "serving"
        for i in range(concurrency):
            core.add_request(SpeechRequest(text="Hello there, this is a sentence of ordinary length.",
                                           voice="vivian", request_id=str(i),
                                           sampling=SamplingOptions(max_new_tokens=60, ignore_eos=True)))
        while core.has_work():
            core.step()
        torch.cuda.synchronize()
    print(f"served {concurrency} requests; stack {watch.limit()} B; outside the allocator "
          f"{outside_allocator_bytes(torch.device('cuda')) / MIB:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
