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
import ctypes
import gc
import sys

import torch
import torch.nn.functional as F

from voxflow.bench.offline import parse_engine_args
from voxflow.engine.engine import EngineConfig, EngineCore
from voxflow.engine.gpu_memory import outside_allocator_bytes
from voxflow.engine.request import SamplingOptions, SpeechRequest

MIB = 2 ** 20
STACK_SIZE = 0          # cudaLimitStackSize


def cudart() -> ctypes.CDLL:
    """The CUDA runtime this process already loaded (torch's), found in its memory map."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libcudart" in line}
    if not paths:
        raise RuntimeError("libcudart is not loaded")
    return ctypes.CDLL(sorted(paths)[0])


def stack_limit(rt: ctypes.CDLL) -> int:
    value = ctypes.c_size_t()
    assert rt.cudaDeviceGetLimit(ctypes.byref(value), STACK_SIZE) == 0
    return value.value


def report(label: str, device: torch.device) -> None:
    torch.cuda.synchronize(device)
    used = torch.cuda.mem_get_info(device)
    print(f"{label:48s} outside {outside_allocator_bytes(device) / MIB:8.0f} MiB | reserved "
          f"{torch.cuda.memory_reserved(device) / MIB:8.0f} MiB | device used {(used[1] - used[0]) / MIB:8.0f} MiB",
          flush=True)


def main() -> None:
    model, concurrency = sys.argv[1], int(sys.argv[2])
    extra = parse_engine_args(sys.argv[3:])
    device = torch.device("cuda")
    torch.zeros(1, device=device)
    report("1. context", device)
    rt = cudart()
    print(f"   stack limit {stack_limit(rt)} B per thread", flush=True)
    a = torch.randn(256, 1024, device=device, dtype=torch.bfloat16)
    _ = a @ a.T
    report("2. + bf16 matmul", device)
    x = torch.randn(4, 512, 100, device=device)
    w = torch.randn(512, 512, 7, device=device)
    _ = F.conv1d(x, w, padding=3)
    _ = F.conv_transpose1d(x, w.transpose(0, 1).contiguous()[:, :256], stride=2)
    report("3. + fp32 conv1d / conv_transpose1d", device)
    del a, x, w, _
    cfg = dict(model=model, device="cuda", dtype="bfloat16", max_num_seqs=concurrency)
    cfg.update(extra)
    core = EngineCore.from_config(EngineConfig(**cfg))
    for name, value in core.startup.get("gpu_memory_outside_allocator_by_stage", {}).items():
        print(f"   4. startup stage {name:30s} outside {value / MIB:8.0f} MiB", flush=True)
    report("4. + engine startup", device)
    print(f"   stack limit {stack_limit(rt)} B per thread", flush=True)
    err = rt.cudaDeviceSetLimit(STACK_SIZE, ctypes.c_size_t(1024))
    report(f"5. stack limit reset to 1024 B (rc {err})", device)
    for i in range(concurrency):
        core.add_request(SpeechRequest(text="Hello there, this is a sentence of ordinary length.", voice="vivian",
                                       request_id=str(i),
                                       sampling=SamplingOptions(max_new_tokens=60, ignore_eos=True)))
    while core.has_work():
        core.step()
    report(f"6. + {concurrency} requests served", device)
    print(f"   stack limit {stack_limit(rt)} B per thread", flush=True)
    del core
    gc.collect()
    torch.cuda.empty_cache()
    report("7. engine deleted, cache emptied", device)


if __name__ == "__main__":
    main()
