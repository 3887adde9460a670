"""Whether the talker's one-row decoder layers should fold their norms into the q|k|v and gate|up GEMMs
(voxflow/layers/qwen3_layer.py ONE_ROW_NORM_LINEAR, voxflow/kernels/norm_linear.py), on a GPU at the 1.7B talker's
widths (hidden 2048, intermediate 6144, 16 q / 8 kv heads of 128), bf16, one row:

1. per kernel (tune_cp_layer.kernel_sweeps at these widths: candidates around norm_linear's launch_config against
   the launches they replace; its qkv, gate_up and down rows are the ones that matter here; attn+o_proj and lm_head
   are the code predictor's kernels at this width, for reference only);
2. a layer step of Qwen3DecoderLayer at one row with the switch off (rms_norm + cuBLAS q|k|v, rms_norm + cuBLAS
   gate|up, down_proj with the silu * up prologue) and on (norm_linear q|k|v, norm_linear gate|up with silu * up,
   plain down_proj): 8 layers with distinct weights x 14 steps on a static KV cache (the attention is the same
   kernel either way), us per layer step; times 28 = what a talker step would gain.

Times are GPU times of back-to-back CUDA-graph replays (tune_skinny_linear.bench), W rotated past L2.

    python benchmarks/scripts/tune_talker_one_row.py [--budget 60] [--skip-sweep]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_cp_layer as cp  # noqa: E402  (the same sweeps, weights and timing)

import voxflow.layers.qwen3_layer as layer_mod  # noqa: E402

TALKER_H, TALKER_I, LAYERS = 2048, 6144, 8


def layer_step_us(one_row_norm_linear: bool, layers) -> float:
    saved = layer_mod.ONE_ROW_NORM_LINEAR
    layer_mod.ONE_ROW_NORM_LINEAR = one_row_norm_linear
    try:
        return cp.frame_us(layers, 1, cp.per_layer_step(layers))
    finally:
        layer_mod.ONE_ROW_NORM_LINEAR = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=60.0, help="seconds of candidate sweeping")
    ap.add_argument("--skip-sweep", action="store_true", help="only the layer-step timing")
    args = ap.parse_args()
    cp.H, cp.I = TALKER_H, TALKER_I
    torch.manual_seed(0)
    t0 = time.time()
    print(f"{torch.cuda.get_device_name()}, {cp.DTYPE}, one row, hidden {cp.H}, intermediate {cp.I}, us "
          f"(CUDA-graph replays, W rotated past L2)")
    if not args.skip_sweep:
        print(f"\n{'kernel':22} | {'heuristic':34} {'us':>6} | {'best':34} {'us':>6} | {'old':>10} | {'x':>7}")
        cp.kernel_sweeps(1, t0 + args.budget, False)
    layers = cp.make_layers(LAYERS)
    off = layer_step_us(False, layers)
    on = layer_step_us(True, layers)
    print(f"\nlayer step, one row: switch off {off:.2f} us, on {on:.2f} us (x{off / on:.2f}); "
          f"a 28-layer talker step: {28 * (off - on):+.0f} us saved")
    print(f"{time.time() - t0:.0f} s in all.")


if __name__ == "__main__":
    main()
