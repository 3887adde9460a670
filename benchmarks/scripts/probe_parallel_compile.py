"""Do Triton's compiles for an sm_90 GPU run side by side in threads, or does Python's GIL serialise them?

Why ask: a fresh GPU machine spends minutes compiling voxflow's kernels at its first start, one after another on the
engine thread (session 63's H100: the engine's build 87.4 s against 7-13 s with Triton's cache warm). Compiling
them in a pool would cut that only if the compiler leaves the GIL (its LLVM passes, ptxas as a subprocess).
This compiles the same kernels of `voxflow.kernels.compile_check.cases()` (no GPU needed) into a fresh Triton
cache three ways: one after another, in a thread pool, in a process pool, and prints the wall time of each.

    python benchmarks/scripts/probe_parallel_compile.py [workers] [kernels]
"""
import os
import subprocess
import sys
import tempfile
import time

MODE_CODE = r"""
import os, sys, time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from voxflow.kernels.compile_check import cases, compile_kernel

def one(i):
    name, fn, types, consts, options = cases()[i]
    compile_kernel(fn, types, consts, **options)

if __name__ == "__main__":
    mode, workers, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    picked = list(range(len(cases())))[:count]
    t = time.perf_counter()
    if mode == "serial":
        for i in picked:
            one(i)
    else:
        pool = ThreadPoolExecutor if mode == "threads" else ProcessPoolExecutor
        with pool(workers) as ex:
            list(ex.map(one, picked))
    print(f"{mode:8s} {len(picked)} kernels, {workers if mode != 'serial' else 1} worker(s): "
          f"{time.perf_counter() - t:.1f} s")
"""


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else os.cpu_count()
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    print(f"{os.cpu_count()} CPUs; each mode in its own process with an empty TRITON_CACHE_DIR")
    for mode in ("serial", "threads", "processes"):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            subprocess.run([sys.executable, "-c", MODE_CODE, mode, str(workers), str(count)], env=env, check=True)


if __name__ == "__main__":
    main()
