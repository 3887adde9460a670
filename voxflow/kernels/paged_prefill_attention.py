"""Causal attention for a packed prefill (engine/packed_prefill.py) straight from the paged KV pool, by query tiles.

    paged_prefill_attention(q, k_pool, v_pool, chunk_tables, tiles, scale) -> out
        q             [T, Hq, D]    the packed rows' queries (normed, rotated); rows of a chunk are consecutive
        k/v_pool      [num_blocks, block_size, Hkv, D]   one layer's pages, every row's new K/V already written
        chunk_tables  [C, W]        chunk c's pages in order (-1 = unused)
        tiles         PrefillTiles  the query tiles: TILE_ROWS consecutive rows of one chunk each (below)
        out           [T, Hq, D]    rows no tile covers (padding) are 0

Row r of chunk c at position p attends to positions [0, p] of c's sequence: the cached prefix and the chunk's own
rows up to itself (causal). Why a kernel of its own: the decode kernel, given one row per token, reads a row's whole
context once per query; a chunk's queries share that context, so here one program takes TILE_ROWS queries of a chunk
(x the GROUP query heads of one KV head: a [TILE_ROWS * GROUP, D] tile) and reads each key tile once for all of
them, with tensor-core dots (flash-attention's forward over pages: fp32 online softmax, exp2 with log2(e) folded
into the scale). An fp8 pool's tiles (EngineConfig.kv_cache_dtype) widen to the queries' dtype as they load. fp32
inputs use exact fp32 dots (`input_precision="ieee"`), so an fp32 engine keeps the CPU
reference's codes; bf16 inputs bf16 dots with fp32 accumulation.

Tiles are host-made per run (prefill_tiles.make_tiles) into fixed-size arrays (CUDA graphs: the grid is
`max_tiles` programs per KV head; a tile with 0 rows computes nothing), so a packed shape's graph serves any mix
of chunk lengths.
"""
from __future__ import annotations

import torch

from . import env_int
from .paged_decode_attention import gather_slots
from .prefill_tiles import TILE_ROWS, PrefillTiles

try:
    import triton
    import triton.language as tl
except ImportError:          # CPU-only installs without Triton: the reference path is used
    triton = None
else:
    from .paged_decode_attention import load_kv_tile, page_slots


