"""Where the GPU memory outside PyTorch's caching allocator goes (the 0.6B configuration holds ~2 GiB there).

In one fresh process, the memory outside the allocator (driver's used - allocator's reservation, MiB) after:
  1. the CUDA context alone; 2. a bf16 matmul (cuBLAS/cuBLASLt); 3. fp32 conv1d / conv_transpose1d (cuDNN);
  4. the engine's startup, by its own stages (weights and KV, decode / prefill / codec graphs, warm-up);
  5. resetting the per-thread stack limit (cudaDeviceSetLimit): the driver's local-memory reservation, which grows to
     the largest stack any launched kernel needed (per thread x every resident thread of the GPU), shrinks back;
  6. served steps (graphs replayed, which may grow it again);
  7. the engine deleted (its graphs' executables destroyed, the allocator's cache emptied).

    python benchmarks/scripts/probe_outside_memory.py MODEL_DIR CONCURRENCY [KEY=VALUE engine args]
"""
import gc
import sys

import torch
import torch.nn.functional as F

from probe_common import add_requests, build_engine
from voxflow.engine.gpu_memory import outside_allocator_bytes, set_stack_limit_bytes, stack_limit_bytes

MIB = 2 ** 20


def report(label: str, device: torch.device) -> None:
    torch.cuda.synchronize(device)
    used = torch.cuda.mem_get_info(device)
    print(f"{label:48s} outside {outside_allocator_bytes(device) / MIB:8.0f} MiB | reserved "
          f"{torch.cuda.memory_reserved(device) / MIB:8.0f} MiB | device used {(used[1] - used[0]) / MIB:8.0f} MiB",
          flush=True)


def main() -> None:
    model, concurrency = sys.argv[1], int(sys.argv[2])
    device = torch.device("cuda", torch.cuda.current_device())
    torch.zeros(1, device=device)
    report("1. context", device)
    print(f"   stack limit {stack_limit_bytes(device)} B per thread", flush=True)
    a = torch.randn(256, 1024, device=device, dtype=torch.bfloat16)
    _ = a @ a.T
    report("2. + bf16 matmul", device)
    x = torch.randn(4, 512, 100, device=device)
    w = torch.randn(512, 512, 7, device=device)
    _ = F.conv1d(x, w, padding=3)
    _ = F.conv_transpose1d(x, w.transpose(0, 1).contiguous()[:, :256], stride=2)
    report("3. + fp32 conv1d / conv_transpose1d", device)
    del a, x, w, _
    core = build_engine(model, concurrency, sys.argv[3:])
    for name, value in core.startup.get("gpu_memory_outside_allocator_by_stage", {}).items():
        print(f"   4. startup stage {name:30s} outside {value / MIB:8.0f} MiB", flush=True)
    report("4. + engine startup", device)
    print(f"   stack limit {stack_limit_bytes(device)} B per thread", flush=True)
    ok = set_stack_limit_bytes(device, 1024)
    report(f"5. stack limit reset to 1024 B (set: {ok})", device)
    add_requests(core, concurrency, 60)
    while core.has_work():
        core.step()
    report(f"6. + {concurrency} requests served", device)
    print(f"   stack limit {stack_limit_bytes(device)} B per thread", flush=True)
    del core
    gc.collect()
    torch.cuda.empty_cache()
    report("7. engine deleted, cache emptied", device)


if __name__ == "__main__":
    main()
