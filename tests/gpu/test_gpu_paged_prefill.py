"""GPU check of the packed prefill's tiled attention kernel (kernels/paged_prefill_attention.py) at the talker's
real head shapes (16 query heads, 8 KV heads, head_dim 128, 16-token pages): ragged chunks after cached prefixes
on shuffled pages whose unused slots hold NaN, against `paged_prefill_attention_ref` (fp32 math from the same
inputs), eagerly and replayed in a CUDA graph with other chunks. Skipped where there is no CUDA.

Tolerances: fp32 (exact fp32 dots) rtol 1e-4 / atol 1e-5. bf16, per element: the softmax weights are rounded to
bf16 for the P.V dot (round-to-nearest: each weight off by <= 2^-9 of itself, so the output by <= 2^-9 of the
weighted mean of |v|, computed exactly by the reference over |v|), and the output is rounded once (<= 2^-9 of it),
plus 1e-5 for summation order. Twice both is allowed, 2^-8: on the H200 a few elements went up to 1.15x the
2^-9 bound of the weights (cause not isolated: the tensor cores' accumulation of the bf16 products, or the
rounding of the weights). (A flat atol of 2e-3 failed there on 1 of 1M elements: the weights' rounding reaches
2^-9 x max|v| ~ 1e-2 for these N(0, 1) values.)"""
import numpy as np
import pytest
import torch

from voxflow.kernels import prefill_tiles as pt
from voxflow.kernels.paged_prefill_attention import paged_prefill_attention, paged_prefill_attention_ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
torch.backends.cuda.matmul.allow_tf32 = False

HQ, HKV, D, BS = 16, 8, 128, 16


def assert_within_tolerance(out, q, k_pool, v_pool, tables, t):
    ref = paged_prefill_attention_ref(q.float(), k_pool, v_pool, tables, t, D ** -0.5)
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        return
    mean_abs_v = paged_prefill_attention_ref(q.float(), k_pool, v_pool.float().abs(), tables, t, D ** -0.5)
    bound = 2.0 ** -8 * mean_abs_v + 2.0 ** -8 * ref.abs() + 1e-5
    err = (out.float() - ref).abs()
    assert (err <= bound).all(), (err - bound).max().item()


def case(spans, dtype, seed, rows, blocks=96):
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-end // BS) for _, end in spans]
    assert sum(pages) + 4 <= blocks
    k_pool = torch.full((blocks, BS, HKV, D), float("nan"), dtype=dtype)
    v_pool = torch.full((blocks, BS, HKV, D), float("nan"), dtype=dtype)
    order = torch.randperm(blocks, generator=gen)
    tables = torch.full((65, 64), -1, dtype=torch.long)
    used = 0
    for c, ((_, end), p) in enumerate(zip(spans, pages)):
        tables[c, :p] = order[used: used + p]
        used += p
        slots = tables[c, torch.arange(end) // BS] * BS + torch.arange(end) % BS
        k_pool.view(-1, HKV, D)[slots] = torch.randn(end, HKV, D, generator=gen).to(dtype)
        v_pool.view(-1, HKV, D)[slots] = torch.randn(end, HKV, D, generator=gen).to(dtype)
    q = torch.randn(rows, HQ, D, generator=gen).to(torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype)
    return [t.cuda() for t in (q, k_pool, v_pool, tables)]


def tiles(spans, rows, into=None, tile_rows=pt.TILE_ROWS):
    arr = np.zeros((4, pt.max_tiles(rows, 65, tile_rows)), dtype=np.int64)
    pt.make_tiles(spans, arr, tile_rows)
    if into is None:
        return pt.PrefillTiles(*torch.from_numpy(arr).cuda())
    into.copy_(torch.from_numpy(arr))
    return pt.PrefillTiles(*into)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])    # fp8: bf16 queries
def test_tiled_prefill_kernel_matches_reference_at_real_shapes(dtype):
    spans = [(0, 118), (0, 5), (200, 330), (37, 38), (0, 64), (500, 517)]
    rows = 512
    q, k_pool, v_pool, tables = case(spans, dtype, 0, rows)
    t = tiles(spans, rows)
    out = paged_prefill_attention(q, k_pool, v_pool, tables, t, D ** -0.5)
    n = sum(e - s for s, e in spans)
    assert not out.isnan().any() and torch.equal(out[n:], torch.zeros_like(out[n:]))
    assert_within_tolerance(out, q, k_pool, v_pool, tables, t)


def test_tiled_prefill_kernel_replays_in_a_cuda_graph_with_other_chunks():
    rows = 256
    first = [(0, 100), (10, 60)]
    q, k_pool, v_pool, tables = case(first, torch.bfloat16, 1, rows)
    buf = torch.zeros((4, pt.max_tiles(rows, 65)), dtype=torch.long, device="cuda")
    t = tiles(first, rows, into=buf)
    out = paged_prefill_attention(q, k_pool, v_pool, tables, t, D ** -0.5)          # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_prefill_attention(q, k_pool, v_pool, tables, t, D ** -0.5)
    second = [(0, 7), (3, 130), (40, 41), (0, 90)]
    q2, k2, v2, tables2 = case(second, torch.bfloat16, 2, rows)
    for src, dst in ((q2, q), (k2, k_pool), (v2, v_pool), (tables2, tables)):
        dst.copy_(src)
    t = tiles(second, rows, into=buf)
    graph.replay()
    assert_within_tolerance(out, q, k_pool, v_pool, tables, t)


@pytest.mark.parametrize("loop_stages", [2, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_pipelined_key_loop_equals_the_plain_loop(dtype, loop_stages):
    """VOXFLOW_PAGED_PREFILL_STAGES: the key-tile loop software-pipelined does the same arithmetic in the same order
    as the plain loop (bit-equal), so the reference's tolerance carries over."""
    spans = [(0, 118), (0, 5), (200, 330), (37, 38), (0, 64), (500, 517)]
    rows = 512
    q, k_pool, v_pool, tables = case(spans, dtype, 3, rows)
    t = tiles(spans, rows)
    plain = paged_prefill_attention(q, k_pool, v_pool, tables, t, D ** -0.5, loop_stages=1)
    piped = paged_prefill_attention(q, k_pool, v_pool, tables, t, D ** -0.5, loop_stages=loop_stages)
    assert torch.equal(piped, plain)
    assert_within_tolerance(piped, q, k_pool, v_pool, tables, t)


@pytest.mark.parametrize("launch", [dict(tile_rows=16, num_warps=4, loop_stages=1),
                                    dict(tile_rows=16, num_warps=4, loop_stages=2),
                                    dict(tile_rows=32, num_warps=8, block_n=64),
                                    dict(tile_rows=64, num_warps=8, loop_stages=2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_other_query_tiles_match_reference(dtype, launch):
    """VOXFLOW_PREFILL_TILE_ROWS other than the default (32): 16 queries a program at 4 warps (session 51's launch),
    64 at 8 (the engine's launch for them: default_warps), and 32 at 64-key tiles."""
    spans = [(0, 118), (0, 5), (200, 330), (37, 38), (0, 64), (500, 517)]
    rows = 512
    q, k_pool, v_pool, tables = case(spans, dtype, 4, rows)
    t = tiles(spans, rows, tile_rows=launch["tile_rows"])
    out = paged_prefill_attention(q, k_pool, v_pool, tables, t, D ** -0.5, **launch)
    n = sum(e - s for s, e in spans)
    assert not out.isnan().any() and torch.equal(out[n:], torch.zeros_like(out[n:]))
    assert_within_tolerance(out, q, k_pool, v_pool, tables, t)
