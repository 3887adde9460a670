"""Which kernel grows the GPU's per-thread stack limit, and so the driver's local-memory reservation.

Session 20 call 1: the limit stood at 5,344 B per thread after the engine's startup (1,024 at start), and resetting it
to 1,024 freed 1.1 GiB (the reservation is that stack for every thread the GPU can hold at once). It grew while the
weights loaded and the codec's fp16 check ran. This runs the engine's startup with every aten op and every Triton
launch followed by a read of the limit, and prints the op or kernel after which it grew. After the load (weights and
codec check) it resets the limit to 1,024 B, so growth during graph capture, warm-up and serving shows separately
(the engine now does that itself, `shrink_stack_after_load`: then this reset finds nothing left to shrink).
At each of the engine's startup stages it also prints the allocator's reservation and peak of tensors (what the
other ~7 GiB of the 0.6B configuration's footprint is made of).

    python benchmarks/scripts/probe_stack_growth.py MODEL_DIR CONCURRENCY [KEY=VALUE engine args]
"""
import sys

import torch
import triton.runtime.jit as triton_jit
from torch.utils._python_dispatch import TorchDispatchMode

import voxflow.engine.engine_startup as engine_startup
import voxflow.models.registry as registry
from probe_common import add_requests, build_engine
from voxflow.engine.gpu_memory import outside_allocator_bytes, shrink_stack_to, stack_limit_bytes

MIB = 2 ** 20


class Watch:
    def __init__(self):
        self.device = torch.device("cuda", torch.cuda.current_device())
        torch.zeros(1, device=self.device)
        self.last = self.limit()
        self.where = "start"

    def limit(self) -> int:
        return stack_limit_bytes(self.device)

    def check(self, what) -> None:
        now = self.limit()
        if now != self.last:
            print(f"  [{self.where}] stack {self.last} -> {now} B after {what() if callable(what) else what}",
                  flush=True)
            self.last = now

    def reset(self, label: str) -> None:
        shrunk = shrink_stack_to(self.device, 1024)
        freed = f"{shrunk['freed_bytes'] / MIB:.0f} MiB freed" if shrunk else "nothing to shrink"
        print(f"{label}: stack {self.last} -> 1024 B; {freed} outside the allocator", flush=True)
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
    outside = engine_startup.outside_allocator_bytes

    def outside_and_reserved(device):                   # the engine's per-stage memory record, printed with more
        value = outside(device)
        print(f"  stage: outside {value / MIB:.0f} MiB, reserved {torch.cuda.memory_reserved(device) / MIB:.0f} MiB,"
              f" peak of tensors {torch.cuda.max_memory_allocated(device) / MIB:.0f} MiB", flush=True)
        return value
    engine_startup.outside_allocator_bytes = outside_and_reserved
    with OpWatch(watch):
        core = build_engine(model, concurrency, sys.argv[3:])
        print(f"startup done; stack {watch.limit()} B; outside the allocator by stage (MiB): "
              f"{ {k: round(v / MIB) for k, v in core.startup['gpu_memory_outside_allocator_by_stage'].items()} }",
              flush=True)
        watch.where = "serving"
        add_requests(core, concurrency, 60)
        while core.has_work():
            core.step()
        torch.cuda.synchronize()
    print(f"served {concurrency} requests; stack {watch.limit()} B; outside the allocator "
          f"{outside_allocator_bytes(watch.device) / MIB:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
