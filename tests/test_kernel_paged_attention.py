"""Paged decode attention: the Triton kernel against its torch reference, the reference against the engine's
existing gather + eager path, and the dispatch in `PagedLayerView.attend` / `Qwen3Attention`.

The kernel runs on CPU tensors through Triton's interpreter, in a SUBPROCESS: Triton reads TRITON_INTERPRET when
`@triton.jit` decorates a function, its own library functions (tl.sum, ...) included, which happens when triton is
first imported; inside pytest, triton is already imported by then (voxflow.kernels checks for it, and this file
imports the kernel module for the reference), and setting the variable process-wide would turn every later
module's kernels into interpreted ones. The child runs this file as a script (`__main__` below).

Tolerances: fp32 kernel vs fp32 reference 1e-5 (only the summation order differs); bf16 kernel output vs the
reference computed in fp32 from the same bf16 inputs: rtol 2^-7 = one bf16 ulp (the kernel rounds only its
output; the interpreter's fp32 -> bf16 cast truncates, so up to a whole ulp here, half of one on a GPU) + atol
1e-5, and for the tensor-core variant atol 2^-8: its softmax weights are rounded to TF32 (2^-11 relative) and
normalised by the same rounded weights, so the output moves by <= 2^-10 x max |v| (< 2^-8 for these unit-normal
values); reference vs gather + eager (fp32) 1e-6. An fp8 pool (kv_cache_dtype) with bf16 queries: the bf16
tolerances, the reference reading the same fp8 values (the kernel widens them exactly).
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import voxflow.kernels.paged_decode_attention as pda
import voxflow.layers.paged_attention as pa
from voxflow.engine.model_api import PagedKVContext
from voxflow.layers.attention import attention_bias, eager_attention
from voxflow.layers.paged_attention import PagedKVView
from voxflow.layers.qwen3_layer import Qwen3Attention
from voxflow.layers.rotary import RotaryEmbedding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def random_pages(lens, num_kv_heads, head_dim, block_size, dtype, seed, spare_pages=3, extra_width=1):
    """Pools whose unused pages hold NaN, rows on shuffled pages, tables padded with -1 (plus `extra_width`
    unused columns, as the engine's fixed-width tables have)."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_row = [-(-n // block_size) for n in lens]
    num_blocks = sum(pages_per_row) + spare_pages
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_pool = torch.full(shape, float("nan"), dtype=dtype)
    v_pool = torch.full(shape, float("nan"), dtype=dtype)
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(lens), max(pages_per_row) + extra_width), -1, dtype=torch.long)
    used = 0
    for b, (n, p) in enumerate(zip(lens, pages_per_row)):
        tables[b, :p] = order[used:used + p]
        used += p
        for t in range(n):          # only the context's slots are written; the rest of a last page stays NaN
            page, pos = tables[b, t // block_size], t % block_size
            k_pool[page, pos] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
            v_pool[page, pos] = torch.randn(num_kv_heads, head_dim, generator=gen).to(dtype)
    return k_pool, v_pool, tables, torch.tensor(lens, dtype=torch.long), gen


# ------------------------------------------------------------------------- kernel (interpreter, child)
# (batch lens, Hkv, group, head_dim, block_size, dtype, num_splits, strided q)
KERNEL_CASES = [
    ([1, 37, 70], 2, 1, 16, 8, "float32", 1, False),
    ([1, 37, 70], 2, 2, 16, 8, "float32", 3, True),
    ([0, 16, 49], 2, 2, 16, 16, "float32", 2, False),     # an empty row (batch padding) gives zeros
    ([5, 33, 64], 1, 2, 32, 16, "float32", 1, False),
    ([1, 37, 70], 2, 1, 16, 8, "bfloat16", 2, False),
    ([9, 40, 66], 2, 2, 16, 8, "bfloat16", 1, True),
    ([3, 24], 1, 3, 16, 8, "float32", 4, False),          # a group that is not a power of two
    ([5, 40], 1, 2, 24, 8, "float32", 2, False),          # a head_dim that is not a power of two (masked lanes)
    ([1, 37, 70], 2, 1, 16, 8, "float8_e4m3fn", 2, False),    # fp8 pools (kv_cache_dtype), bf16 queries
    ([9, 40, 66], 2, 2, 16, 8, "float8_e4m3fn", 1, True),
]


def run_kernel_cases() -> None:
    """Runs in the child (TRITON_INTERPRET=1 set before anything imported Triton): every case, kernel vs ref, with
    scores and weighted sums on CUDA cores and as MMAs (tensor_cores: the group padded to 16 rows, 32-token tiles).
    Messages name the case's index in that doubled list (case // 2 in KERNEL_CASES)."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    for i, (lens, hkv, group, d, bs, dtype_name, splits, strided, tensor_cores) in enumerate(
            (*case, tc) for case in KERNEL_CASES for tc in (False, True)):
        pool_dtype = getattr(torch, dtype_name)
        dtype = torch.bfloat16 if pool_dtype == torch.float8_e4m3fn else pool_dtype       # the queries'
        k_pool, v_pool, tables, ctx, gen = random_pages(lens, hkv, d, bs, pool_dtype, seed=i)
        q = torch.randn(len(lens), hkv * group, d, generator=gen).to(dtype)
        if strided:             # rows not adjacent in memory: the kernel must follow q's strides
            q = q.transpose(0, 1).contiguous().transpose(0, 1)
            assert not q.is_contiguous()
        scale = d ** -0.5
        out = pda.paged_decode_attention(q, k_pool, v_pool, tables, ctx, scale, num_splits=splits,
                                         tensor_cores=tensor_cores)
        ref = pda.paged_decode_attention_ref(q.float(), k_pool, v_pool, tables, ctx, scale)
        assert out.dtype == dtype and out.shape == q.shape
        assert not out.isnan().any(), f"case {i}: NaN"
        rtol, atol = (1e-5, 1e-5) if dtype == torch.float32 else (2 ** -7, 2 ** -8 if tensor_cores else 1e-5)
        torch.testing.assert_close(out.float(), ref, rtol=rtol, atol=atol, msg=lambda m: f"case {i}: {m}")
        if lens[0] == 0:
            assert torch.equal(out[0], torch.zeros_like(out[0]))
        check_append(q, k_pool, v_pool, tables, ctx, scale, splits, tensor_cores, out, rtol, atol, i)
        if tensor_cores:             # the tile loop software-pipelined (loop_stages): the same arithmetic
            piped = pda.paged_decode_attention(q, k_pool, v_pool, tables, ctx, scale, num_splits=splits,
                                               tensor_cores=True, loop_stages=2)
            assert torch.equal(piped, out), f"case {i}: loop_stages=2 differs"
        print(f"case {i} tensor_cores={tensor_cores} ok: max |err| {(out.float() - ref).abs().max().item():.3g}")


def check_append(q, k_pool, v_pool, tables, ctx, scale, splits, tensor_cores, expect, rtol, atol, i):
    """The fused-write variant: each row's last token handed over in k_new / v_new with its slot blanked (NaN)
    in the pools. Same output as the plain call; afterwards the pools hold the token again. An empty row (batch
    padding) writes to a spare page and attends to nothing."""
    bs = k_pool.shape[1]
    spare = next(p for p in range(k_pool.shape[0]) if p not in tables)
    slots = torch.tensor([int(tables[b, (n - 1) // bs]) * bs + (n - 1) % bs if n > 0 else spare * bs
                          for b, n in enumerate(ctx.tolist())])
    flat_k, flat_v = k_pool.view(-1, *k_pool.shape[2:]), v_pool.view(-1, *v_pool.shape[2:])
    k_new, v_new = flat_k[slots].clone(), flat_v[slots].clone()
    k_app, v_app = k_pool.clone(), v_pool.clone()
    k_app.view(-1, *k_pool.shape[2:])[slots] = float("nan")
    v_app.view(-1, *v_pool.shape[2:])[slots] = float("nan")
    out = pda.paged_decode_attention(q, k_app, v_app, tables, ctx, scale, num_splits=splits,
                                     tensor_cores=tensor_cores, k_new=k_new, v_new=v_new, slots=slots)
    torch.testing.assert_close(out.float(), expect.float(), rtol=rtol, atol=atol, msg=lambda m: f"append {i}: {m}")
    for pool, new in ((k_app, k_new), (v_app, v_new)):        # (the spare page's "token" is NaN: compare as 7)
        assert torch.equal(pool.view(-1, *k_pool.shape[2:])[slots].float().nan_to_num(7.0),
                           new.float().nan_to_num(7.0)), i
    if k_pool.dtype == torch.float8_e4m3fn:
        # The token handed over in the queries' dtype (as the layer does): rounded in the kernel, the same stored
        # bytes and output.
        k_wide, v_wide = k_app.clone(), v_app.clone()
        out = pda.paged_decode_attention(q, k_wide, v_wide, tables, ctx, scale, num_splits=splits,
                                         tensor_cores=tensor_cores, k_new=k_new.to(q.dtype), v_new=v_new.to(q.dtype),
                                         slots=slots)
        torch.testing.assert_close(out.float(), expect.float(), rtol=rtol, atol=atol, msg=lambda m: f"wide {i}: {m}")
        assert torch.equal(k_wide.view(torch.uint8), k_app.view(torch.uint8)), i
        assert torch.equal(v_wide.view(torch.uint8), v_app.view(torch.uint8)), i


def check_tf32_rounding() -> None:
    """Runs in the child: the kernel's round_to_tf32 gives the nearer of the two TF32 neighbours (ties: the larger)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _round(x_ptr, out_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(out_ptr + i, pda.round_to_tf32(tl.load(x_ptr + i)))

    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(1000, generator=gen), torch.tensor([0.0, 1.0, 2.0 ** -30])])
    halfway = (torch.tensor([0x3F000000 | 0x1000, 0x3E800000 | 0x3000], dtype=torch.int32)).view(torch.float32)
    x = torch.cat([x, halfway, torch.zeros(1024 - len(x) - 2)])
    out = torch.empty_like(x)
    _round[(1,)](x, out, N=1024)
    low = (x.view(torch.int32) & -0x2000).view(torch.float32)
    high = ((x.view(torch.int32) & -0x2000) + 0x2000).view(torch.float32)
    nearest = torch.where((x - low) < (high - x), low, high)
    assert torch.equal(out, nearest), (out - nearest).abs().max()
    assert (out.view(torch.int32) & 0x1FFF).eq(0).all()
    print("tf32 rounding ok")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_kernel_matches_reference_in_triton_interpreter():
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    child = subprocess.run([sys.executable, os.path.abspath(__file__)], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, f"kernel cases failed:\n{child.stdout}\n{child.stderr}"
    assert child.stdout.count(" ok: ") == 2 * len(KERNEL_CASES), child.stdout
    assert "tf32 rounding ok" in child.stdout


# --------------------------------------------------------------------- reference vs the existing path
@pytest.mark.parametrize("group", [1, 2])
def test_reference_equals_gather_and_eager_path(group):
    lens, hkv, d, bs = [1, 9, 24, 40], 2, 16, 8
    k_pool, v_pool, tables, ctx, gen = random_pages([n - 1 for n in lens], hkv, d, bs, torch.float32, seed=group)
    # Room for the new token: its slot is the row's next one (a fresh page when the last one is full).
    slots = []
    for b, n in enumerate(lens):
        if (n - 1) % bs == 0:
            free = next(p for p in range(k_pool.shape[0]) if p not in tables)
            tables[b, (n - 1) // bs] = free
        slots.append(int(tables[b, (n - 1) // bs]) * bs + (n - 1) % bs)
    kv = PagedKVContext(k_cache=[k_pool], v_cache=[v_pool], block_size=bs, block_tables=tables,
                        context_lens=torch.tensor(lens), slot_mapping=torch.tensor(slots)[:, None])
    q = torch.randn(len(lens), hkv * group, 1, d, generator=gen)
    k_new, v_new = torch.randn(2, len(lens), hkv, 1, d, generator=gen)
    view = PagedKVView(kv, 1)
    keys, values = view[0].append(k_new, v_new)          # writes the new token, gathers right-aligned
    bias = attention_bias(1, view.num_keys, view.key_valid, batch=len(lens), dtype=q.dtype, device=q.device)
    eager = eager_attention(q, keys, values, bias, d ** -0.5)[:, 0]
    ref = pda.paged_decode_attention_ref(q[:, :, 0], k_pool, v_pool, tables, kv.context_lens, d ** -0.5)
    torch.testing.assert_close(ref, eager, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------ the dispatch
def decode_setup(seed=0):
    """A decode step's context (new token slots reserved on fresh pages) and the new q/k/v."""
    lens, hkv, d, bs = [3, 17, 8], 2, 16, 8
    k_pool, v_pool, tables, _, gen = random_pages([n - 1 for n in lens], hkv, d, bs, torch.float32, seed=seed,
                                                  spare_pages=4)
    slots = []
    for b, n in enumerate(lens):
        if (n - 1) % bs == 0:
            tables[b, (n - 1) // bs] = next(p for p in range(k_pool.shape[0]) if p not in tables)
        slots.append(int(tables[b, (n - 1) // bs]) * bs + (n - 1) % bs)
    kv = PagedKVContext(k_cache=[k_pool], v_cache=[v_pool], block_size=bs, block_tables=tables,
                        context_lens=torch.tensor(lens), slot_mapping=torch.tensor(slots)[:, None])
    return kv, gen


def clone_kv(kv):
    return PagedKVContext([kv.k_cache[0].clone()], [kv.v_cache[0].clone()], kv.block_size, kv.block_tables,
                          kv.context_lens, kv.slot_mapping)


@pytest.fixture
def fake_kernel(monkeypatch):
    """Kernels 'on' for CPU tensors, the kernel replaced by its reference; records the calls."""
    calls = []

    def kernel(*args, k_new=None, v_new=None, slots=None):
        calls.append(args)
        # what the kernel does with the new token: write it, then attend over the whole context
        k_pool, v_pool = args[1], args[2]
        if k_new is not None:
            k_pool.view(-1, *k_pool.shape[2:])[slots] = k_new
            v_pool.view(-1, *v_pool.shape[2:])[slots] = v_new
        return pda.paged_decode_attention_ref(*args)

    monkeypatch.setattr(pa, "use_kernels", lambda t: True)
    monkeypatch.setattr(pda, "paged_decode_attention", kernel)
    return calls


@pytest.mark.parametrize("group", [1, 2])
def test_attend_runs_decode_through_the_kernel_and_agrees_with_the_reference_path(fake_kernel, monkeypatch, group):
    kv, gen = decode_setup(seed=group)
    q = torch.randn(3, 2 * group, 1, 16, generator=gen)
    k_new, v_new = torch.randn(2, 3, 2, 1, 16, generator=gen)
    ref_kv = clone_kv(kv)
    view = PagedKVView(kv, 1)
    out = view[0].attend(q, k_new, v_new, None, 0.25)   # bias unused on the kernel path
    assert len(fake_kernel) == 1 and "gather_index" not in view.__dict__   # lazy: the kernel path skips it
    monkeypatch.setattr(pa, "use_kernels", lambda t: False)          # now the reference path
    ref_view = PagedKVView(ref_kv, 1)
    bias = attention_bias(1, ref_view.num_keys, ref_view.key_valid, batch=3, dtype=q.dtype, device=q.device)
    ref = ref_view[0].attend(q, k_new, v_new, bias, 0.25)
    assert len(fake_kernel) == 1 and out.shape == ref.shape == (3, 1, 2 * group, 16)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    for a, b in ((kv.k_cache[0], ref_kv.k_cache[0]), (kv.v_cache[0], ref_kv.v_cache[0])):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))          # the new token written the same way


def test_attend_keeps_multi_token_calls_on_the_reference_path(fake_kernel):
    kv, gen = decode_setup()
    kv.slot_mapping = kv.slot_mapping.repeat(1, 2)      # two new tokens per row (one slot: only dispatch matters)
    q = torch.randn(3, 4, 2, 16, generator=gen)
    k_new, v_new = torch.randn(2, 3, 2, 2, 16, generator=gen)
    view = PagedKVView(kv, 2)
    bias = attention_bias(2, view.num_keys, view.key_valid, batch=3, dtype=q.dtype, device=q.device)
    out = view[0].attend(q, k_new, v_new, bias, 0.25)
    assert not fake_kernel and out.shape == (3, 2, 4, 16)


def test_qwen3_attention_uses_the_cache_attend_hook(fake_kernel, monkeypatch):
    torch.manual_seed(0)
    attn = Qwen3Attention(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=16, eps=1e-6)
    kv, gen = decode_setup()
    x = torch.randn(3, 1, 32, generator=gen)
    cos, sin = RotaryEmbedding(16, 10000.0)(kv.context_lens[:, None] - 1, x.dtype)
    ref_kv = clone_kv(kv)
    with torch.no_grad():
        out = attn(x, cos, sin, PagedKVView(kv, 1)[0], None)
        assert len(fake_kernel) == 1
        monkeypatch.setattr(pa, "use_kernels", lambda t: False)
        view = PagedKVView(ref_kv, 1)
        bias = attention_bias(1, view.num_keys, view.key_valid, batch=3, dtype=x.dtype, device=x.device)
        ref = attn(x, cos, sin, view[0], bias)
    assert len(fake_kernel) == 1
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)



def test_decode_on_the_kernel_path_builds_no_mask(fake_kernel, monkeypatch):
    """One new token with kernels on: the stack gets no attention mask and the view never builds its [B, T] key
    bookkeeping; otherwise (kernels off, or a multi-token chunk) the key_valid mask the reference path needs."""
    kv, gen = decode_setup()
    x = torch.randn(3, 1, 32, generator=gen)
    view = PagedKVView(kv, 1)
    assert view.attention_mask(x) is None and "_token" not in view.__dict__
    monkeypatch.setattr(pa, "use_kernels", lambda t: False)
    mask = view.attention_mask(x)
    assert mask is not None and mask.shape == (3, view.num_keys)
    assert torch.equal(mask.sum(1), kv.context_lens)          # each row's real slots, right-aligned


def test_tensor_core_variant_is_chosen_for_half_precision_batches_that_fill_the_sms(monkeypatch):
    monkeypatch.setattr(pda, "sm_count", lambda device: 132)
    monkeypatch.setattr(pda, "_TC_OVERRIDE", None)
    gpu = torch.device("cuda", 0)                      # only its type and index are read
    assert pda.default_tensor_cores(17, 8, 2, 128, gpu)                  # 136 programs >= 132 SMs
    assert not pda.default_tensor_cores(16, 8, 2, 128, gpu)
    assert not pda.default_tensor_cores(64, 8, 2, 128, gpu, torch.float32)   # fp32 dots would not be MMAs
    assert not pda.default_tensor_cores(64, 8, 17, 128, gpu)             # a group past one 16-row MMA
    assert not pda.default_tensor_cores(64, 8, 2, 8, gpu)
    assert not pda.default_tensor_cores(64, 8, 2, 128, torch.device("cpu"))
    monkeypatch.setattr(pda, "_TC_OVERRIDE", "0")
    assert not pda.default_tensor_cores(64, 8, 2, 128, gpu)
    monkeypatch.setattr(pda, "_TC_OVERRIDE", "1")
    assert pda.default_tensor_cores(1, 8, 2, 128, gpu)
    assert pda.default_tensor_cores(1, 8, 2, 128, gpu, torch.float32)    # forced: fp32 too (tests)
    assert not pda.default_tensor_cores(1, 8, 17, 128, gpu)              # never past its shapes
    # ~3 programs an SM: one split at 64 rows, more below; never below two tiles a chunk.
    assert [pda.default_tc_splits(b, 8, 4096, gpu) for b in (64, 48, 17)] == [1, 2, 3]
    assert pda.default_tc_splits(17, 8, 64, gpu) == 1
    assert pda.default_tc_splits(17, 8, 4096, torch.device("cpu")) == 1


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_register_cap_and_loop_stages_reach_the_tensor_core_launch_only(monkeypatch):
    """maxnreg / loop_stages (or VOXFLOW_PAGED_DECODE_MAXNREG / _STAGES for the tensor-core variant) reach the
    kernel's launch; the CUDA-core variant keeps its plain loop."""
    launches = []

    class FakeKernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append(kw)
    monkeypatch.setattr(pda, "_paged_decode_kernel", FakeKernel())
    k_pool, v_pool, tables, ctx, gen = random_pages([5, 9], 2, 16, 8, torch.bfloat16, seed=0)
    q = torch.randn(2, 4, 16, generator=gen).to(torch.bfloat16)
    run = lambda **kw: pda.paged_decode_attention(q, k_pool, v_pool, tables, ctx, 0.25, num_splits=1, **kw)  # noqa
    monkeypatch.setattr(pda, "_TC_MAXNREG", None)
    monkeypatch.setattr(pda, "_TC_LOOP_STAGES", 1)
    run(tensor_cores=True)
    run(tensor_cores=True, maxnreg=128)
    monkeypatch.setattr(pda, "_TC_MAXNREG", 120)
    run(tensor_cores=True)
    run(tensor_cores=False)
    monkeypatch.setattr(pda, "_TC_LOOP_STAGES", 3)
    run(tensor_cores=True, loop_stages=2)
    run(tensor_cores=True)
    run(tensor_cores=False)
    assert [kw.get("maxnreg") for kw in launches] == [None, 128, 120, None, 120, 120, None]
    assert [kw["LOOP_STAGES"] for kw in launches] == [1, 1, 1, 1, 2, 3, 1]
    assert launches[1]["num_warps"] == pda.TC_WARPS


def test_the_tensor_core_loop_is_pipelined_by_default():
    """Two stages unless VOXFLOW_PAGED_DECODE_STAGES says otherwise (session 51: -13% attention time, +6% served)."""
    assert pda.TC_LOOP_STAGES == 2
    if not os.environ.get("VOXFLOW_PAGED_DECODE_STAGES"):
        assert pda._TC_LOOP_STAGES == 2


def test_int32_offsets_only_when_every_offset_of_the_pools_fits():
    small = torch.empty(4, 16, 8, 128, device="meta")
    assert pda._offsets_fit_int32(small, small)
    strided = torch.empty(4, device="meta").as_strided((2, 16, 8, 128), (2 ** 31, 1024, 128, 1))   # numel < 2^31
    assert strided.numel() < 2 ** 31 and not pda._offsets_fit_int32(small, strided)


def test_forcing_the_tensor_core_variant_on_inputs_it_cannot_take_is_refused():
    k_pool, v_pool, tables, ctx, gen = random_pages([5, 9], 1, 16, 8, torch.bfloat16, seed=0)
    q = torch.randn(2, 20, 16, generator=gen).to(torch.bfloat16)                   # a group of 20 query heads
    with pytest.raises(ValueError, match="<= 16 query heads"):
        pda.paged_decode_attention(q, k_pool, v_pool, tables, ctx, 0.25, tensor_cores=True)
    with pytest.raises(ValueError, match="share a dtype"):
        pda.paged_decode_attention(q[:, :2].float(), k_pool, v_pool, tables, ctx, 0.25, tensor_cores=True)


if __name__ == "__main__":
    run_kernel_cases()
    check_tf32_rounding()
