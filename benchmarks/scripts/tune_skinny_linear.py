"""Times the skinny decode GEMM (voxflow/kernels/skinny_linear.py) on a GPU, to set its launch heuristic from data.

For every real layer shape and M in (1, 4, 16, 64), bf16:
1. the bare GEMM with a handful of candidate configs around `launch_config`'s pick (other BLOCK_N / BLOCK_K /
   warps / stages, the other path (dot vs register FMAs), split-K): the best one, its time and W bandwidth;
2. the GEMM with the prologue/epilogue the layer fuses into it (norm, residual, gated + residual, bias), with the
   heuristic's config and with the best bare config;
3. torch: F.linear alone, and the unfused sequence the layer runs today (the rms_norm / silu_mul kernels,
   F.linear, the residual add).

Times are GPU times from back-to-back CUDA-graph replays, per call, with the weight
rotated over enough copies to exceed the L2 cache (in a decode step every layer's W comes from HBM; one W read
over and over would sit in the H200's 50 MB L2 and flatter the bandwidth). The heuristic's pick is marked '*'
in the candidate list. Runtime ~1-2 minutes on a fresh machine (most of it Triton compiling the candidates;
cached afterwards); past --budget seconds only the heuristic is timed.

    python benchmarks/scripts/tune_skinny_linear.py [--budget 75] [--only talker] [--verbose]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from voxflow.kernels.silu_mul import silu_mul
from voxflow.kernels.skinny_linear import QWEN3_TTS_SHAPES, launch_config, skinny_linear
from voxflow.layers.rms_norm import rms_norm

DTYPE = torch.bfloat16
ROWS = (1, 4, 16, 64)
SHAPES = QWEN3_TTS_SHAPES
L2_BYTES = 128 << 20          # rotate weights over > 2x the H200's L2


def short(cfg: dict) -> str:
    s = (f"dot m{cfg['BLOCK_M']}" if cfg["USE_DOT"] else f"fma m{cfg['BLOCK_M']}") + \
        f" n{cfg['BLOCK_N']} k{cfg['BLOCK_K']} w{cfg['num_warps']} s{cfg['num_stages']}"
    return s + (f" sk{cfg['SPLIT_K']}" if cfg["SPLIT_K"] > 1 else "")


def fits(cfg: dict, m: int, k: int) -> bool:
    tile = 16 if cfg["USE_DOT"] else 1
    return (cfg["BLOCK_M"] >= max(m, tile) and min(cfg["BLOCK_N"], cfg["BLOCK_K"]) >= tile
            and k % (cfg["BLOCK_K"] * cfg["SPLIT_K"]) == 0
            and (cfg["USE_DOT"] or cfg["BLOCK_M"] * cfg["BLOCK_N"] * cfg["BLOCK_K"] <= 32768))


def candidates(m: int, n: int, k: int) -> list[dict]:
    """The heuristic's config first, then single changes around it."""
    base = launch_config(m, n, k, DTYPE)
    bn, bk = base["BLOCK_N"], base["BLOCK_K"]
    changes = [dict(BLOCK_N=bn * 2), dict(BLOCK_N=bn // 2), dict(num_warps=8 if base["num_warps"] <= 4 else 4)]
    if base["USE_DOT"]:
        changes += [dict(BLOCK_K=bk * 2, num_stages=3), dict(num_stages=2), dict(SPLIT_K=2),
                    dict(BLOCK_N=bn * 4, SPLIT_K=4)]
    else:
        changes += [dict(BLOCK_K=bk * 2), dict(BLOCK_K=bk // 2, num_warps=2),
                    dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=max(16, bn), BLOCK_K=128, num_warps=4, num_stages=4)]
    out, seen = [base], {short(base)}
    for change in changes:
        cfg = {**base, **change}
        if fits(cfg, m, k) and short(cfg) not in seen:
            seen.add(short(cfg))
            out.append(cfg)
    return out


def bench(fn, calls: int, reps: int = 20) -> float:
    """Microseconds per call of fn (which makes `calls` calls): fn captured once in a CUDA graph, replayed
    back to back between two events (no launch gaps, as in a served decode step)."""
    fn()                                   # compile / warm outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()                         # first replay pays one-off costs
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * calls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=75.0, help="seconds of candidate sweeping (then heuristic only)")
    ap.add_argument("--only", default="", help="substring filter on shape names")
    ap.add_argument("--rows", default="1,4,16,64", help="comma-separated M values")
    ap.add_argument("--verbose", action="store_true", help="print every candidate's time")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True     # torch's default, as served
    t_start = time.time()
    print(f"{torch.cuda.get_device_name()}, {DTYPE}, times in us per call (CUDA-graph replays, W rotated past L2)")
    head = (f"{'shape':18} {'K->N':>11} {'M':>3} | {'heuristic':30} {'us':>6} | {'best bare config':30} {'us':>6} "
            f"{'W GB/s':>7} | {'F.linear':>8} | {'fused':16} {'heur':>6} {'best':>6} {'unfused':>8} {'x':>5}")
    print(head + "\n" + "-" * len(head))
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, k, n, fused in SHAPES:
        if args.only not in name:
            continue
        w_bytes = n * k * 2
        copies = max(1, min(64, -(-L2_BYTES // w_bytes)))
        ws = [(torch.randn(n, k, device="cuda", generator=g) * k ** -0.5).to(DTYPE) for _ in range(copies)]
        nw = torch.rand(k, device="cuda", generator=g).to(DTYPE) + 0.5
        bias = torch.randn(n, device="cuda", generator=g).to(DTYPE)
        for m in [int(r) for r in args.rows.split(",")]:
            gated = fused.startswith("gated")
            x = torch.randn(m, 2 * k if gated else k, device="cuda", generator=g).to(DTYPE)
            xk = x[:, :k].contiguous()                                  # the bare GEMM's input
            res = torch.randn(m, n, device="cuda", generator=g).to(DTYPE)
            kw = dict(norm_weight=nw if fused.startswith("norm") else None, gated=gated,
                      residual=res if "residual" in fused else None, bias=bias if fused == "bias" else None)

            def run_bare(cfg):
                return bench(lambda: [skinny_linear(xk, w, config=cfg) for w in ws], copies)

            def run_fused(cfg):
                return bench(lambda: [skinny_linear(x, w, config=cfg, **kw) for w in ws], copies)

            def unfused():
                for w in ws:
                    if kw["norm_weight"] is not None:
                        a = rms_norm(x, nw, 1e-6)
                    elif gated:
                        a = silu_mul(x[:, :k], x[:, k:])
                    else:
                        a = x
                    y = F.linear(a, w, kw["bias"])
                    if kw["residual"] is not None:
                        y = res + y
            cands = candidates(m, n, k)
            sweep = cands if time.time() - t_start < args.budget else cands[:1]
            times = []
            for cfg in sweep:
                try:
                    times.append((run_bare(cfg), cfg))
                except Exception as e:                                  # a candidate that fails to compile
                    print(f"  {name} M={m} {short(cfg)}: {type(e).__name__}: {str(e)[:100]}")
            heur_us = times[0][0] if times and times[0][1] is cands[0] else float("nan")
            best_us, best = min(times, key=lambda t: t[0]) if times else (float("nan"), cands[0])
            if args.verbose:
                for us, cfg in times:
                    print(f"    {'*' if cfg is cands[0] else ' '} {short(cfg):30} {us:7.2f}")
            lin_us = bench(lambda: [F.linear(xk, w) for w in ws], copies)
            fused_heur = run_fused(cands[0])
            fused_best = run_fused(best) if best is not cands[0] else fused_heur
            unfused_us = bench(unfused, copies)
            print(f"{name:18} {f'{k}->{n}':>11} {m:>3} | {short(cands[0]):30} {heur_us:6.2f} | {short(best):30} "
                  f"{best_us:6.2f} {w_bytes / best_us / 1e3:7.0f} | {lin_us:8.2f} | {fused:16} {fused_heur:6.2f} "
                  f"{fused_best:6.2f} {unfused_us:8.2f} {unfused_us / min(fused_heur, fused_best):5.2f}")
        del ws
    print(f"\n'x' = unfused torch sequence / best fused kernel. {time.time() - t_start:.0f} s in all.")


if __name__ == "__main__":
    main()
