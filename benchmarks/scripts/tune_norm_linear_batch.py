"""(A record: norm_linear_batch.py was reverted after session 12 call 2; run it on the commit 17b0d0b.)
Decode-batch GEMMs with the norm / SwiGLU / residual folded in (voxflow/kernels/norm_linear_batch.py) against the
unfused launches they replace (rms_norm + cuBLAS, + silu_mul; cuBLAS + add), at the 1.7B talker's and code
predictor's widths, in CUDA-graph replays with W rotated past L2; then candidate configs for each.

    PYTHONPATH=$PWD python benchmarks/scripts/tune_norm_linear_batch.py [ROWS,ROWS,...]

Isolated timings do not settle a config (session 11: the isolated winners slowed a real frame); they show whether
the fused kernel is in the range of the launches it replaces, and which configs to try in profile_step.py.
"""
import sys

import torch
import torch.nn.functional as F

from voxflow.kernels import norm_linear_batch as nlb
from voxflow.kernels.norm_linear import norm_linear
from voxflow.layers.rms_norm import rms_norm
from voxflow.kernels.silu_mul import silu_mul

# (name, K, N, mode): N = output columns (activation columns for swiglu: W is [2N, K])
SHAPES = (("talker.qkv", 2048, 4096, "norm"), ("talker.o", 2048, 2048, "residual"),
          ("talker.gate_up", 2048, 6144, "swiglu"), ("talker.down", 6144, 2048, "residual"),
          ("cp.qkv", 1024, 4096, "norm"), ("cp.o", 2048, 1024, "residual"),
          ("cp.gate_up", 1024, 3072, "swiglu"), ("cp.down", 3072, 1024, "residual"))
CANDIDATES = [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st)
              for bm, bn, bk, w, st in ((64, 16, 128, 4, 4), (64, 32, 64, 4, 4), (64, 32, 128, 4, 3),
                                        (64, 64, 64, 4, 4), (64, 64, 128, 4, 3), (64, 128, 64, 4, 4),
                                        (64, 128, 64, 8, 3), (32, 32, 128, 4, 4), (128, 64, 64, 8, 3),
                                        (16, 32, 128, 4, 4))]
L2_BYTES = 200 << 20


def graph_us(fns, reps: int = 20) -> float:
    """Microseconds per call of a CUDA graph holding one call of each fn (each on its own W copy)."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps / len(fns)


def main() -> None:
    rows = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "16,64,128,256").split(",")]
    bf, dev = torch.bfloat16, "cuda"
    print("H200 bf16, us per call (graph replays, W rotated past L2); unfused = the launches it replaces")
    for name, k, n, mode in SHAPES:
        wn = 2 * n if mode == "swiglu" else n
        copies = max(2, min(32, L2_BYTES // (wn * k * 2)))
        ws = [torch.randn(wn, k, device=dev, dtype=bf) * k ** -0.5 for _ in range(copies)]
        g = torch.rand(k, device=dev, dtype=bf) + 0.5
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=bf)
            res = torch.randn(m, n, device=dev, dtype=bf)
            if mode == "norm":
                unfused = [lambda w=w: F.linear(rms_norm(x, g, 1e-6), w) for w in ws]
                fused = lambda w, c: norm_linear(x, w, g, 1e-6, config=c)              # noqa: E731
            elif mode == "swiglu":
                unfused = [lambda w=w: silu_mul(*F.linear(rms_norm(x, g, 1e-6), w).chunk(2, -1)) for w in ws]
                fused = lambda w, c: norm_linear(x, w, g, 1e-6, swiglu=True, config=c)  # noqa: E731
            else:
                unfused = [lambda w=w: res + F.linear(x, w) for w in ws]
                fused = lambda w, c: norm_linear(x, w, None, 0.0, residual=res, config=c)  # noqa: E731
            base = graph_us(unfused)
            heur = nlb.launch_config(m, n, k, mode == "swiglu")
            line = f"{name:15s} m={m:3d} unfused {base:7.2f} | heuristic {graph_us([lambda w=w: fused(w, None) for w in ws]):7.2f} {heur}"
            best = None
            for c in CANDIDATES:
                try:
                    us = graph_us([lambda w=w: fused(w, c) for w in ws])
                except Exception as e:               # out of shared memory / registers
                    print(f"  {c}: failed ({type(e).__name__})", flush=True)
                    continue
                if best is None or us < best[0]:
                    best = (us, c)
            print(line + f" | best {best[0]:7.2f} {best[1]}", flush=True)


if __name__ == "__main__":
    main()
