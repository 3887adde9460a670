"""GPU checks of the paged decode-attention kernel (run on the device machine:
`python -m pytest tests/gpu/test_gpu_paged_attention.py -q`); skipped where there is no CUDA.
fp8 pools (kv_cache_dtype) with bf16 queries: the bf16 tolerances against the reference over the same fp8 values.

At the real talker head shapes (16 query heads, 8 KV heads, head_dim 128, 16-token pages) the kernel must match
`paged_decode_attention_ref` (fp32 math from the same inputs) for ragged contexts on shuffled pages whose unused
slots hold NaN, with and without split-K; run inside a CUDA graph whose lengths, tables and pool contents change
between replays; and agree with the reference gather + eager path through `PagedLayerView.attend`.

Tolerances: fp32 rtol 1e-4 / atol 1e-5 (summation order over up to 8192 tokens; TF32 off in the reference);
bf16 output vs the fp32 reference rtol 2^-7 (one bf16 ulp: round-to-nearest of the output costs at most half) /
atol 1e-5. Against the eager path in bf16, which rounds scores and weights to bf16 itself, 3e-2.
"""
import pytest
import torch

import voxflow.kernels as K
from voxflow.kernels import as_stored
from voxflow.engine.model_api import PagedKVContext
import voxflow.kernels.paged_decode_attention as pda
from voxflow.kernels.paged_decode_attention import (MAX_SPLITS, MIN_TOKENS_PER_SPLIT, PROGRAMS_PER_SM,
                                                    default_num_splits, default_tensor_cores, paged_decode_attention,
                                                    paged_decode_attention_ref)
from voxflow.layers.attention import attention_bias
from voxflow.layers.paged_attention import PagedKVView

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
torch.backends.cuda.matmul.allow_tf32 = False     # the reference is plain fp32

HQ, HKV, D, BS = 16, 8, 128, 16
SCALE = D ** -0.5
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=2 ** -7, atol=1e-5)}
# The tensor-core variant in bf16: its weighted sum is a TF32 MMA, so each softmax weight is rounded to a 10-bit
# mantissa (relative 2^-11) and the same rounded weights normalise the sum: the output moves by <= 2^-10 * max |v|
# (unit-normal values here, |v| < ~5: < 2^-8) on top of its own rounding. Forced on fp32 pools it computes IEEE fp32
# dots (on CUDA cores): TOL[float32].
TC_TOL = {torch.float32: TOL[torch.float32], torch.bfloat16: dict(rtol=2 ** -7, atol=2 ** -8)}


def tol(dtype, tensor_cores):
    return (TC_TOL if tensor_cores else TOL)[dtype]


def ragged_lens(batch, max_len, seed):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len + 1, (batch,), generator=gen)
    lens[0] = max_len                         # the longest row fills the table; the shortest has one token
    if batch > 1:
        lens[1] = 1
    return lens


def set_nan(pool, index):
    """NaN into those slots of a pool (an fp8 one through its bytes: e4m3fn's NaN is 0x7F)."""
    if pool.dtype == torch.float8_e4m3fn:
        as_stored(pool).view(-1, *pool.shape[2:])[index] = 0x7F
    else:
        pool.view(-1, *pool.shape[2:])[index] = float("nan")


