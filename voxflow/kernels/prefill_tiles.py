"""The query tiles of a packed prefill (engine/packed_prefill.py) for its attention kernel
(kernels/paged_prefill_attention.py): plain host code, no Triton, so the engine can make them on any machine.

A tile is TILE_ROWS consecutive packed rows of one chunk (the last tile of a chunk may hold fewer); per tile: its
first packed row, its rows (0 = no tile), its chunk (a row of the chunk tables) and the position of its first row.
The arrays have a fixed size per packed shape (`max_tiles`), so a CUDA graph's grid serves any mix of chunks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import env_int
# Queries of one chunk a program takes (x GROUP heads: the dot's M), a power of two: 32, launched at 8 warps (free of
# spills in bf16). A 0.6B wave's ~11k positions ran as ~2,200 programs of 16 queries and 3-6 key tiles each,
# latency-bound at ~30 TFLOP/s (session 51); 32 amortizes each program's prologue over twice the queries. On an H100
# (session 52 call 1, tune_paged_prefill.py, both at the pipelined key loop) 32 took 6-9% less kernel time than 16
# in the wave / 2048-row / 4096-row workloads and 1% more on prefix hits; 64 more than 32 except on prefix hits (5%
# less there). VOXFLOW_PREFILL_TILE_ROWS sets it for A/B runs: the engine's tiles and the kernel's launch
# both read it.
TILE_ROWS = env_int("VOXFLOW_PREFILL_TILE_ROWS", 32, power_of_two=True)


@dataclass
class PrefillTiles:
    """Per tile (device int64 [max_tiles] each): first packed row, rows (0 = no tile), chunk, position of the first
    row."""
    row: torch.Tensor
    rows: torch.Tensor
    chunk: torch.Tensor
    pos: torch.Tensor


def max_tiles(tokens: int, max_chunks: int, tile_rows: int = TILE_ROWS) -> int:
    """Tiles a packed run of `tokens` rows in at most `max_chunks` chunks can need (each chunk's last tile partial)."""
    return tokens // tile_rows + max_chunks


def make_tiles(spans: list[tuple[int, int]], out: np.ndarray, tile_rows: int = TILE_ROWS) -> None:
    """Fill `out` [4, max_tiles] (row, rows, chunk, pos) for chunks laid end to end from row 0: chunk i holds
    positions [start, end) of its sequence. Unused tiles: 0 rows. The kernel must be launched with the same
    `tile_rows` (a tile of more rows than its launch takes would lose the rest)."""
    out.fill(0)
    at = t = 0
    for i, (start, end) in enumerate(spans):
        n = end - start
        k = np.arange(0, n, tile_rows)
        m = len(k)
        out[0, t: t + m] = at + k
        out[1, t: t + m] = np.minimum(tile_rows, n - k)
        out[2, t: t + m] = i
        out[3, t: t + m] = start + k
        at += n
        t += m
