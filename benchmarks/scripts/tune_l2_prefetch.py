"""The weight prefetch on a side branch (VOXFLOW_L2_PREFETCH, voxflow/kernels/l2_prefetch.py) for the code
predictor's fused one-row layers: a whole CodePredictor.predict (one frame, 15 codes) at the 1.7B shapes, bf16,
CUDA-graph replays (tune_cp_layer.py's timing), us, for 0 (off) and 1..3 kernels ahead; and whether the greedy codes
equal those with it off (they must: a prefetch changes no arithmetic). Prints `best: programs P ahead A` when a
setting beats off by more than 2%.

    python benchmarks/scripts/tune_l2_prefetch.py [--ahead 0,1,2,3] [--programs 2,32]
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
    ap.add_argument("--programs", default="2", help="comma-separated programs per prefetch launch")
    ap.add_argument("--dry", default="", help="also time the branch with nothing to prefetch at this programs count")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, {cp.DTYPE}, one row, us per predict (CUDA-graph replays)")
    first, off, best = None, None, None
    for programs in [int(p) for p in args.programs.split(",")]:
        for ahead in [int(a) for a in args.ahead.split(",")]:
            if ahead == 0 and off is not None:
                continue                    # the programs count does not matter when off
            l2_prefetch.AHEAD, l2_prefetch.PROGRAMS = ahead, programs
            torch.manual_seed(0)
            (_, fused), _, codes = cp.predict_frames(1)
            first = codes[1] if first is None else first
            print(f"programs {programs} ahead {ahead}: predict (fused layers) {fused:8.1f} us; codes == the first "
                  f"setting's: {torch.equal(codes[1], first)}", flush=True)
            if ahead == 0:
                off = fused
            elif best is None or fused < best[0]:
                best = (fused, programs, ahead)
    if args.dry:
        l2_prefetch.AHEAD, l2_prefetch.PROGRAMS, l2_prefetch.DRY = 2, int(args.dry), True
        torch.manual_seed(0)
        (_, fused), _, _ = cp.predict_frames(1)
        print(f"dry (the branch's kernels with nothing to prefetch), programs {args.dry} ahead 2: {fused:8.1f} us")
        l2_prefetch.DRY = False
    if off is not None and best is not None and best[0] < 0.98 * off:
        print(f"best: programs {best[1]} ahead {best[2]}")      # (read by the device script)


if __name__ == "__main__":
    main()
