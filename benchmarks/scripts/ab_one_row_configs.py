"""A / B of the one-row launch heuristics in a real sequence (session 11): the isolated-kernel tunes
(tune_cp_layer / tune_talker_one_row) picked 8-warp norm_linear GEMMs, ~N/512-column skinny programs and 4-head x
32-column attention_o_proj tiles, but in a CUDA graph with programmatic dependent launch a whole frame got slower
(H200, session 11 call 2: c=1 step 4.14 ms against ~3.7). This times each heuristic change on its own against the
session-10 heuristics ("old", reproduced below as they were at 69faf47):

    python benchmarks/scripts/ab_one_row_configs.py                  # per variant: CP predict (fused layers off /
                                                                     # on) and the talker's one-row layer step
    python benchmarks/scripts/ab_one_row_configs.py --variant NAME -- SCRIPT ARGS...   # run SCRIPT under NAME

Variants: new (today's heuristics), old, and old plus one of: norm_linear, skinny, attention (the new heuristic
of that module only).
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys

import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from voxflow.kernels import attention_o_proj, norm_linear, skinny_linear  # noqa: E402

NEW = {"norm_linear": norm_linear.launch_config, "skinny": skinny_linear.launch_config,
       "attention": attention_o_proj.launch_config}


def old_norm_linear(m, n, k, swiglu=False):
    tiles = 2 if swiglu else 1
    block_m = triton.next_power_of_2(m)
    block_n = 8 if 2048 <= n * tiles < 4096 else 4
    block_k = min(k & -k, max(16, 8192 // (tiles * 8 * block_m)))
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=2)


def old_skinny(m, n, k, dtype):
    cfg = NEW["skinny"](m, n, k, dtype)
    if m == 1:
        block_n = min(64, max(8, skinny_linear._pow2_floor(n // 128)))
        cfg.update(BLOCK_N=block_n, BLOCK_K=min(k & -k, 1024, max(32, 16384 // block_n)))
    return cfg


def old_attention(n, num_heads):
    return dict(BLOCK_N=min(64, max(16, triton.next_power_of_2(n) // 16)), BLOCK_H=min(2, num_heads & -num_heads),
                num_warps=4)


OLD = {"norm_linear": old_norm_linear, "skinny": old_skinny, "attention": old_attention}
MODULES = {"norm_linear": norm_linear, "skinny": skinny_linear, "attention": attention_o_proj}
VARIANTS = ["new", "old", "old+norm_linear", "old+skinny", "old+attention"]


def apply(variant: str) -> None:
    for name, mod in MODULES.items():
        use_new = variant == "new" or variant == f"old+{name}"
        mod.launch_config = NEW[name] if use_new else OLD[name]
    from voxflow.kernels import cp_layer      # session 10's override of the code predictor's down_proj (4 columns)
    cp_layer.CONFIGS["down"] = dict(BLOCK_N=4) if variant.startswith("old") else None


def measure() -> None:
    import torch
    import tune_cp_layer as cp
    import tune_talker_one_row as talker
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, bf16, one row, us (CUDA-graph replays)")
    print(f"{'variant':16} | {'CP predict, fused off':>21} | {'fused on':>8} | {'talker layer step':>17} | "
          f"{'predict + 28 steps':>18}")
    cp_layers, best = None, None
    for variant in VARIANTS:
        apply(variant)
        cp.H, cp.I = 1024, 3072
        (off, on), _, _ = cp.predict_frames(1)
        cp.H, cp.I = talker.TALKER_H, talker.TALKER_I
        if cp_layers is None:
            cp_layers = cp.make_layers(talker.LAYERS)
        step = talker.layer_step_us(True, cp_layers)
        total = min(off, on) + 28 * step
        print(f"{variant:16} | {off:21.1f} | {on:8.1f} | {step:17.2f} | {total:18.1f}", flush=True)
        if best is None or total < best[0]:
            best = (total, variant, int(on < off))
    print(f"best: {best[1]} with the fused code-predictor layers {'on' if best[2] else 'off'}")
    if os.environ.get("AB_BEST"):       # "VARIANT FUSED" for a device script to run profile_step with
        with open(os.environ["AB_BEST"], "w") as f:
            f.write(f"{best[1]} {best[2]}\n")


def main() -> None:
    argv = sys.argv[1:]
    script = []
    if "--" in argv:
        i = argv.index("--")
        argv, script = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=VARIANTS)
    args = ap.parse_args(argv)
    if not script:
        measure()
        return
    apply(args.variant or "new")
    sys.argv = script
    runpy.run_path(script[0], run_name="__main__")


if __name__ == "__main__":
    main()
