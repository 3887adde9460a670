"""Times the code predictor's batch layer (voxflow/kernels/cp_layer_batch.py: five kernels a layer on tensor cores,
the norms folded into the weights, all with PDL) against the per-layer path it replaces above one row, on a GPU, at
the 1.7B shapes (hidden 1024, intermediate 3072, 16 q / 8 kv heads of 128), bf16.

1. Per GEMM at each --rows M: batch_linear.py with candidate configs around its launch_config (the heuristic's pick
   marked '*'), against the launches it replaces:
     qkv       normed (W * g)            vs  rms_norm + cuBLAS q|k|v
     gate_up   normed + silu * up        vs  rms_norm + cuBLAS gate|up + silu_mul
     o_proj    + residual                vs  cuBLAS + add
     down      + residual                vs  cuBLAS + add
     lm_head   normed                    vs  rms_norm + cuBLAS
   W rotated over enough copies to exceed the L2 cache (in a step every layer's W comes from HBM).
2. A frame's layer steps: 5 layers x 14 single-token steps, the per-layer path (Qwen3DecoderLayer.forward, kernels
   on) vs cp_layer_batch.layer_step, us per layer step.
3. CodePredictor.predict (15 codes of a frame, greedy) with CP_BATCH_LAYER off / on, us per frame, and the share
   of greedy codes equal between them (bf16: the folded weights round differently, so a few may differ).

Times: GPU times of back-to-back CUDA-graph replays (tune_skinny_linear.bench). Each candidate's output is checked
against the heuristic config's before it is timed.

    python benchmarks/scripts/tune_batch_linear.py [--rows 8,16,64,256] [--budget 120] [--verbose]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_cp_layer import (D, DTYPE, EPS, H, HKV, HQ, I, Rot, copies_for, frame_us, make_layers,  # noqa: E402
                           per_layer_step, rand, sweep, variants)
from tune_skinny_linear import bench  # noqa: E402

from voxflow.kernels import batch_linear as bl  # noqa: E402
from voxflow.kernels import cp_layer_batch  # noqa: E402
from voxflow.kernels.rms_norm import rms_norm  # noqa: E402
from voxflow.kernels.silu_mul import silu_mul  # noqa: E402

CANDIDATES = [dict(BLOCK_N=32), dict(BLOCK_N=64), dict(BLOCK_K=64), dict(num_stages=3), dict(num_stages=5),
              dict(num_warps=8), dict(BLOCK_N=32, num_warps=8), dict(BLOCK_M=16), dict(BLOCK_M=32),
              dict(BLOCK_M=128, num_warps=8), dict(BLOCK_N=64, BLOCK_K=64, num_stages=3)]


def gemm_sweeps(m: int, budget_end: float, verbose: bool) -> dict:
    best = {}
    x = rand(m, H, scale=3.0)
    nw = (torch.rand(H, device="cuda") + 0.5).to(DTYPE)
    for name, n, k, mode in (("qkv", (HQ + 2 * HKV) * D, H, "norm"), ("gate_up", I, H, "swiglu"),
                             ("o_proj", H, HQ * D, "residual"), ("down", H, I, "residual"),
                             ("lm_head", 2048, H, "norm")):
        rows = 2 * n if mode == "swiglu" else n
        ws = Rot([rand(rows, k, scale=k ** -0.5) for _ in range(copies_for(rows * k * 2))])
        inp = x if k == H else rand(m, k)
        res = rand(m, n, scale=4.0)
        cands = variants(bl.launch_config(m, n, k, mode == "swiglu"), CANDIDATES)
        if mode == "residual":
            new = lambda cfg, inp=inp, ws=ws, res=res: (      # noqa: E731
                lambda: bl.batch_linear(inp, ws.next(), residual=res, config=cfg))
            old = lambda inp=inp, ws=ws, res=res: res + F.linear(inp, ws.next())      # noqa: E731
        else:
            swiglu = mode == "swiglu"
            new = lambda cfg, ws=ws, swiglu=swiglu: (      # noqa: E731  (folding is a load-time cost: not timed)
                lambda: bl.batch_linear(x, ws.next(), norm_eps=EPS, swiglu=swiglu, config=cfg))

            def old(ws=ws, swiglu=swiglu, n=n):
                y = F.linear(rms_norm(x, nw, EPS), ws.next())
                return silu_mul(y[:, :n], y[:, n:]) if swiglu else y
        best[name] = sweep(f"{name} m={m}", cands, new, old, len(ws.items), budget_end, verbose)
    return best


@torch.no_grad()
def layer_steps(m: int) -> tuple[float, float]:
    """us per layer step: 5 layers x 14 single-token steps (cache lengths 1..14), per-layer path vs batch layer."""
    layers = make_layers()
    weights = []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        weights.append(cp_layer_batch.fold_layer(
            attn.fused_qkv(), layer.input_layernorm, attn.q_norm, attn.k_norm, attn.o_proj.weight,
            mlp.fused_gate_up(), layer.post_attention_layernorm, mlp.down_proj.weight, HQ, HKV, D, D ** -0.5))
    old = frame_us(layers, m, per_layer_step(layers))
    new = frame_us(layers, m, lambda i, x, cos, sin, c: cp_layer_batch.layer_step(x, weights[i], cos, sin, c.k, c.v,
                                                                                  c.claim()))
    return old, new


@torch.no_grad()
def predict_frames(m: int) -> tuple[float, float, float]:
    """us per CodePredictor.predict (greedy) with CP_BATCH_LAYER off / on, and the share of equal codes."""
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
    from cp_layer_reference import make_code_predictor
    cp = make_code_predictor(DTYPE, "cuda")
    h, c0 = rand(m, 2048), rand(m, 2048)
    saved = cp_mod.CP_BATCH_LAYER
    times, codes = [], []
    try:
        for on in (False, True):
            cp_mod.CP_BATCH_LAYER = on
            out = {}

            def frame():
                out["codes"] = cp.predict(h, c0, lambda logits, j: logits.argmax(-1))[0]
            times.append(bench(frame, 1))
            codes.append(out["codes"].clone())
    finally:
        cp_mod.CP_BATCH_LAYER = saved
    return times[0], times[1], (codes[0] == codes[1]).float().mean().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="8,16,64,256", help="comma-separated row counts")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds of candidate sweeping (then heuristic only)")
    ap.add_argument("--verbose", action="store_true", help="print every candidate's time")
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{torch.cuda.get_device_name()}, {DTYPE}, us per call (CUDA-graph replays, W rotated past L2)")
    print(f"\n{'gemm':22} | {'heuristic':34} {'us':>6} | {'best':34} {'us':>6} | {'old':>10} | {'x':>7}")
    for m in rows:
        b = gemm_sweeps(m, t0 + args.budget, args.verbose)
        layer = ("qkv", "gate_up", "o_proj", "down")
        print(f"  m={m}: the four GEMMs of a layer, heuristic {sum(b[k][2] for k in layer):.2f} us, best "
              f"{sum(b[k][1] for k in layer):.2f} us, old sequences {sum(b[k][3] for k in layer):.2f} us")
    print(f"\n{'rows':>4} | {'per-layer step':>14} | {'batch step':>10} | {'x':>5}    (5 layers x 14 steps, graph)")
    for m in rows:
        old, new = layer_steps(m)
        print(f"{m:4d} | {old:14.2f} | {new:10.2f} | {old / new:5.2f}")
    print(f"\n{'rows':>4} | {'predict off us':>14} | {'on us':>8} | {'x':>5} | codes equal")
    for m in rows:
        off, on, equal = predict_frames(m)
        print(f"{m:4d} | {off:14.1f} | {on:8.1f} | {off / on:5.2f} | {equal:.1%}")
    print(f"\ndone in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
