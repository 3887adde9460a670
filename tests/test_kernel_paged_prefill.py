"""The packed prefill's attention kernel (voxflow/kernels/paged_prefill_attention.py): its tiles, its torch reference
against the decode reference row by row, and the kernel against the reference on CPU tensors through Triton's
interpreter (in a subprocess, see tests/interpreter_child.py).

Tolerances: fp32 kernel vs fp32 reference 1e-5 (summation order only); bf16 kernel vs the fp32 reference of the
same bf16 inputs: the kernel rounds the softmax weights to bf16 before the P.V dot (as flash attention does; the
interpreter's cast truncates: up to 2^-7 relative per weight) and its output once, so an element may be off by
2^-7 x sum_j p_j |v_j| (~1e-2 for these randn values): atol 1e-2, rtol 2^-6, and the mean error under 5e-3 (a
wrong mask or page moves most elements by O(0.1)); the two references agree to 1e-6."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from interpreter_child import in_child, run_child  # tests/interpreter_child.py
from voxflow.kernels import paged_decode_attention as pda
from voxflow.kernels import paged_prefill_attention as ppa
from voxflow.kernels import prefill_tiles as pt

CHILD_FLAG = "VOXFLOW_PAGED_PREFILL_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def packed_case(spans, hkv, group, d, bs, dtype, seed):
    """Pools (unused slots NaN) holding every chunk's positions [0, end), chunk tables on shuffled pages (plus an
    unused -1 column), and the packed queries of the chunks' new positions."""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-end // bs) for _, end in spans]
    num_blocks = sum(pages) + 2
    shape = (num_blocks, bs, hkv, d)
    k_pool = torch.full(shape, float("nan"), dtype=dtype)
    v_pool = torch.full(shape, float("nan"), dtype=dtype)
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(spans) + 1, max(pages) + 1), -1, dtype=torch.long)
    used = 0
    for c, ((_, end), p) in enumerate(zip(spans, pages)):
        tables[c, :p] = order[used: used + p]
        used += p
        for t in range(end):
            page, pos = tables[c, t // bs], t % bs
            k_pool[page, pos] = torch.randn(hkv, d, generator=gen).to(dtype)
            v_pool[page, pos] = torch.randn(hkv, d, generator=gen).to(dtype)
    rows = sum(e - s for s, e in spans)
    q_dtype = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype      # an fp8 pool: bf16 queries
    q = torch.randn(rows + 5, hkv * group, d, generator=gen).to(q_dtype)      # 5 padding rows past the chunks
    return q, k_pool, v_pool, tables


def tiles_for(spans, tokens, max_chunks, tile_rows=pt.TILE_ROWS):
    arr = np.zeros((4, pt.max_tiles(tokens, max_chunks, tile_rows)), dtype=np.int64)
    pt.make_tiles(spans, arr, tile_rows)
    return pt.PrefillTiles(*(torch.from_numpy(a.copy()) for a in arr))


@pytest.mark.parametrize("tile_rows", sorted({pt.TILE_ROWS, 4, 16, 32}))
def test_tiles_cover_each_chunk_row_once_in_order(tile_rows):
    spans = [(0, 5), (3, 40), (16, 32), (7, 8)]
    arr = np.zeros((4, pt.max_tiles(64, 4, tile_rows)), dtype=np.int64)
    pt.make_tiles(spans, arr, tile_rows)
    row, rows, chunk, pos = arr
    covered = [(int(chunk[t]), int(pos[t]) + i, int(row[t]) + i) for t in range(arr.shape[1]) for i in range(rows[t])]
    want, at = [], 0
    for c, (s, e) in enumerate(spans):
        want += [(c, p, at + p - s) for p in range(s, e)]
        at += e - s
    assert covered == want
    assert (rows <= tile_rows).all()
    assert int((rows > 0).sum()) == sum(-(-(e - s) // tile_rows) for s, e in spans)


def test_launch_settings_follow_the_tile_size_and_refuse_nonsense():
    """Tiles of more than 16 queries launch at 8 warps (4 spill there on sm_90); a pipeline depth under 1 or a tile
    size that is not a power of two is refused before any launch."""
    pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")
    assert [ppa.default_warps(r) for r in (16, 32, 64)] == [4, 8, 8]
    # fp32 takes 16-key tiles (32 spill there), half precision 32; the defaults: 32 queries, 2 pipeline stages
    assert [ppa.default_block_n(dt) for dt in (torch.float32, torch.bfloat16, torch.float16)] == [16, 32, 32]
    if "VOXFLOW_PREFILL_TILE_ROWS" not in os.environ and "VOXFLOW_PAGED_PREFILL_STAGES" not in os.environ:
        assert (pt.TILE_ROWS, ppa.LOOP_STAGES, ppa._LOOP_STAGES) == (32, 2, 2)
    q, k_pool, v_pool, tables = packed_case([(0, 5)], 1, 1, 16, 8, torch.float32, seed=0)
    tiles = tiles_for([(0, 5)], q.shape[0], 2)
    with pytest.raises(ValueError, match="loop_stages must be >= 1"):
        ppa.paged_prefill_attention(q, k_pool, v_pool, tables, tiles, 0.25, loop_stages=0)
    with pytest.raises(ValueError, match="tile_rows must be a power of two"):
        ppa.paged_prefill_attention(q, k_pool, v_pool, tables, tiles, 0.25, tile_rows=24)


def test_a_tile_size_that_is_not_a_power_of_two_is_refused():
    """VOXFLOW_PREFILL_TILE_ROWS feeds the kernel's tl.arange(0, ROWS * GROUP): a power of two or nothing."""
    env = dict(os.environ, VOXFLOW_PREFILL_TILE_ROWS="24")
    run = subprocess.run([sys.executable, "-c", "import voxflow.kernels.prefill_tiles"], env=env, capture_output=True,
                         text=True)
    assert run.returncode != 0 and "must be a power of two, got 24" in run.stderr


@pytest.mark.parametrize("group", [1, 2])
def test_reference_equals_the_decode_reference_row_by_row(group):
    """Each packed row is a decode query over its sequence's pages up to its own position."""
    spans = [(0, 6), (5, 29), (12, 13), (0, 40)]
    q, k_pool, v_pool, tables = packed_case(spans, 2, group, 16, 8, torch.float32, seed=group)
    got = ppa.paged_prefill_attention_ref(q, k_pool, v_pool, tables, tiles_for(spans, q.shape[0], 5), 16 ** -0.5)
    chunk_of = [c for c, (s, e) in enumerate(spans) for _ in range(s, e)]
    lens = [p + 1 for s, e in spans for p in range(s, e)]
    n = len(lens)
    want = pda.paged_decode_attention_ref(q[:n], k_pool, v_pool, tables[chunk_of], torch.tensor(lens), 16 ** -0.5)
    torch.testing.assert_close(got[:n], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[n:], torch.zeros_like(got[n:]))                    # padding rows


# (spans, Hkv, group, head_dim, block_size, dtype, block_n, tile_rows)
KERNEL_CASES = [
    ([(0, 5), (3, 40), (16, 32), (7, 8)], 2, 2, 16, 8, "float32", 32, pt.TILE_ROWS),
    ([(0, 37)], 1, 1, 32, 16, "float32", 16, pt.TILE_ROWS),
    ([(10, 11), (0, 17), (30, 64)], 2, 2, 16, 4, "float32", 32, pt.TILE_ROWS),      # a lone row after a prefix
    ([(0, 5), (3, 40), (16, 32)], 2, 2, 16, 8, "bfloat16", 32, pt.TILE_ROWS),
    ([(0, 20)], 2, 4, 8, 8, "float32", 16, pt.TILE_ROWS),                           # head_dim under 16: padded lanes
    ([(0, 5), (3, 40), (16, 32)], 2, 2, 16, 8, "float8_e4m3fn", 32, pt.TILE_ROWS),  # fp8 pools (kv_cache_dtype)
    ([(0, 5), (3, 70), (16, 32)], 2, 2, 16, 8, "float32", 32, 32),                  # 32-query tiles
    ([(10, 11), (0, 75)], 2, 2, 16, 8, "bfloat16", 16, 64),                         # 64-query tiles
]


def check_kernel_cases() -> None:
    for i, (spans, hkv, group, d, bs, dtype_name, block_n, tile_rows) in enumerate(KERNEL_CASES):
        dtype = getattr(torch, dtype_name)
        q, k_pool, v_pool, tables = packed_case(spans, hkv, group, d, bs, dtype, seed=10 + i)
        tiles = tiles_for(spans, q.shape[0], len(spans) + 1, tile_rows)
        scale = d ** -0.5
        out = ppa.paged_prefill_attention(q, k_pool, v_pool, tables, tiles, scale, block_n=block_n,
                                          tile_rows=tile_rows)
        ref = ppa.paged_prefill_attention_ref(q.float(), k_pool, v_pool, tables, tiles, scale)
        dtype = q.dtype                   # the output's, and the tolerances' (an fp8 pool: its bf16 queries')
        assert out.dtype == dtype and out.shape == q.shape and not out.isnan().any(), i
        rtol, atol = (1e-5, 1e-5) if dtype == torch.float32 else (2 ** -6, 1e-2)
        torch.testing.assert_close(out.float(), ref, rtol=rtol, atol=atol, msg=lambda m: f"case {i}: {m}")
        assert (out.float() - ref).abs().mean() < (1e-6 if dtype == torch.float32 else 5e-3), i
        n = sum(e - s for s, e in spans)
        assert torch.equal(out[n:], torch.zeros_like(out[n:])), i               # rows no tile covers
        # the key loop pipelined (VOXFLOW_PAGED_PREFILL_STAGES) runs and gives the same values here. (The interpreter
        # ignores tl.range's num_stages: this holds the launch path, tests/gpu the pipelined code's bits.)
        piped = ppa.paged_prefill_attention(q, k_pool, v_pool, tables, tiles, scale, block_n=block_n, loop_stages=2,
                                            tile_rows=tile_rows)
        assert torch.equal(piped, out), i


if IN_CHILD:
    def test_child_kernel_against_the_reference():
        check_kernel_cases()
else:
    def test_paged_prefill_kernel_under_the_interpreter():
        pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")
        run_child(__file__, CHILD_FLAG)