def paged_prefill_attention_ref(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                                chunk_tables: torch.Tensor, tiles: PrefillTiles, scale: float) -> torch.Tensor:
    """The kernel's contract in plain torch (fp32 math), tile by tile: the tile's rows are queries at positions
    pos, pos + 1, ... of its chunk's sequence, each over that sequence's pages up to its own position."""
    block_size, hkv, d = k_pool.shape[1:]
    groups = q.shape[1] // hkv
    out = torch.zeros_like(q)
    for row, rows, chunk, pos in zip(*(t.tolist() for t in (tiles.row, tiles.rows, tiles.chunk, tiles.pos))):
        if rows == 0:
            continue
        t = torch.arange(pos + rows, device=q.device)
        slots = chunk_tables[chunk, t // block_size].to(torch.long) * block_size + t % block_size
        k = gather_slots(k_pool, slots).float().repeat_interleave(groups, dim=1)           # [keys, Hq, D]
        v = gather_slots(v_pool, slots).float().repeat_interleave(groups, dim=1)
        scores = torch.einsum("nhd,thd->hnt", q[row: row + rows].float(), k) * scale
        causal = t[None, :] <= torch.arange(pos, pos + rows, device=q.device)[:, None]      # [rows, keys]
        scores = scores.masked_fill(~causal[None], float("-inf"))
        out[row: row + rows] = torch.einsum("hnt,thd->nhd", torch.softmax(scores, dim=-1), v).to(q.dtype)
    return out


# The key-tile loop's pipeline depth: 2 (cp.async: the next key tile in flight while this one is used; 255 registers,
# no spill). On an H100 (session 52 call 1, tune_paged_prefill.py) it took the kernel from 41-75 to 37-62 us per
# layer call at 16 queries a program, 35.5-60.5 -> 34.6-56.4 at 32; a 0.6B wave's share 8.9 -> 7.0 ms at 16.
# VOXFLOW_PAGED_PREFILL_STAGES=1 brings back the plain loop (A/B runs).
LOOP_STAGES = 2
_LOOP_STAGES = env_int("VOXFLOW_PAGED_PREFILL_STAGES", LOOP_STAGES)


def default_block_n(dtype: torch.dtype) -> int:
    """Keys a loop iteration takes: 32; 16 in fp32, whose 32-key tiles spill at 16 or 32 queries a program (sm_90:
    672 / 808 bytes a thread; at 16 keys none)."""
    return 16 if dtype == torch.float32 else 32


def default_warps(tile_rows: int) -> int:
    """Warps a launch of `tile_rows` queries a program takes: 4 at 16 (session 51's default); 8 above, where 4 spill
    (sm_90, bf16: 32 queries 56 bytes a thread at the plain loop, 64 queries ~1 KB; at 8 warps none)."""
    return 4 if tile_rows <= 16 else 8


if triton is not None:
    @triton.jit
    def _paged_prefill_kernel(
            q_ptr, k_ptr, v_ptr, table_ptr, tile_row_ptr, tile_rows_ptr, tile_chunk_ptr, tile_pos_ptr, out_ptr,
            scale_log2,
            stride_qt, stride_qh, stride_qd,
            stride_kblk, stride_kpos, stride_kh, stride_kd,
            stride_vblk, stride_vpos, stride_vh, stride_vd,
            stride_tc, stride_tw,
            stride_ot, stride_oh, stride_od,
            GROUP: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
            PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
            LOOP_STAGES: tl.constexpr):
        tile = tl.program_id(0)
        kv_head = tl.program_id(1)
        n_rows = tl.load(tile_rows_ptr + tile).to(tl.int32)
        row0 = tl.load(tile_row_ptr + tile)
        chunk = tl.load(tile_chunk_ptr + tile)
        pos0 = tl.load(tile_pos_ptr + tile).to(tl.int32)
        # M = ROWS queries x GROUP heads, query-major: m -> (query m // GROUP, head kv_head * GROUP + m % GROUP)
        m = tl.arange(0, ROWS * GROUP)
        qi = m // GROUP
        head = kv_head * GROUP + m % GROUP
        d = tl.arange(0, BLOCK_D)
        n = tl.arange(0, BLOCK_N)
        d_ok = d < HEAD_DIM
        q_ok = qi < n_rows
        q_pos = pos0 + qi                                        # each query's position: it sees keys [0, q_pos]
        io = (row0 + qi).to(tl.int64)
        q_mask = q_ok[:, None] & d_ok[None, :]
        q = tl.load(q_ptr + io[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd,
                    mask=q_mask, other=0.0)                                                  # [M, D]
        if DOT_IN_FP32:                          # the interpreter's dot does not take bf16 operands
            q = q.to(tl.float32)
        hi = tl.where(n_rows > 0, pos0 + n_rows, 0)              # keys the tile's last query sees (0: no tile)
        mx = tl.full([ROWS * GROUP], float("-inf"), tl.float32)
        s_sum = tl.zeros([ROWS * GROUP], tl.float32)
        acc = tl.zeros([ROWS * GROUP, BLOCK_D], tl.float32)
        table_row = table_ptr + chunk * stride_tc
        # LOOP_STAGES > 1: Triton's software pipeline over the key tiles (cp.async: later tiles' K/V in flight while
        # this one's dots run); at 1 each tile's loads wait in turn (the decode kernel's loop read 2.0 TB/s so).
        for start in tl.range(0, hi, BLOCK_N, num_stages=LOOP_STAGES):
            tok = start + n
            ok = tok < hi
            page, pos = page_slots(table_row, tok, ok, stride_tw, PAGE)
            kv_mask = ok[:, None] & d_ok[None, :]
            k = load_kv_tile(k_ptr, page, pos, kv_head, d, kv_mask, stride_kblk, stride_kpos, stride_kh,
                             stride_kd).to(q_ptr.dtype.element_ty)     # [N, D] (an fp8 pool widened; else no-op)
            if DOT_IN_FP32:
                k = k.to(tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2     # [M, N] fp32
            seen = ok[None, :] & (tok[None, :] <= q_pos[:, None])
            # Rows past the tile's queries score 0 (finite, never stored) so their running max never stays -inf;
            # a real query always sees key 0 in the first tile, so its max is finite from there on.
            scores = tl.where(seen, scores, float("-inf"))
            scores = tl.where(q_ok[:, None], scores, 0.0)
            m_new = tl.maximum(mx, tl.max(scores, axis=1))
            alpha = tl.exp2(mx - m_new)
            p = tl.exp2(scores - m_new[:, None])
            s_sum = s_sum * alpha + tl.sum(p, axis=1)
            v = load_kv_tile(v_ptr, page, pos, kv_head, d, kv_mask, stride_vblk, stride_vpos, stride_vh,
                             stride_vd).to(q_ptr.dtype.element_ty)                             # [N, D]
            if DOT_IN_FP32:                      # (the weights still rounded as the GPU's bf16 dot takes them)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32),
                                                    input_precision=DOT_PRECISION)
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            mx = m_new
        out = acc / tl.where(s_sum > 0, s_sum, 1.0)[:, None]
        tl.store(out_ptr + io[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_prefill_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, chunk_tables: torch.Tensor,
                            tiles: PrefillTiles, scale: float, block_n: int | None = None, num_warps: int | None = None,
                            loop_stages: int | None = None, tile_rows: int = TILE_ROWS) -> torch.Tensor:
    """q [T, Hq, D] over the paged pools, by query tiles -> [T, Hq, D] in q's dtype (see the module docstring).
    loop_stages: the key-tile loop's software pipeline depth (None: LOOP_STAGES, or VOXFLOW_PAGED_PREFILL_STAGES).
    tile_rows: the queries a tile holds, as `tiles` were made (prefill_tiles.make_tiles; a power of two).
    num_warps: None = default_warps(tile_rows). block_n: keys a loop iteration takes (None: default_block_n)."""
    if triton is None:
        raise RuntimeError("paged_prefill_attention needs Triton; use paged_prefill_attention_ref")
    rows, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, pool_dim = k_pool.shape
    if v_pool.shape != k_pool.shape or pool_dim != head_dim:
        raise ValueError(f"pools {tuple(k_pool.shape)} / {tuple(v_pool.shape)} do not fit q {tuple(q.shape)}")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    if group & (group - 1):
        raise ValueError(f"query heads per KV head must be a power of two, got {group}")
    if tile_rows < 1 or tile_rows & (tile_rows - 1):
        raise ValueError(f"tile_rows must be a power of two, got {tile_rows}")
    if loop_stages is None:
        loop_stages = _LOOP_STAGES
    if loop_stages < 1:
        raise ValueError(f"loop_stages must be >= 1, got {loop_stages}")
    if block_n is None:
        block_n = default_block_n(q.dtype)
    out = torch.zeros_like(q)
    grid = (tiles.rows.shape[0], num_kv_heads)
    _paged_prefill_kernel[grid](
        q, k_pool, v_pool, chunk_tables, tiles.row, tiles.rows, tiles.chunk, tiles.pos, out,
        scale * 1.4426950408889634,
        q.stride(0), q.stride(1), q.stride(2),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), k_pool.stride(3),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2), v_pool.stride(3),
        chunk_tables.stride(0), chunk_tables.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        GROUP=group, ROWS=tile_rows, HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PAGE=block_size,
        BLOCK_N=block_n, DOT_PRECISION="ieee" if q.dtype == torch.float32 or not q.is_cuda else "tf32",
        DOT_IN_FP32=not q.is_cuda, LOOP_STAGES=loop_stages, num_warps=num_warps or default_warps(tile_rows))
    return out
