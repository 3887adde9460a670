"""Time the fused residual unit (voxflow/kernels/residual_unit_tma.py) against the two TMA convolutions it replaces,
at the codec's 16-stream 25-frame shapes, on the whole GPU: 96 channels x 768,000 rows and 192 x 256,000 (what the
stack's units run as ACT_IN_EPILOGUE 2 launches them: k=7 + SnakeBeta, then 1x1 + residual + the next SnakeBeta with
the raw value kept). Prints ms a unit (CUDA events, the mean of back-to-back calls: event_timing.timed) and the
largest difference.

    python benchmarks/scripts/probe_residual_unit_tma.py [--reps 50] [--frames 25] [--streams 16] [--sweep]

--sweep also times the fused kernel at the other tiles below (each compiled for sm_90 without a spill on the CPU,
session 49: 96 channels 190-202 registers, 192 channels 217-232; session 56's K blocks 190 / 217-222), so that CONFIGS can take the fastest. Session 48's
sweep (run in session 49, call 1) made CONFIGS' tiles; this one tries their neighbours.
"""
from __future__ import annotations

import argparse
import sys

import torch

from voxflow.kernels import causal_conv
from voxflow.kernels.residual_unit_tma import residual_unit_tma

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from event_timing import timed  # noqa: E402  (benchmarks/scripts/event_timing.py)

ROWS_PER_FRAME = {96: 1920, 192: 640}


def _tiles(bt: int, bn: int, bn2: int, bk: int, warps: int, stages: int) -> dict:
    return dict(BLOCK_T=bt, BLOCK_N=bn, BLOCK_N2=bn2, BLOCK_K=bk, num_warps=warps, num_stages=stages)


SWEEP = {
    96: [_tiles(128, 64, 32, 32, 4, s) for s in (3, 5, 6)] + [_tiles(128, 32, 64, 32, 4, 4),
                                                             _tiles(256, 64, 32, 32, 8, 4),
                                                             _tiles(64, 64, 32, 32, 2, 4)]
    # K blocks past the 96 channels (TMA zero-fills the rest): 2 or 1 a tap instead of 3 (session 56)
    + [_tiles(128, 64, 32, 64, 4, s) for s in (3, 4)] + [_tiles(128, 64, 32, 128, 4, s) for s in (2, 3)],
    192: [_tiles(64, 128, 64, 64, 4, s) for s in (2, 4)] + [_tiles(64, 128, 64, 32, 4, s) for s in (3, 4, 5)]
    + [_tiles(32, 128, 64, 64, 4, 3)] + [_tiles(64, 128, 64, 128, 4, s) for s in (2, 3)],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--sweep", action="store_true", help="also time the fused kernel at SWEEP's tiles")
    args = ap.parse_args()
    g = torch.Generator("cuda").manual_seed(0)
    for c, dil in ((96, 1), (96, 9), (192, 1), (192, 9)):
        t = ROWS_PER_FRAME[c] * args.frames
        x = torch.randn(args.streams, t + 6 * dil, c, device="cuda", generator=g).half()
        w7 = causal_conv.pack_weight((torch.randn(c, c, 7, device="cuda", generator=g) / (7 * c) ** 0.5).half())
        w1 = causal_conv.pack_weight((torch.randn(c, c, 1, device="cuda", generator=g) / c ** 0.5).half())
        b7, b1 = (torch.randn(c, device="cuda", generator=g).half() * 0.1 for _ in range(2))
        a, inv, a2, inv2 = ((torch.rand(c, device="cuda", generator=g) + 0.5).half() for _ in range(4))
        res = torch.randn(args.streams, t, c, device="cuda", generator=g).half()
        raw_two, raw_one = torch.empty_like(res), torch.empty_like(res)
        out_two, out_one = torch.empty_like(res), torch.empty_like(res)

        def two() -> None:
            h = causal_conv.conv1d_channels_last(x, w7, b7, dil, snake_terms=(a, inv), tma=True)
            causal_conv.conv1d_channels_last(h, w1, b1, 1, residual=res, tma=True, activation=(a2, inv2),
                                             out=out_two, raw_out=raw_two)

        def one() -> None:
            residual_unit_tma(x, w7, b7, dil, (a, inv), w1, b1, res, activation=(a2, inv2), out=out_one,
                              raw_out=raw_one)

        ms_two, ms_one = timed(two, args.reps), timed(one, args.reps)
        diff = max((out_one.float() - out_two.float()).abs().max().item(),
                   (raw_one.float() - raw_two.float()).abs().max().item())
        print(f"C={c} dilation={dil} rows={args.streams * t}: two kernels {ms_two:.3f} ms, fused {ms_one:.3f} ms "
              f"({ms_one / ms_two - 1:+.1%}); largest difference {diff:.4g}", flush=True)
        for cfg in SWEEP[c] if args.sweep else ():
            ms = timed(lambda: residual_unit_tma(x, w7, b7, dil, (a, inv), w1, b1, res, activation=(a2, inv2),
                                                 out=out_one, raw_out=raw_one, config=cfg), args.reps)
            print(f"  fused at {cfg}: {ms:.3f} ms ({ms / ms_two - 1:+.1%})", flush=True)


if __name__ == "__main__":
    main()
