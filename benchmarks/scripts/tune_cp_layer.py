"""Times the code predictor's four-kernel decode layer (voxflow/kernels/cp_layer.py) against the seven-kernel one it
replaces, on a GPU, at the 1.7B shapes (hidden 1024, intermediate 3072, 16 q / 8 kv heads of 128), bf16.

1. Per kernel, M = 1 (and --rows): each new kernel with a handful of candidate configs around its launch_config
   (the heuristic's pick marked '*'), against the launches it replaces:
     qkv        norm_linear (norm folded into the GEMM)          vs  rms_norm + cuBLAS q|k|v
     attn+o     attention_o_proj (q/k norm, RoPE, append,         vs  dense_decode_norm_rope + skinny o_proj
                attention, o_proj, residual; cache length 8)
     gate_up    norm_linear swiglu (act = silu(gate) * up)        vs  rms_norm + cuBLAS gate|up
     down       skinny_linear plain + residual (reads act)        vs  skinny_linear gated + residual (reads gate|up)
     lm_head    norm_linear                                       vs  skinny_linear with its norm prologue
   W rotated over enough copies to exceed the L2 cache (in a step every layer's W comes from HBM).
2. A whole frame's layer steps: 5 layers x 14 single-token steps (cache lengths 1..14, distinct weights per layer),
   old layer (Qwen3DecoderLayer.forward, kernels on) vs new (cp_layer.layer_step), us per layer step.
3. CodePredictor.predict (15 codes of a frame, greedy) with CP_FUSED_LAYER off / on, us per frame.

Times are GPU times of back-to-back CUDA-graph replays (tune_skinny_linear.bench). Each candidate's output is
checked against the heuristic config's (bf16 tolerance) before it is timed. At the end: the best configs as a
dict for voxflow/kernels/cp_layer.py's CONFIGS (only where they beat the heuristic by > 3%).

    python benchmarks/scripts/tune_cp_layer.py [--rows 1,2,4] [--budget 120] [--skip-sweep] [--verbose]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_skinny_linear import bench  # noqa: E402  (same timing method)

from voxflow.kernels import attention_o_proj as attn  # noqa: E402
from voxflow.kernels import cp_layer  # noqa: E402
from voxflow.kernels import norm_linear as nl  # noqa: E402
from voxflow.kernels import skinny_linear as sk  # noqa: E402
from voxflow.kernels.dense_decode_norm_rope import norm_rope_attend_append  # noqa: E402
from voxflow.kernels.rms_norm import rms_norm  # noqa: E402

DTYPE = torch.bfloat16
DEVICE = "cuda"
H, I, HQ, HKV, D, L, EPS = 1024, 3072, 16, 8, 128, 16, 1e-6
L2_BYTES = 128 << 20


def variants(base: dict, changes: list[dict]) -> list[dict]:
    out, seen = [base], {tuple(sorted(base.items()))}
    for c in changes:
        cfg = {**base, **c}
        key = tuple(sorted(cfg.items()))
        if key not in seen:
            seen.add(key)
            out.append(cfg)
    return out


def short(cfg: dict) -> str:
    names = dict(BLOCK_N="n", BLOCK_K="k", BLOCK_H="h", num_warps="w", num_stages="s", BLOCK_M="m", USE_DOT="dot")
    return " ".join(f"{names.get(k, k)}{int(v)}" for k, v in cfg.items() if k != "SPLIT_K")


def rand(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(DTYPE)


def copies_for(nbytes: int) -> int:
    return max(2, min(64, -(-L2_BYTES // nbytes)))


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a.float() - b.float()).abs() <= 2.0 ** -6 * b.float().abs().max() + 1e-3).all())


def sweep(label: str, configs: list[dict], make_call, old_call, calls: int, budget_end: float, verbose: bool):
    """Times make_call(cfg) per candidate (checked against the first), and old_call; prints one row; returns
    (best cfg, best us, heuristic us, old us)."""
    with Rot.pinned():
        ref = make_call(configs[0])().clone()
    times = []
    for i, cfg in enumerate(configs):
        if i and time.time() > budget_end:
            break
        try:
            fn = make_call(cfg)
            with Rot.pinned():
                ok = i == 0 or close(fn(), ref)
            if not ok:
                print(f"  {label} {short(cfg)}: WRONG RESULT (skipped)")
                continue
            times.append((bench(lambda: fn_loop(fn, calls), calls), cfg))
        except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or launch
            print(f"  {label} {short(cfg)}: {type(e).__name__}: {str(e)[:120]}")
    old_us = bench(lambda: fn_loop(old_call, calls), calls)
    heur = times[0][0] if times and times[0][1] is configs[0] else float("nan")
    best_us, best = min(times, key=lambda t: t[0]) if times else (float("nan"), configs[0])
    if verbose:
        for us, cfg in times:
            print(f"    {'*' if cfg is configs[0] else ' '} {short(cfg):34} {us:7.2f}")
    print(f"{label:22} | {short(configs[0]):34} {heur:6.2f} | {short(best):34} {best_us:6.2f} | old {old_us:6.2f} "
          f"| x {old_us / best_us:5.2f}")
    return best, best_us, heur, old_us


def fn_loop(fn, calls):
    for _ in range(calls):
        fn()


class Rot:
    """Round-robin over weight copies, advanced once per call (captured: each replay walks all copies); inside
    `Rot.pinned()` every Rot gives its first copy (the correctness check compares candidates on one weight)."""
    _pinned = False

    def __init__(self, items):
        self.items, self.i = items, 0

    def next(self):
        if Rot._pinned:
            return self.items[0]
        item = self.items[self.i]
        self.i = (self.i + 1) % len(self.items)
        return item

    @staticmethod
    @contextlib.contextmanager
    def pinned():
        Rot._pinned = True
        try:
            yield
        finally:
            Rot._pinned = False


def kernel_sweeps(m: int, budget_end: float, verbose: bool) -> dict:
    best = {}
    x = rand(m, H, scale=3.0)
    nw = (torch.rand(H, device=DEVICE) + 0.5).to(DTYPE)

    # q|k|v: norm folded into the GEMM vs rms_norm + cuBLAS
    n_qkv = (HQ + 2 * HKV) * D
    ws = Rot([rand(n_qkv, H, scale=H ** -0.5) for _ in range(copies_for(n_qkv * H * 2))])
    base = nl.launch_config(m, n_qkv, H)
    cands = variants(base, [dict(BLOCK_N=4), dict(BLOCK_N=16), dict(BLOCK_N=16, num_warps=8), dict(BLOCK_K=512),
                            dict(BLOCK_N=16, BLOCK_K=512), dict(num_warps=8), dict(num_warps=2), dict(num_stages=1),
                            dict(BLOCK_N=32, num_warps=8), dict(BLOCK_K=256, num_stages=3)])
    n_copies = len(ws.items)
    best["qkv"] = sweep(f"qkv m={m}", cands, lambda cfg: (lambda: nl.norm_linear(x, ws.next(), nw, EPS, config=cfg)),
                        lambda: F.linear(rms_norm(x, nw, EPS), ws.next()), n_copies, budget_end, verbose)

    # gate|up + silu*up, then down + residual (old: rms_norm + cuBLAS gate|up, down with the silu*up prologue)
    wgu = Rot([rand(2 * I, H, scale=H ** -0.5) for _ in range(copies_for(2 * I * H * 2))])
    base = nl.launch_config(m, I, H, swiglu=True)
    cands = variants(base, [dict(BLOCK_N=4), dict(BLOCK_N=4, BLOCK_K=1024), dict(BLOCK_K=1024),
                            dict(BLOCK_K=1024, num_warps=8), dict(BLOCK_K=256), dict(num_stages=1),
                            dict(num_stages=3, BLOCK_K=256), dict(BLOCK_N=16, num_warps=8), dict(num_warps=8)])
    n_copies = len(wgu.items)
    best["gate_up"] = sweep(f"gate_up m={m}", cands,
                            lambda cfg: (lambda: nl.norm_linear(x, wgu.next(), nw, EPS, swiglu=True, config=cfg)),
                            lambda: F.linear(rms_norm(x, nw, EPS), wgu.next()), n_copies, budget_end, verbose)

    wd = Rot([rand(H, I, scale=I ** -0.5) for _ in range(copies_for(H * I * 2))])
    act = rand(m, I)
    gate_up = rand(m, 2 * I)
    res = rand(m, H, scale=4.0)
    base = sk.launch_config(m, H, I, DTYPE)
    cands = variants(base, [dict(BLOCK_N=4), dict(BLOCK_N=16), dict(BLOCK_K=512), dict(num_warps=8),
                            dict(BLOCK_N=4, BLOCK_K=512), dict(num_stages=1), dict(BLOCK_N=16, num_warps=8),
                            dict(USE_DOT=True, BLOCK_M=16, BLOCK_N=16, BLOCK_K=128, num_warps=4, num_stages=4)])
    n_copies = len(wd.items)
    best["down"] = sweep(f"down m={m}", cands,
                         lambda cfg: (lambda: sk.skinny_linear(act, wd.next(), residual=res, config=cfg)),
                         lambda: sk.skinny_linear(gate_up, wd.next(), gated=True, residual=res), n_copies,
                         budget_end, verbose)

    # attention + o_proj + residual (cache length 8) vs the fused norm/RoPE/attention kernel + skinny o_proj
    wo = Rot([rand(H, HQ * D, scale=(HQ * D) ** -0.5) for _ in range(copies_for(H * HQ * D * 2))])
    qkv = rand(m, n_qkv, scale=2.0)
    qw, kw = nw[:D].clone(), nw[D:2 * D].clone()
    cos, sin = torch.rand(1, 1, D, device=DEVICE).to(DTYPE), torch.rand(1, 1, D, device=DEVICE).to(DTYPE)
    kc, vc = rand(m, HKV, L, D), rand(m, HKV, L, D)
    length = 8
    q4 = qkv[:, :HQ * D].view(m, 1, HQ, D)
    k4 = qkv[:, HQ * D:(HQ + HKV) * D].view(m, 1, HKV, D)
    v4 = qkv[:, (HQ + HKV) * D:].view(m, 1, HKV, D)

    def old_attn():
        out = norm_rope_attend_append(q4, k4, v4, qw, kw, EPS, EPS, cos, sin, kc, vc, length, D ** -0.5)
        return sk.skinny_linear(out.reshape(m, -1), wo.next(), residual=res)
    base = attn.launch_config(H, HQ)
    cands = variants(base, [dict(BLOCK_N=32), dict(BLOCK_N=128), dict(BLOCK_H=1, BLOCK_N=64),
                            dict(BLOCK_H=1, BLOCK_N=128), dict(BLOCK_H=4, BLOCK_N=32), dict(BLOCK_H=4, BLOCK_N=64),
                            dict(BLOCK_H=4, BLOCK_N=128, num_warps=8),
                            dict(num_warps=8), dict(num_warps=2), dict(BLOCK_N=16), dict(BLOCK_H=8, BLOCK_N=16),
                            dict(BLOCK_H=16, BLOCK_N=8)])
    n_copies = len(wo.items)
    best["attention_o_proj"] = sweep(
        f"attn+o_proj m={m}", cands,
        lambda cfg: (lambda: attn.attention_o_proj(qkv, res, wo.next(), qw, kw, EPS, EPS, cos, sin, kc, vc, length,
                                                   HQ, D ** -0.5, config=cfg)),
        old_attn, n_copies, budget_end, verbose)

    # lm_head (norm folded) vs skinny_linear's norm prologue
    wh = Rot([rand(2048, H, scale=H ** -0.5) for _ in range(copies_for(2048 * H * 2))])
    base = nl.launch_config(m, 2048, H)
    cands = variants(base, [dict(BLOCK_N=4), dict(BLOCK_N=16), dict(BLOCK_K=512), dict(num_warps=8),
                            dict(num_warps=2)])
    n_copies = len(wh.items)
    best["lm_head"] = sweep(f"lm_head m={m}", cands,
                            lambda cfg: (lambda: nl.norm_linear(x, wh.next(), nw, EPS, config=cfg)),
                            lambda: sk.skinny_linear(x, wh.next(), norm_weight=nw, eps=EPS), n_copies, budget_end,
                            verbose)
    return best


def make_layers(n: int = 5):
    from voxflow.layers.qwen3_layer import Qwen3DecoderLayer
    layers = []
    for _ in range(n):
        layer = Qwen3DecoderLayer(H, I, HQ, HKV, D, EPS)
        for name, p in layer.named_parameters():
            if name.endswith("norm.weight"):
                p.data.uniform_(0.5, 1.5)
            else:
                p.data.normal_(0, p.shape[1] ** -0.5)
        layers.append(layer.to(device=DEVICE, dtype=DTYPE).eval())
    return layers


@torch.no_grad()
def frame_us(layers, m: int, step) -> float:
    """us per layer step of a frame: len(layers) layers x 14 single-token steps (cache lengths 1..14) on a static KV
    cache, rows [m, H]; step(layer index, x, cos, sin, layer cache) -> new x."""
    from voxflow.layers.rotary import RotaryEmbedding
    from voxflow.layers.static_kv_cache import StaticKVCache
    cos_all, sin_all = RotaryEmbedding(D, 1e6, 4096).to(DEVICE).prefix(L, torch.device(DEVICE), DTYPE)
    x0 = rand(m, H, scale=4.0)
    cache = StaticKVCache(len(layers), m, HKV, L, D, DTYPE, torch.device(DEVICE))
    for c in cache.layers:
        c.k.normal_()
        c.v.normal_()

    def frame():
        for c in cache.layers:
            c.length = 1
        x = x0
        for t in range(1, 15):
            cos, sin = cos_all[:, t:t + 1], sin_all[:, t:t + 1]
            for i, c in enumerate(cache.layers):
                x = step(i, x, cos, sin, c)
        return x
    return bench(frame, 14 * len(layers))


def per_layer_step(layers):
    """frame_us's step through Qwen3DecoderLayer.forward (the per-layer path, kernels on)."""
    return lambda i, x, cos, sin, c: layers[i](x[:, None], cos, sin, c, None)[:, 0]