def fill_pages(k_pool, v_pool, tables, lens, seed):
    """Random rows on shuffled pages (tables rewritten in place); slots outside every context set to NaN."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = k_pool.shape[0]
    order = torch.randperm(num_blocks, generator=gen)
    new_tables = torch.full(tables.shape, -1, dtype=torch.long)
    valid = torch.zeros(num_blocks * BS, dtype=torch.bool)
    used = 0
    for b, n in enumerate(lens.tolist()):
        p = -(-n // BS)
        new_tables[b, :p] = order[used:used + p]
        used += p
        t = torch.arange(n)
        valid[new_tables[b, t // BS] * BS + t % BS] = True
    cuda_gen = torch.Generator("cuda").manual_seed(seed)
    for pool in (k_pool, v_pool):
        pool.copy_(torch.randn(pool.shape, generator=cuda_gen, device="cuda"))
        set_nan(pool, ~valid.cuda())
    tables.copy_(new_tables)


def paged_batch(lens, dtype, width=None, seed=0, heads=(HQ, HKV, D)):
    hq, hkv, d = heads
    width = width or -(-int(lens.max()) // BS) + 1                  # one unused column, like the engine's tables
    num_blocks = len(lens) * width + 4
    k_pool = torch.empty(num_blocks, BS, hkv, d, device="cuda", dtype=dtype)
    v_pool = torch.empty_like(k_pool)
    tables = torch.empty(len(lens), width, device="cuda", dtype=torch.long)
    fill_pages(k_pool, v_pool, tables, lens, seed)
    q = torch.randn(len(lens), hq, d, device="cuda", generator=torch.Generator("cuda").manual_seed(seed + 1)).to(dtype)
    return q, k_pool, v_pool, tables, lens.cuda()


@pytest.mark.parametrize("tensor_cores", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 7, 64])
@pytest.mark.parametrize("splits", [None, 1, 5])
def test_kernel_matches_reference_at_real_shapes(batch, dtype, splits, tensor_cores):
    q, k_pool, v_pool, tables, lens = paged_batch(ragged_lens(batch, 4096, seed=batch), dtype, seed=batch)
    out = paged_decode_attention(q, k_pool, v_pool, tables, lens, SCALE, num_splits=splits,
                                 tensor_cores=tensor_cores)
    ref = paged_decode_attention_ref(q.float(), k_pool, v_pool, tables, lens, SCALE)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.float(), ref, **tol(dtype, tensor_cores))


@pytest.mark.parametrize("maxnreg", [None, 128])
@pytest.mark.parametrize("loop_stages", [2, 3])
@pytest.mark.parametrize("batch", [7, 64])
def test_pipelined_and_register_capped_tensor_core_variant_matches_reference(batch, loop_stages, maxnreg):
    """Session 50's candidates for the latency-bound attention (probe_kv_fp8.py --regs): the tile loop software-
    pipelined (2 stages: the default since session 51), the registers capped. Same arithmetic as the plain loop: its
    tolerance, and bit-equal to it."""
    q, k_pool, v_pool, tables, lens = paged_batch(ragged_lens(batch, 2000, seed=batch), torch.bfloat16, seed=batch)
    base = paged_decode_attention(q, k_pool, v_pool, tables, lens, SCALE, tensor_cores=True, loop_stages=1)
    out = paged_decode_attention(q, k_pool, v_pool, tables, lens, SCALE, tensor_cores=True, loop_stages=loop_stages,
                                 maxnreg=maxnreg)
    ref = paged_decode_attention_ref(q.float(), k_pool, v_pool, tables, lens, SCALE)
    torch.testing.assert_close(out.float(), ref, **tol(torch.bfloat16, True))
    assert torch.equal(out, base)


@pytest.mark.parametrize("tensor_cores", [False, True])
@pytest.mark.parametrize("batch", [1, 64])
def test_kernel_over_fp8_pools_matches_reference_at_real_shapes(batch, tensor_cores):
    """kv_cache_dtype=fp8: e4m3 pools, bf16 queries. The reference reads the same fp8 values (widening is exact), so
    the bf16 tolerances hold; the new token handed over in the pool's dtype is written and attended as stored."""
    lens = ragged_lens(batch, 2000, seed=batch)
    _, k_pool, v_pool, tables, lens = paged_batch(lens, torch.float8_e4m3fn, seed=batch)
    q = torch.randn(batch, HQ, D, device="cuda", generator=torch.Generator("cuda").manual_seed(9)).to(torch.bfloat16)
    out = paged_decode_attention(q, k_pool, v_pool, tables, lens, SCALE, tensor_cores=tensor_cores)
    ref = paged_decode_attention_ref(q.float(), k_pool, v_pool, tables, lens, SCALE)
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    torch.testing.assert_close(out.float(), ref, **tol(torch.bfloat16, tensor_cores))
    last = lens - 1
    slots = (tables.gather(1, (last // BS)[:, None]) * BS + (last % BS)[:, None])[:, 0]
    k_new, v_new = (as_stored(p).view(-1, HKV, D)[slots].view(p.dtype) for p in (k_pool, v_pool))
    set_nan(k_pool, slots)
    set_nan(v_pool, slots)
    appended = paged_decode_attention(q, k_pool, v_pool, tables, lens, SCALE, tensor_cores=tensor_cores,
                                      k_new=k_new, v_new=v_new, slots=slots)
    torch.testing.assert_close(appended.float(), out.float(), **tol(torch.bfloat16, tensor_cores))
    assert torch.equal(as_stored(k_pool).view(-1, HKV, D)[slots], as_stored(k_new))


@pytest.mark.parametrize("block_n,warps", [(32, 4), (32, 8), (64, 8)])
def test_tensor_core_tiles_at_short_contexts_with_the_new_token(block_n, warps):
    """64 rows of 1-300 tokens (the served contexts), the new token appended by the kernel: the tensor-core variant
    at these tiles and at its default launch, and the CUDA-core variant, each against the reference."""
    q, k_pool, v_pool, tables, lens = paged_batch(ragged_lens(64, 300, seed=11), torch.bfloat16, seed=11)
    last = lens - 1
    slots = tables.gather(1, (last // BS)[:, None])[:, 0] * BS + last % BS
    flat = (-1, HKV, D)
    k_new, v_new = k_pool.view(flat)[slots].clone(), v_pool.view(flat)[slots].clone()
    ref = paged_decode_attention_ref(q.float(), k_pool, v_pool, tables, lens, SCALE)
    for tc, kw in ((True, dict(block_n=block_n, num_warps=warps)), (True, {}), (False, {})):
        k_app, v_app = k_pool.clone(), v_pool.clone()
        k_app.view(flat)[slots] = float("nan")                         # the kernel must write the new token
        v_app.view(flat)[slots] = float("nan")
        out = paged_decode_attention(q, k_app, v_app, tables, lens, SCALE, tensor_cores=tc, k_new=k_new, v_new=v_new,
                                     slots=slots, **kw)
        assert torch.equal(k_app.view(flat)[slots], k_new) and torch.equal(v_app.view(flat)[slots], v_new)
        torch.testing.assert_close(out.float(), ref, **tol(torch.bfloat16, tc))
    if pda._TC_OVERRIDE is None:                                       # the variant the served c=64 step runs
        assert default_tensor_cores(64, HKV, HQ // HKV, D, q.device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference_at_tiny_checkpoint_shapes(dtype):
    # The tiny checkpoints' talker (4 query heads, 2 KV heads, head_dim 16), as tests/gpu/test_gpu_engine.py runs it.
    q, k_pool, v_pool, tables, lens = paged_batch(ragged_lens(5, 300, seed=4), dtype, seed=4, heads=(4, 2, 16))
    out = paged_decode_attention(q, k_pool, v_pool, tables, lens, 0.25)
    ref = paged_decode_attention_ref(q.float(), k_pool, v_pool, tables, lens, 0.25)
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])


def test_default_split_choice():
    dev = torch.device("cuda")
    assert default_num_splits(1, HKV, 4096, dev) == MAX_SPLITS   # 8 programs alone would leave the GPU idle
    assert 1 < default_num_splits(64, HKV, 4096, dev) <= 4096 // MIN_TOKENS_PER_SPLIT
    assert default_num_splits(1, HKV, 64, dev) == 1              # too short to be worth splitting
    enough = PROGRAMS_PER_SM * torch.cuda.get_device_properties(dev).multi_processor_count // HKV
    assert default_num_splits(enough, HKV, 4096, dev) == 1       # enough programs already


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_handles_8192_token_contexts(dtype):
    q, k_pool, v_pool, tables, lens = paged_batch(torch.tensor([8192, 5000, 8191]), dtype, seed=3)
    out = paged_decode_attention(q, k_pool, v_pool, tables, lens, SCALE)
    ref = paged_decode_attention_ref(q.float(), k_pool, v_pool, tables, lens, SCALE)
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])


def test_empty_rows_give_zeros():
    q, k_pool, v_pool, tables, lens = paged_batch(torch.tensor([40, 300]), torch.bfloat16, seed=5)
    lens[1] = 0                                  # batch padding: no context, table never read
    tables[1] = -1
    for splits in (1, 4):
        out = paged_decode_attention(q, k_pool, v_pool, tables, lens, SCALE, num_splits=splits)
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        ref = paged_decode_attention_ref(q[:1].float(), k_pool, v_pool, tables[:1], lens[:1], SCALE)
        torch.testing.assert_close(out[:1].float(), ref, **TOL[torch.bfloat16])


# 2: the CUDA-core variant, split-K + merge kernel; 48: the tensor-core variant with 2 splits; 64: with one
@pytest.mark.parametrize("batch", [2, 48, 64])
def test_attend_replays_in_a_cuda_graph_with_new_lengths_tables_and_pages(batch, monkeypatch):
    dtype, width = torch.bfloat16, 4096 // BS
    q, k_pool, v_pool, tables, lens = paged_batch(ragged_lens(batch, 2000, seed=0), dtype, width=width)
    gen = torch.Generator("cuda").manual_seed(7)
    q4 = q[:, :, None].clone()                                          # [B, Hq, 1, D] as the layer has it
    k_new = torch.randn(batch, HKV, 1, D, device="cuda", generator=gen).to(dtype)
    v_new = torch.randn_like(k_new)
    slots = torch.empty(batch, 1, device="cuda", dtype=torch.long)

    def set_new_token_slots():                                          # the last context token is the new one
        last = lens - 1
        slots.copy_((tables.gather(1, (last // BS)[:, None]) * BS + (last % BS)[:, None]))

    set_new_token_slots()
    kv = PagedKVContext([k_pool], [v_pool], BS, tables, lens, slots)
    monkeypatch.setattr(K, "_enabled", True)

    def step():
        view = PagedKVView(kv, 1)
        out = view[0].attend(q4, k_new, v_new, None, SCALE)
        assert "gather_index" not in view.__dict__                     # the kernel path ran
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()                                                          # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    for round_, max_len in enumerate((4096, 17, 3000)):                 # grow to the full width, shrink, grow
        lens.copy_(ragged_lens(batch, max_len, seed=10 + round_))
        fill_pages(k_pool, v_pool, tables, lens.cpu(), seed=20 + round_)
        set_new_token_slots()
        q4.normal_(generator=gen)
        k_new.normal_(generator=gen)
        v_new.normal_(generator=gen)
        graph.replay()
        torch.cuda.synchronize()
        flat_k = k_pool.view(-1, HKV, D)
        assert torch.equal(flat_k[slots[:, 0]], k_new[:, :, 0])         # the write was replayed too
        ref = paged_decode_attention_ref(q4[:, :, 0].float(), k_pool, v_pool, tables, lens, SCALE)
        tc = default_tensor_cores(batch, HKV, HQ // HKV, D, q.device, dtype)
        torch.testing.assert_close(out[:, 0].float(), ref, **tol(dtype, tc))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_attend_kernel_path_equals_gather_and_eager_path(dtype, monkeypatch):
    batch = 7
    q, k_pool, v_pool, tables, lens = paged_batch(ragged_lens(batch, 1000, seed=2), dtype, seed=2)
    last = lens - 1
    slots = tables.gather(1, (last // BS)[:, None]) * BS + (last % BS)[:, None]
    gen = torch.Generator("cuda").manual_seed(3)
    k_new = torch.randn(batch, HKV, 1, D, device="cuda", generator=gen).to(dtype)
    v_new = torch.randn_like(k_new)
    q4 = q[:, :, None]
    outs = []
    for on in (True, False):
        monkeypatch.setattr(K, "_enabled", on)
        kv = PagedKVContext([k_pool.clone()], [v_pool.clone()], BS, tables, lens, slots)
        view = PagedKVView(kv, 1)
        bias = attention_bias(1, view.num_keys, view.key_valid, batch=batch, dtype=dtype, device=q.device)
        outs.append(view[0].attend(q4, k_new, v_new, bias, SCALE))
        assert ("gather_index" in view.__dict__) != on                 # which path ran
    tol = TOL[torch.float32] if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(outs[0].float(), outs[1].float(), **tol)
