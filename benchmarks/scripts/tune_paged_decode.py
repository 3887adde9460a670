"""Times the talker's paged decode attention (voxflow/kernels/paged_decode_attention.py) at the served batch sizes
on a GPU: 1.7B talker heads (16 q / 8 kv of 128), bf16, 16-token pages scattered over the pool (a shuffled page
order, as a long-running server's block manager leaves them), every row at the same context length.

For each (rows, context): the heuristic's launch (default_num_splits from the table width, default tile and warps)
and candidates (splits 1 / 2 / 4 / 8, tiles of 16 / 32 / 64 tokens, 2 / 4 / 8 warps), us a call from CUDA-graph
replays, and the K/V bandwidth the best one reaches. Each candidate's output is checked against the heuristic's.
Session 13 saw 79 us a layer at 256 rows in the served step (benchmarks/results/h200/2026-12-02-session13).

    python benchmarks/scripts/tune_paged_decode.py [--rows 64,256] [--contexts 64,128,256] [--width 4096]
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
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, bf16, {HQ} q / {HKV} kv heads of {D}, pages of {PAGE}, "
          f"table width {args.width} tokens; us a call (CUDA-graph replays)")
    print(f"{'rows':>4} {'ctx':>4} | {'heuristic':>18} {'us':>7} | {'best (splits, tile, warps)':>26} {'us':>7} "
          f"{'KV GB/s':>8}")
    for rows, ctx in itertools.product([int(r) for r in args.rows.split(",")],
                                       [int(c) for c in args.contexts.split(",")]):
        q, k_pool, v_pool, tables, lens = batch(rows, ctx, args.width)
        scale = D ** -0.5
        ref = paged_decode_attention(q, k_pool, v_pool, tables, lens, scale)
        heur_us = bench(lambda: paged_decode_attention(q, k_pool, v_pool, tables, lens, scale), 1)
        splits = default_num_splits(rows, HKV, args.width, q.device)
        best = (heur_us, ("heuristic",))
        for s, n, w in itertools.product((1, 2, 4, 8), (16, 32, 64), (2, 4, 8)):
            try:
                out = paged_decode_attention(q, k_pool, v_pool, tables, lens, scale, num_splits=s, block_n=n,
                                             num_warps=w)
                if not torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2):
                    print(f"  splits {s} tile {n} warps {w}: WRONG RESULT")
                    continue
                us = bench(lambda: paged_decode_attention(q, k_pool, v_pool, tables, lens, scale, num_splits=s,
                                                          block_n=n, num_warps=w), 1)
            except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or launch
                print(f"  splits {s} tile {n} warps {w}: {type(e).__name__}: {str(e)[:100]}")
                continue
            if us < best[0]:
                best = (us, (s, n, w))
        kv_bytes = 2 * rows * ctx * HKV * D * 2
        print(f"{rows:4d} {ctx:4d} | {f'splits {splits}':>18} {heur_us:7.2f} | {str(best[1]):>26} {best[0]:7.2f} "
              f"{kv_bytes / best[0] / 1e3:8.0f}")


if __name__ == "__main__":
    main()
