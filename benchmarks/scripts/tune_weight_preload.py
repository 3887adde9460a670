"""The weight preload (voxflow/kernels/pdl.py, VOXFLOW_PDL_PRELOAD) off / on for the one-row GEMM kernels on a GPU,
at the 1.7B shapes, bf16, CUDA-graph replays, W rotated past L2 (tune_cp_layer.py's timings), us:

1. the code predictor's fused layer step (cp_layer: 5 layers x 14 steps) and a whole CodePredictor.predict frame
   (15 codes, greedy), and whether its codes equal the preload-off codes (they must: the same loads, earlier);
2. the same with gate|up taking its whole K = 1024 in one step (so all of its weights are preloaded);
3. the talker's one-row layer step (hidden 2048, intermediate 6144, 8 layers x 14 steps) off / on.

Session 28 call 3 also ran a --roles mode (the predict frame with the preload forced on per code-predictor GEMM role,
through a cp_layer.PRELOAD table and VOXFLOW_CP_PRELOAD): every role lost, and both were removed after the call; the
code is in b0af70a.

    python benchmarks/scripts/tune_weight_preload.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_cp_layer as cp  # noqa: E402  (the same layers, weights and timing)

from voxflow.kernels import cp_layer, pdl, pdl_enabled  # noqa: E402


def cp_rows(label: str) -> torch.Tensor:
    torch.manual_seed(0)
    _, fused_step = cp.layer_steps(1)
    torch.manual_seed(0)
    (_, predict), _, codes = cp.predict_frames(1)
    print(f"{label:34} | {fused_step:10.2f} | {predict:13.1f}", flush=True)
    return codes[1]


def main() -> None:
    assert pdl_enabled(), "PDL is off (VOXFLOW_PDL=0): the preload needs it"
    saved = pdl._preload, pdl.PRELOAD_MIN_WIDTH
    try:
        run()
    finally:
        pdl.set_weight_preload(saved[0])
        pdl.PRELOAD_MIN_WIDTH = saved[1]


def run() -> None:
    pdl.PRELOAD_MIN_WIDTH = 0          # every width, as session 28 call 1 ran it (the default is the talker's)
    print(f"{torch.cuda.get_device_name()}, {cp.DTYPE}, one row, us (CUDA-graph replays, W rotated past L2)")
    print(f"{'code predictor':34} | {'fused step':>10} | {'predict fused':>13}")
    codes = {}
    for on in (False, True):
        pdl.set_weight_preload(on)
        codes[on] = cp_rows(f"preload {'on' if on else 'off'}")
    saved = dict(cp_layer.CONFIGS)
    cp_layer.CONFIGS["gate_up"] = dict(BLOCK_K=1024)
    try:
        for on in (False, True):
            pdl.set_weight_preload(on)
            codes[("whole", on)] = cp_rows(f"preload {'on' if on else 'off'}, gate|up whole K")
    finally:
        cp_layer.CONFIGS.update(saved)
    print("codes equal to preload off:", {str(k): torch.equal(v, codes[False]) for k, v in codes.items()})

    cp.H, cp.I = 2048, 6144
    torch.manual_seed(0)
    layers = cp.make_layers(8)
    for on in (False, True):
        pdl.set_weight_preload(on)
        us = cp.frame_us(layers, 1, cp.per_layer_step(layers))
        print(f"talker one-row layer step, preload {'on' if on else 'off'}: {us:.2f} us", flush=True)


if __name__ == "__main__":
    main()
