"""Times the talker's paged decode attention (voxflow/kernels/paged_decode_attention.py) at the served batch sizes
on a GPU: 1.7B talker heads (16 q / 8 kv of 128), bf16, 16-token pages scattered over the pool (a shuffled page
order, as a long-running server's block manager leaves them), every row at the same context length.

For each (rows, context): the default launch (default_num_splits from the table width, default tile and warps) with
chunks of one tile allowed ("old", min_split_tokens=0: before session 13) and with default_min_split_tokens
("new"), and candidates (--sweep: splits / tiles / warps around them), us a call from CUDA-graph replays, and the
K/V bandwidth of the best. Each candidate's output is checked against the old default's. Session 13 saw 79 us a
layer at 256 rows in the served step (benchmarks/results/h200/2026-12-02-session13).

    python benchmarks/scripts/tune_paged_decode.py [--rows 64,256] [--contexts 64,128,256] [--width 4096] [--sweep]
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_skinny_linear import bench  # noqa: E402

from voxflow.kernels.paged_decode_attention import default_num_splits, paged_decode_attention  # noqa: E402

HQ, HKV, D, PAGE = 16, 8, 128, 16


def batch(rows: int, ctx: int, width_tokens: int):
    width = width_tokens // PAGE
    pages = rows * width + 1
    k_pool = torch.randn(pages, PAGE, HKV, D, device="cuda").to(torch.bfloat16)
    v_pool = torch.randn_like(k_pool)
    order = torch.randperm(pages - 1, device="cuda")[: rows * width].view(rows, width) + 1
    q = torch.randn(rows, HQ, D, device="cuda").to(torch.bfloat16)
    lens = torch.full((rows,), ctx, device="cuda", dtype=torch.int32)
    return q, k_pool, v_pool, order, lens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="64,256")
    ap.add_argument("--contexts", default="64,128,256")
    ap.add_argument("--width", type=int, default=4096, help="block-table width in tokens (what the heuristic sees)")
    ap.add_argument("--sweep", action="store_true", help="also time splits / tiles / warps candidates")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, bf16, {HQ} q / {HKV} kv heads of {D}, pages of {PAGE}, "
          f"table width {args.width} tokens; us a call (CUDA-graph replays)")
    print(f"{'rows':>4} {'ctx':>4} | {'splits':>6} {'old us':>7} {'new us':>7} {'x':>5} | "
          f"{'best (splits, tile, warps, min)':>31} {'us':>7} {'KV GB/s':>8}")
    for rows, ctx in itertools.product([int(r) for r in args.rows.split(",")],
                                       [int(c) for c in args.contexts.split(",")]):
        q, k_pool, v_pool, tables, lens = batch(rows, ctx, args.width)
        scale = D ** -0.5
        ref = paged_decode_attention(q, k_pool, v_pool, tables, lens, scale, min_split_tokens=0)
        new = paged_decode_attention(q, k_pool, v_pool, tables, lens, scale)
        assert torch.allclose(new.float(), ref.float(), atol=2e-2, rtol=2e-2), (rows, ctx)
        old_us = bench(lambda: paged_decode_attention(q, k_pool, v_pool, tables, lens, scale, min_split_tokens=0), 1)
        new_us = bench(lambda: paged_decode_attention(q, k_pool, v_pool, tables, lens, scale), 1)
        splits = default_num_splits(rows, HKV, args.width, q.device)
        best = (new_us, ("new",))
        candidates = itertools.product(sorted({1, 2, 4, splits}), (16, 64), (2,), (0, 128)) if args.sweep \
            else []
        for s, n, w, ms in candidates:
            try:
                out = paged_decode_attention(q, k_pool, v_pool, tables, lens, scale, num_splits=s, block_n=n,
                                             num_warps=w, min_split_tokens=ms)
                if not torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2):
                    print(f"  splits {s} tile {n} warps {w} min {ms}: WRONG RESULT")
                    continue
                us = bench(lambda: paged_decode_attention(q, k_pool, v_pool, tables, lens, scale, num_splits=s,
                                                          block_n=n, num_warps=w, min_split_tokens=ms), 1)
            except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or launch
                print(f"  splits {s} tile {n} warps {w} min {ms}: {type(e).__name__}: {str(e)[:100]}")
                continue
            if us < best[0]:
                best = (us, (s, n, w, ms))
        kv_bytes = 2 * rows * ctx * HKV * D * 2
        print(f"{rows:4d} {ctx:4d} | {splits:6d} {old_us:7.2f} {new_us:7.2f} {old_us / new_us:5.2f} | "
              f"{str(best[1]):>31} {best[0]:7.2f} {kv_bytes / best[0] / 1e3:8.0f}")


if __name__ == "__main__":
    main()