@torch.no_grad()
def layer_steps(m: int) -> tuple[float, float]:
    """us per layer step: 5 layers x 14 single-token steps (cache lengths 1..14), old vs new."""
    from voxflow.models.qwen3_tts.code_predictor import _layer_weights
    layers = make_layers()
    weights = [_layer_weights(layer) for layer in layers]
    old = frame_us(layers, m, per_layer_step(layers))
    new = frame_us(layers, m, lambda i, x, cos, sin, c: cp_layer.layer_step(x, weights[i], cos, sin, c.k, c.v,
                                                                            c.claim()))
    return old, new


@torch.no_grad()
def predict_frames(m: int) -> tuple[list[float], list[bool], list[torch.Tensor]]:
    """us per CodePredictor.predict (one frame: 15 codes) for: CP_FUSED_LAYER off, on (four kernels a layer); and
    whether each variant's greedy codes equal the first's; and those codes."""
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.models.qwen3_tts.config import CodePredictorConfig
    cfg = CodePredictorConfig(hidden_size=H, intermediate_size=I, num_hidden_layers=5, num_attention_heads=HQ,
                              num_key_value_heads=HKV, head_dim=D, rms_norm_eps=EPS, rope_theta=1e6,
                              max_position_embeddings=65536, vocab_size=2048, num_code_groups=16)
    cp = cp_mod.CodePredictor(cfg, talker_hidden_size=2048)
    for name, p in cp.named_parameters():
        if name.endswith("norm.weight"):
            p.data.uniform_(0.5, 1.5)
        elif p.dim() == 2:
            p.data.normal_(0, p.shape[1] ** -0.5)
    cp = cp.to(device=DEVICE, dtype=DTYPE).eval()
    h, c0 = rand(m, 2048), rand(m, 2048)
    saved = cp_mod.CP_FUSED_LAYER, cp_mod.CP_FUSED_MAX_ROWS
    times, codes = [], []
    try:
        for fused in (False, True):
            cp_mod.CP_FUSED_LAYER = fused
            cp_mod.CP_FUSED_MAX_ROWS = max(m, saved[1])
            out = {}

            def frame():
                out["codes"] = cp.predict(h, c0, lambda logits, j: logits.argmax(-1))[0]
            times.append(bench(frame, 1))
            codes.append(out["codes"].clone())                # (after the last replay of the graph)
    finally:
        cp_mod.CP_FUSED_LAYER, cp_mod.CP_FUSED_MAX_ROWS = saved
    return times, [torch.equal(c, codes[0]) for c in codes], codes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1", help="comma-separated row counts (decode batch of the code predictor)")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds of candidate sweeping (then heuristic only)")
    ap.add_argument("--skip-sweep", action="store_true", help="only the layer and predict timings")
    ap.add_argument("--verbose", action="store_true", help="print every candidate's time")
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()
    print(f"{torch.cuda.get_device_name()}, {DTYPE}, us per call (CUDA-graph replays, W rotated past L2)")
    rows = [int(r) for r in args.rows.split(",")]
    bests = {}
    if not args.skip_sweep:
        print(f"\n{'kernel':22} | {'heuristic':34} {'us':>6} | {'best':34} {'us':>6} | {'old':>10} | {'x':>7}")
        for m in rows:
            bests[m] = kernel_sweeps(m, t0 + args.budget, args.verbose)
            b = bests[m]
            new = sum(b[k][1] for k in ("qkv", "attention_o_proj", "gate_up", "down"))
            old = sum(b[k][3] for k in ("qkv", "attention_o_proj", "gate_up", "down"))
            print(f"  m={m}: sum of the four new kernels (best) {new:.2f} us vs the old sequences {old:.2f} us "
                  f"per layer step (isolated calls)")
    print(f"\n{'rows':>4} | {'old layer step':>14} | {'new layer step':>14} | {'x':>5}    (5 layers x 14 steps, graph)")
    for m in rows:
        old, new = layer_steps(m)
        print(f"{m:>4} | {old:14.2f} | {new:14.2f} | {old / new:5.2f}")
    print(f"\n{'rows':>4} | {'predict, fused off':>18} | {'4 kernels/layer':>15} | same greedy codes")
    for m in rows:
        (old, new), same, _ = predict_frames(m)
        print(f"{m:>4} | {old:18.1f} | {new:9.1f} x{old / new:4.2f} | {same[1]}")
    for m, b in bests.items():
        cfgs = {k: v[0] for k, v in b.items() if v[1] < 0.97 * v[2]}
        print(f"\nm={m}: configs that beat the heuristic by > 3% (cp_layer.CONFIGS): {cfgs or 'none'}")
    print(f"\n{time.time() - t0:.0f} s in all.")


if __name__ == "__main__":
    main()
