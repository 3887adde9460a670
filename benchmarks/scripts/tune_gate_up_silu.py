"""Times gate_up_silu (voxflow/kernels/gate_up_silu.py) against the two launches it replaces (cuBLAS's gate|up GEMM
and silu_mul_folded) at a folded layer step's shape, bf16, and prints the fastest tiles.

Times are GPU times of CUDA-graph replays, per call: a graph of CALLS calls, each on the next of COPIES weight copies
(more bytes than the L2 holds: in a step every layer's weight comes from HBM), events around 20 replays, the median
of 5 rounds. The last line is the fastest tiles as VOXFLOW_GATE_UP_SILU_TILES takes them ("BLOCK_N,BLOCK_K,stages,
warps"), for the served A/B that follows.

    python benchmarks/scripts/tune_gate_up_silu.py [ROWS] [K] [I] [--budget 120]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from voxflow.kernels.gate_up_silu import gate_up_silu, launch_config
from voxflow.kernels.silu_mul import silu_mul_folded

COPIES, CALLS, EPS = 8, 64, 1e-6


def two_launches(h, w):
    gate_up = F.linear(h, w)
    inter = w.shape[0] // 2
    return silu_mul_folded(gate_up[:, :inter], gate_up[:, inter:], h, EPS)


def time_per_call(fn, hs, ws) -> float:
    for i in range(2):                                          # compile / fuse outside the capture
        fn(hs[i], ws[i])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            fn(hs[i % len(hs)], ws[i % len(ws)])
    rounds = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) * 1e3 / (20 * CALLS))
    return statistics.median(rounds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", type=int, nargs="?", default=64)
    ap.add_argument("k", type=int, nargs="?", default=1024)
    ap.add_argument("inter", type=int, nargs="?", default=3072)
    ap.add_argument("--budget", type=float, default=120.0)
    a = ap.parse_args()
    torch.manual_seed(0)
    hs = [(torch.randn(a.rows, a.k, device="cuda") * 2).bfloat16() for _ in range(4)]
    ws = [(torch.randn(2 * a.inter, a.k, device="cuda") * a.k ** -0.5).bfloat16() for _ in range(COPIES)]
    mb = ws[0].numel() * 2 / 1e6
    base = time_per_call(two_launches, hs, ws)
    print(f"rows {a.rows} K {a.k} I {a.inter} ({mb:.1f} MB of weights a call), {torch.cuda.get_device_name()}")
    print(f"cuBLAS gate|up + silu_mul_folded: {base:.2f} us ({mb / base:.2f} TB/s)")
    default = launch_config(a.rows, a.inter, a.k)
    cands = [(bn, bk, s, 4) for bn in (16, 32, 64) for bk in (64, 128) for s in (3, 4, 5)]
    cands += [(32, 128, 4, 8), (64, 128, 4, 8), (64, 64, 4, 8), (32, 256, 3, 4), (16, 256, 3, 4)]
    start, results = time.time(), []
    for bn, bk, s, wp in cands:
        if time.time() - start > a.budget:
            print("(budget spent: the remaining tiles not timed)")
            break
        cfg = dict(BLOCK_N=bn, BLOCK_K=bk, num_stages=s, num_warps=wp)
        try:
            t = time_per_call(lambda h, w: gate_up_silu(h, w, EPS, config=cfg), hs, ws)
        except Exception as e:                                  # e.g. shared memory out of range for the tiles
            print(f"  {bn},{bk},{s},{wp}: failed ({type(e).__name__})")
            continue
        mark = "*" if all(default[key] == v for key, v in zip(("BLOCK_N", "BLOCK_K", "num_stages", "num_warps"),
                                                              (bn, bk, s, wp))) else " "
        print(f" {mark}{bn},{bk},{s},{wp}: {t:.2f} us ({mb / t:.2f} TB/s)")
        results.append((t, f"{bn},{bk},{s},{wp}"))
    best = min(results)
    print(f"fastest {best[1]} {best[0]:.2f} us against {base:.2f} for the two launches")
    print(best[1])


if __name__ == "__main__":
    main()
