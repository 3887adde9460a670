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

TILE_ROWS = 16               # queries of one chunk a program takes (x GROUP heads: the dot's M)


@dataclass
class PrefillTiles:
    """Per tile (device int64 [max_tiles] each): first packed row, rows (0 = no tile), chunk, position of the first
    row."""
    row: torch.Tensor
    rows: torch.Tensor
    chunk: torch.Tensor
    pos: torch.Tensor


def max_tiles(tokens: int, max_chunks: int) -> int:
    """Tiles a packed run of `tokens` rows in at most `max_chunks` chunks can need (each chunk's last tile partial)."""
    return tokens // TILE_ROWS + max_chunks


def make_tiles(spans: list[tuple[int, int]], out: np.ndarray) -> None:
    """Fill `out` [4, max_tiles] (row, rows, chunk, pos) for chunks laid end to end from row 0: chunk i holds
    positions [start, end) of its sequence. Unused tiles: 0 rows."""
    out.fill(0)
    at = t = 0
    for i, (start, end) in enumerate(spans):
        n = end - start
        k = np.arange(0, n, TILE_ROWS)
        m = len(k)
        out[0, t: t + m] = at + k
        out[1, t: t + m] = np.minimum(TILE_ROWS, n - k)
        out[2, t: t + m] = i
        out[3, t: t + m] = start + k
        at += n
        t += m
