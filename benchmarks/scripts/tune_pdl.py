"""Programmatic dependent launch off / on (VOXFLOW_PDL, voxflow/kernels/pdl.py) for the code predictor's decode
kernels on a GPU: a frame's 70 layer steps (the per-layer path and cp_layer's fused one) and a whole
CodePredictor.predict, at the 1.7B shapes, bf16, CUDA-graph replays (tune_cp_layer.py's timings), us; and whether
predict's greedy codes (per-layer path, fused path) are the same with PDL on as off (they must be: PDL changes no
arithmetic).

    python benchmarks/scripts/tune_pdl.py [--rows 1,4]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_cp_layer as cp  # noqa: E402  (the same layers, weights and timing)

from voxflow.kernels import pdl_enabled, set_pdl_enabled  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,4", help="comma-separated row counts")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, {cp.DTYPE}, us (CUDA-graph replays, W rotated past L2)")
    print(f"{'rows':>4} | {'PDL':>3} | {'per-layer step':>14} | {'fused step':>10} | {'predict off':>11} | "
          f"{'predict fused':>13} | codes (per-layer, fused) == PDL off")
    saved = pdl_enabled()
    for m in [int(r) for r in args.rows.split(",")]:
        codes = {}
        for on in (False, True):
            set_pdl_enabled(on)
            torch.manual_seed(0)
            old, new = cp.layer_steps(m)
            (p_off, p_fused), _, codes[on] = cp.predict_frames(m)
            same = "" if not on else str([torch.equal(a, b) for a, b in zip(codes[True], codes[False])])
            print(f"{m:>4} | {'on' if on else 'off':>3} | {old:14.2f} | {new:10.2f} | {p_off:11.1f} | {p_fused:13.1f} | "
                  f"{same}")
    set_pdl_enabled(saved)


if __name__ == "__main__":
    main()
