"""Times the packed prefill's attention on a GPU at the talker's shapes (16 query / 8 KV heads of 128, 16-token pages,
bf16): the tiled kernel (voxflow/kernels/paged_prefill_attention.py) at a few launch settings (key tile, warps, the
key loop's pipeline stages) against the decode kernel run one row per token (what session 8's call 5 measured the
packed prefill with), per layer call.

Workloads: a c=16 wave (16 fresh prompts of 80-200 positions, ~2,200 rows), a run of a c=64 wave as the step's
2,048-position budget cuts it (16 prompts of 100-155), prefix-cache hits (16 chunks of 40 new positions after
600-position prefixes), and the 0.6B c=64 bench's wave as today's 4,096-position budget cuts it (20 prompts of
186-210). Times are GPU times of CUDA-graph replays (tune_skinny_linear.bench); each setting's output
is checked against the default's (bf16 tolerance) before it is timed.

    python benchmarks/scripts/tune_paged_prefill.py
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_skinny_linear import bench  # noqa: E402  (same timing method)

from voxflow.kernels import prefill_tiles as pt  # noqa: E402
from voxflow.kernels.paged_decode_attention import paged_decode_attention  # noqa: E402
from voxflow.kernels.paged_prefill_attention import paged_prefill_attention  # noqa: E402

HQ, HKV, D, BS = 16, 8, 128, 16
DTYPE = torch.bfloat16


def tiles_of(spans: list[tuple[int, int]], tokens: int, tile_rows: int) -> pt.PrefillTiles:
    arr = np.zeros((4, pt.max_tiles(tokens, len(spans) + 1, tile_rows)), dtype=np.int64)
    pt.make_tiles(spans, arr, tile_rows)
    return pt.PrefillTiles(*torch.from_numpy(arr).cuda())


def workload(spans: list[tuple[int, int]], seed: int):
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-end // BS) for _, end in spans]
    blocks = sum(pages) + 1
    k_pool = torch.randn(blocks, BS, HKV, D, generator=gen).to(DTYPE).cuda()
    v_pool = torch.randn(blocks, BS, HKV, D, generator=gen).to(DTYPE).cuda()
    width = 1 << (max(pages) - 1).bit_length()
    tables = torch.full((len(spans) + 1, width), -1, dtype=torch.long)
    at = 0
    for c, p in enumerate(pages):
        tables[c, :p] = torch.arange(at, at + p)
        at += p
    rows = sum(e - s for s, e in spans)
    tokens = 1 << (rows - 1).bit_length()
    q = torch.randn(tokens, HQ, D, generator=gen).to(DTYPE).cuda()
    tiles = tiles_of(spans, tokens, pt.TILE_ROWS)
    chunk_of = [c for c, (s, e) in enumerate(spans) for _ in range(s, e)] + [len(spans)] * (tokens - rows)
    lens = [p + 1 for s, e in spans for p in range(s, e)] + [0] * (tokens - rows)
    row_tables = tables[chunk_of].cuda()
    return q, k_pool, v_pool, tables.cuda(), tiles, row_tables, torch.tensor(lens).cuda(), rows


def main() -> None:
    rng = np.random.default_rng(0)
    waves = {
        "c=16 wave": [(0, int(n)) for n in rng.integers(80, 200, 16)],
        "2048-row run": [(0, int(n)) for n in rng.integers(100, 156, 16)],      # a step's budget of a c=64 wave
        "prefix hits": [(600, 640)] * 16,
        # the 0.6B c=64 bench's wave (prompts of ~186-210 positions) as the 4,096-position budget cuts it
        "4096-row run": [(0, int(n)) for n in rng.integers(186, 211, 20)],
    }
    # 16 queries a program (session 51's default), then the key-tile loop pipelined there
    settings = [dict(block_n=bn, num_warps=w, loop_stages=1, tile_rows=16)
                for bn, w in ((32, 4), (64, 4), (32, 8), (64, 8), (16, 4))]
    settings += [dict(block_n=bn, num_warps=w, loop_stages=st, tile_rows=16)
                 for bn, w, st in ((32, 4, 2), (32, 4, 3), (16, 4, 2), (32, 8, 2), (32, 8, 3), (64, 8, 2))]
    # 32 / 64 queries a program (VOXFLOW_PREFILL_TILE_ROWS; 32 at 2 stages the default since session 52): the
    # settings free of spills on sm_90
    settings += [dict(block_n=bn, num_warps=8, loop_stages=st, tile_rows=rows)
                 for rows, bn, st in ((32, 32, 1), (32, 32, 2), (32, 64, 1), (32, 64, 2), (64, 32, 1), (64, 32, 2))]
    # (64-key tiles at 4 warps and 2 stages spill 688 bytes a thread on sm_90: compile_check, not timed)
    print(f"{torch.cuda.get_device_name()}, {DTYPE}, us per layer call (CUDA-graph replays)")
    for name, spans in waves.items():
        q, k_pool, v_pool, tables, tiles, row_tables, lens, rows = workload(spans, 0)
        scale = D ** -0.5
        want = paged_prefill_attention(q, k_pool, v_pool, tables, tiles, scale)
        times = []
        for cfg in settings:
            size = cfg.get("tile_rows", pt.TILE_ROWS)
            its = tiles if size == pt.TILE_ROWS else tiles_of(spans, q.shape[0], size)
            got = paged_prefill_attention(q, k_pool, v_pool, tables, its, scale, **cfg)
            torch.testing.assert_close(got[:rows].float(), want[:rows].float(), rtol=2 ** -6, atol=2e-2)
            us = bench(lambda: paged_prefill_attention(q, k_pool, v_pool, tables, its, scale, **cfg), 1)
            times.append((us, cfg))
        per_row = bench(lambda: paged_decode_attention(q, k_pool, v_pool, row_tables, lens, scale), 1)
        best = min(times, key=lambda t: t[0])
        print(f"{name:15} rows {rows:5}  decode kernel per row {per_row:8.1f} us | tiled: "
              + ", ".join(f"{c.get('tile_rows', pt.TILE_ROWS)}q/{c['block_n']}k/{c['num_warps']}w/{c['loop_stages']}s "
                        f"{us:7.1f}" for us, c in times)
              + f" | best {best[1]} {per_row / best[0]:.1f}x")


if __name__ == "__main__":
    main()
