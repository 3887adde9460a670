"""The weight prefetch on a side branch (VOXFLOW_L2_PREFETCH, voxflow/kernels/l2_prefetch.py) for the code
predictor's fused one-row layers: a whole CodePredictor.predict (one frame, 15 codes) at the 1.7B shapes, bf16,
CUDA-graph replays (tune_cp_layer.py's timing), us, for 0 (off) and 1..3 kernels ahead; and whether the greedy codes
equal those with it off (they must: a prefetch changes no arithmetic).

    python benchmarks/scripts/tune_l2_prefetch.py [--ahead 0,1,2,3]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_cp_layer as cp  # noqa: E402  (the same predictor, weights and timing)

from voxflow.kernels import l2_prefetch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ahead", default="0,1,2,3", help="comma-separated kernels-ahead counts (0: off)")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, {cp.DTYPE}, one row, us per predict (CUDA-graph replays)")
    first = None
    for ahead in [int(a) for a in args.ahead.split(",")]:
        l2_prefetch.AHEAD = ahead
        torch.manual_seed(0)
        (_, fused), _, codes = cp.predict_frames(1)
        first = codes[1] if first is None else first
        print(f"ahead {ahead}: predict (fused layers) {fused:8.1f} us; codes == the first setting's: "
              f"{torch.equal(codes[1], first)}", flush=True)


if __name__ == "__main__":
    main()
