"""The element-wise Triton kernels (RMSNorm, rotary, silu*mul) against their torch references, on the CPU.

The kernels run under Triton's interpreter (TRITON_INTERPRET=1), small shapes, fp32 and bf16. Tolerances, in
units in the last place (ulp) of the output dtype, are what the kernel's rounding order allows:
- rotary: bit-exact (each product and the sum rounded as torch rounds them, no fma);
- RMSNorm: <= 8 ulp fp32 (~1e-6 relative), <= 2 ulp bf16. Only the order of the fp32 sum of squares differs
  (a tree here, torch's vectorised order there): the mean of squares moves by up to 2 ulp, the fp32 outputs by
  up to 5 ulp (75-85% bit-equal; measured on 300 random rows of widths 32..2048). In bf16 that can flip the
  rounding of the normalised value by 1 ulp, which the weight multiply turns into up to 2 ulp of the product
  when it drops a binade (seen on the H200 in a handful of 8192x2048 elements; none in these CPU cases);
- silu*mul: <= 8 ulp fp32, <= 1 ulp bf16. The interpreter's exp is numpy's and torch's CPU silu is its own
  vectorised formula (measured: up to 5 fp32 ulp, 84% bit-equal; bf16 all bit-equal on 200k elements); on
  CUDA both sides use expf and the GPU tests hold it bit-exact.

Why a subprocess: TRITON_INTERPRET must be set before `triton` is *imported*, not just before a kernel is
decorated. Triton's own library functions (tl.sum, ...) are @triton.jit functions decorated at import time;
imported without the variable they are compiled-mode functions that the interpreter cannot call ("Cannot call
@triton.jit'd outside of the scope of a kernel"). By the time this module is collected, other test modules (and
voxflow.kernels itself) have imported triton, and setting the variable in-process would also leak interpreted
kernels into any GPU test run in the same session. So `test_kernels_under_the_triton_interpreter` re-runs this
file in a fresh pytest process with TRITON_INTERPRET=1, where the `check_*` functions below are collected as
tests; in the outer process only the launcher is.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from float_compare import assert_within_ulp  # tests/float_compare.py
from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

from voxflow.layers import mlp as mlp_layer  # noqa: E402
from voxflow.layers import rms_norm as norm_layer  # noqa: E402
from voxflow.layers import rotary as rotary_layer  # noqa: E402
from voxflow.layers.qwen3_layer import Qwen3DecoderLayer  # noqa: E402

CHILD_FLAG = "VOXFLOW_INTERPRETED_KERNEL_TESTS"
IN_CHILD = in_child(CHILD_FLAG)
DTYPES = (torch.float32, torch.bfloat16)
NORM_ULP = {torch.float32: 8, torch.bfloat16: 2}
SILU_ULP = {torch.float32: 8, torch.bfloat16: 1}


if not IN_CHILD:
    def test_kernels_under_the_triton_interpreter():
        run_child(__file__, CHILD_FLAG)


@pytest.fixture(scope="module")
def kernels():
    from types import SimpleNamespace

    from voxflow.kernels import rms_norm, rotary, silu_mul
    return SimpleNamespace(rms_norm=rms_norm, rotary=rotary, silu_mul=silu_mul)


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same strides wherever they matter (a size-1 dim's stride is arbitrary)."""
    return a.shape == b.shape and all(sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()) if n > 1)


def qk_views(b, s, hq, hkv, d, dtype, gen):
    """q [B, Hq, S, D] and k [B, Hkv, S, D] as the layer makes them: transposed views of [B, S, H, D]."""
    q = torch.randn(b, s, hq, d, generator=gen).to(dtype).transpose(1, 2)
    k = torch.randn(b, s, hkv, d, generator=gen).to(dtype).transpose(1, 2)
    return q, k


def cos_sin(b, s, d, dtype, gen):
    positions = torch.randint(0, 5000, (b, s), generator=gen)
    return rotary_layer.RotaryEmbedding(d, 1e6)(positions, dtype)


# ---- RMSNorm -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 256), (2, 3, 4, 32), (7, 96)])    # hidden, per-head, not a power of 2
def check_rms_norm_matches_reference(kernels, dtype, shape):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    w = (torch.rand(shape[-1], generator=gen) + 0.5).to(dtype)
    assert_within_ulp(kernels.rms_norm.rms_norm(x, w, 1e-6), norm_layer.rms_norm(x, w, 1e-6), NORM_ULP[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def check_rms_norm_strided_inputs(kernels, dtype):
    gen = torch.Generator().manual_seed(2)
    w = (torch.rand(32, generator=gen) + 0.5).to(dtype)
    base = (torch.randn(2, 3, 4, 32, generator=gen) * 2).to(dtype)
    views = [base.transpose(1, 2),                                  # rows not in memory order
             base[:, :, 1:3],                                       # rows with gaps
             base.permute(0, 1, 3, 2).contiguous().transpose(-1, -2)]   # the normalised dim itself strided
    for x in views:
        out = kernels.rms_norm.rms_norm(x, w, 1e-5)
        assert_within_ulp(out, norm_layer.rms_norm(x, w, 1e-5), NORM_ULP[dtype])


def check_rms_norm_weight_dtype_promotes_like_torch(kernels):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    w = torch.rand(64, generator=gen) + 0.5                                # fp32 weight, bf16 activations
    expect = norm_layer.rms_norm(x, w, 1e-6)
    assert expect.dtype == torch.float32
    # y is rounded to bf16 before the fp32 multiply, so a wrong order shows as far more than 1 ulp of fp32.
    assert_within_ulp(kernels.rms_norm.rms_norm(x, w, 1e-6), expect, 1 << 16)
    assert_within_ulp(kernels.rms_norm.rms_norm(x.float(), w, 1e-6), norm_layer.rms_norm(x.float(), w, 1e-6),
                      NORM_ULP[torch.float32])


@pytest.mark.parametrize("dtype", DTYPES)
def check_add_rms_norm_matches_reference(kernels, dtype):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 2, 128, generator=gen).to(dtype)
    res = (torch.randn(3, 2, 128, generator=gen) * 4).to(dtype)
    w = (torch.rand(128, generator=gen) + 0.5).to(dtype)
    normed, summed = kernels.rms_norm.add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(summed, x + res)
    assert_within_ulp(normed, norm_layer.rms_norm(x + res, w, 1e-6), NORM_ULP[dtype])


# ---- rotary --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES + (torch.float16,))
@pytest.mark.parametrize("b,s,hq,hkv,d", [(2, 3, 4, 2, 32), (1, 1, 40, 8, 128), (2, 2, 3, 1, 24)])
def check_rotary_is_bit_exact(kernels, dtype, b, s, hq, hkv, d):
    """(1, 1, 40, 8, 128) loops over two head blocks; d=24 has a half (12) that is not a power of two."""
    gen = torch.Generator().manual_seed(5)
    q, k = qk_views(b, s, hq, hkv, d, dtype, gen)
    cos, sin = cos_sin(b, s, d, dtype, gen)
    expect_q, expect_k = rotary_layer.apply_rotary(q, k, cos, sin)
    got_q, got_k = kernels.rotary.apply_rotary(q, k, cos, sin)
    assert torch.equal(got_q, expect_q) and torch.equal(got_k, expect_k)
    assert same_layout(got_q, expect_q) and same_layout(got_k, expect_k)
    assert torch.equal(q, q.clone()) and got_q.data_ptr() != q.data_ptr()                   # out of place


def check_rotary_broadcast_table_and_contiguous_inputs(kernels):
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(3, 4, 2, 16, generator=gen)
    k = torch.randn(3, 2, 2, 16, generator=gen)
    cos, sin = cos_sin(1, 2, 16, torch.float32, gen)                      # one table for the whole batch
    expect = rotary_layer.apply_rotary(q, k, cos, sin)
    got = kernels.rotary.apply_rotary(q, k, cos, sin)
    assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1])


# ---- silu * mul ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def check_silu_mul_matches_reference(kernels, dtype):
    gen = torch.Generator().manual_seed(7)
    gate = (torch.randn(3, 2, 700, generator=gen) * 4).to(dtype)          # 4200 elements: a partial last block
    up = torch.randn(3, 2, 700, generator=gen).to(dtype)
    assert_within_ulp(kernels.silu_mul.silu_mul(gate, up), F.silu(gate) * up, SILU_ULP[dtype])
    fused = torch.randn(5, 96, generator=gen).to(dtype)                   # strided halves of one projection
    g, u = fused[:, :48], fused[:, 48:]
    assert_within_ulp(kernels.silu_mul.silu_mul(g, u), F.silu(g) * u, SILU_ULP[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def check_silu_mul_folded_matches_reference(kernels, dtype):
    """silu_mul_folded (the post-attention norm folded into gate|up): gate and up scaled by the MLP input's row
    factor, then silu * up, against folded_norms.silu_mul_folded_reference; halves of one projection, a partial
    last column block, a hidden width that is not a power of two. The factor's fp32 sum order differs from torch's,
    so an operand may round to its neighbour: a bf16 ulp more than silu_mul's own tolerance."""
    from voxflow.layers.folded_norms import silu_mul_folded_reference
    gen = torch.Generator().manual_seed(12)
    fused = (torch.randn(5, 2 * 1100, generator=gen) * 2).to(dtype)
    x = (torch.randn(5, 96, generator=gen) * torch.linspace(0.5, 4, 5)[:, None]).to(dtype)
    g, u = fused[:, :1100], fused[:, 1100:]
    got = kernels.silu_mul.silu_mul_folded(g, u, x, 1e-6)
    assert_within_ulp(got, silu_mul_folded_reference(g, u, x, 1e-6), SILU_ULP[dtype] + (dtype != torch.float32))
    # the factor matters: unscaled operands give something else
    assert not torch.allclose(got.float(), (F.silu(g) * u).float(), rtol=1e-2, atol=1e-2)


# ---- dispatch from the layers --------------------------------------------------------------------
@pytest.fixture
def force_kernels(kernels, monkeypatch):
    """Make the layers take their kernel branch on CPU tensors (they then import the interpreted copies)."""
    for layer in (norm_layer, rotary_layer, mlp_layer):
        monkeypatch.setattr(layer, "use_kernels", lambda t: True)
    calls = []
    for mod, fn in ((kernels.rms_norm, "rms_norm"), (kernels.rms_norm, "add_rms_norm"),
                    (kernels.rotary, "apply_rotary"), (kernels.silu_mul, "silu_mul")):
        real = getattr(mod, fn)
        monkeypatch.setattr(mod, fn, lambda *a, _real=real, _fn=fn: (calls.append(_fn), _real(*a))[1])
    return calls


def check_layers_dispatch_to_the_kernels(force_kernels):
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(2, 64, generator=gen)
    w = torch.rand(64, generator=gen) + 0.5
    norm_layer.rms_norm(x, w, 1e-6)
    norm_layer.add_rms_norm(x, x, w, 1e-6)
    q, k = qk_views(1, 2, 2, 1, 16, torch.float32, gen)
    rotary_layer.apply_rotary(q, k, *cos_sin(1, 2, 16, torch.float32, gen))
    with torch.no_grad():
        mlp_layer.SwiGLU(64, 96)(x)
    assert force_kernels == ["rms_norm", "add_rms_norm", "apply_rotary", "silu_mul"]


def check_layers_keep_the_reference_where_the_kernel_does_not_apply(force_kernels):
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 64, generator=gen, requires_grad=True)             # autograd: kernels have no backward
    w = torch.rand(64, generator=gen) + 0.5
    norm_layer.rms_norm(x, w, 1e-6).sum().backward()
    assert x.grad is not None
    q, k = qk_views(1, 2, 2, 1, 16, torch.float32, gen)
    cos, sin = cos_sin(1, 2, 16, torch.bfloat16, gen)                     # mixed dtypes: torch promotes
    assert rotary_layer.apply_rotary(q, k, cos, sin)[0].dtype == torch.float32
    mlp_layer.SwiGLU(64, 96)(x).sum().backward()
    assert force_kernels == []


@pytest.mark.parametrize("dtype", DTYPES + (torch.float16,))
def check_scaled_add_rms_norm_matches_reference(kernels, dtype):
    """add_rms_norm(scale=): a LayerScale'd branch added to its residual stream and the norm after it (the codec
    transformer's), the sum with the bits of `stream + scale * branch`, the norm as the norm kernel's."""
    from voxflow.models.qwen3_tts.codec_decoder import LayerScale
    gen = torch.Generator().manual_seed(13)
    branch = (torch.randn(3, 5, 512, generator=gen) * 4).to(dtype)
    stream = torch.randn(3, 5, 512, generator=gen).to(dtype)
    w = (torch.rand(512, generator=gen) + 0.5).to(dtype)
    layer_scale = LayerScale(512, 0.01).to(dtype).requires_grad_(False)
    layer_scale.scale.uniform_(0.001, 0.5, generator=gen)
    want = stream + layer_scale(branch)
    normed, summed = kernels.rms_norm.add_rms_norm(branch, stream, w, 1e-5, scale=layer_scale.scale)
    assert torch.equal(summed, want) and not torch.equal(summed, stream + branch)
    assert_within_ulp(normed, norm_layer.rms_norm(want, w, 1e-5), NORM_ULP.get(dtype, 2))
    assert torch.equal(normed, kernels.rms_norm.rms_norm(want, w, 1e-5))       # what the norm kernel alone gives
    # the layer function: the kernel where it runs, else the same sum by torch
    ref_normed, ref_summed = norm_layer.add_rms_norm(branch, stream, w, 1e-5, scale=layer_scale.scale)
    assert torch.equal(ref_summed, want) and torch.equal(ref_normed, norm_layer.rms_norm(want, w, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def check_kv_window_equals_the_concatenations(monkeypatch, dtype):
    """kernels/kv_window.py: a streaming call's whole key / value window and the carried last L rows, the values of
    the two concatenations and copies it replaces (calls shorter and longer than the window; new rows as the
    rotary kernel's strided output), the carried rows also into given strided tensors (the codec pool's packed
    write-back rows), and the codec attention's `_window` through it on the GPU path, into a StateWriter's slots."""
    from voxflow.kernels import kv_window
    from voxflow.models.qwen3_tts import codec_decoder
    from voxflow.models.qwen3_tts.codec_decoder_blocks import StateWriter
    gen = torch.Generator().manual_seed(14)
    for t in (1, 5, 9):
        k_cache, v_cache = (torch.randn(2, 3, 7, 24, generator=gen).to(dtype) for _ in range(2))
        k_new = torch.randn(2, t, 3, 24, generator=gen).to(dtype).transpose(1, 2)          # [B, H, T, D] view
        v_new = torch.randn(2, 3, t, 24, generator=gen).to(dtype)
        plain = {"k": k_cache, "v": v_cache}
        want = (*codec_decoder._window(plain, "k", "v", k_new, v_new), plain["k"], plain["v"])   # the torch path
        assert not torch.equal(want[2], k_cache)
        got = kv_window.kv_window(k_cache, v_cache, k_new, v_new)
        assert all(torch.equal(a, b) and a.is_contiguous() for a, b in zip(got, want)), t
        assert got[2].shape == k_cache.shape and got[0].shape == (2, 3, 7 + t, 24)
        # the carried rows into two pieces of one [B, N] buffer per row, as the pool's views lay them out
        n = k_cache[0].numel()
        rows = torch.full((2, 2 * n + 5), -7.0).to(dtype)
        k_slot, v_slot = (rows[:, o:o + n].view(2, 3, 7, 24) for o in (0, n + 5))
        out = kv_window.kv_window(k_cache, v_cache, k_new, v_new, keep_out=(k_slot, v_slot))
        assert out[2] is k_slot and out[3] is v_slot
        assert torch.equal(k_slot, want[2]) and torch.equal(v_slot, want[3]) and torch.equal(out[0], want[0])
        assert (rows[:, n:n + 5] == -7).all()                                     # nothing written between them
        calls = []
        real = kv_window.kv_window
        monkeypatch.setattr(kv_window, "kv_window", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
        monkeypatch.setattr(codec_decoder, "use_kernels", lambda x: True)
        slots = {"k": torch.empty_like(k_cache), "v": torch.empty_like(v_cache)}
        writer = StateWriter({"k": k_cache, "v": v_cache}, slots)
        k_all, v_all = codec_decoder._window(writer, "k", "v", k_new, v_new)
        assert torch.equal(k_all, want[0]) and torch.equal(v_all, want[1]) and len(calls) == 1
        assert calls[0]["keep_out"][0] is slots["k"] and writer.written == {"k", "v"} and writer["v"] is slots["v"]
        assert torch.equal(slots["k"], want[2]) and torch.equal(slots["v"], want[3])
        monkeypatch.undo()
    # only the carried rows (write_all=False), for calls longer than a row block (BLOCK_S 32 at this head size)
    for t in (3, 40):
        k_new, v_new = (torch.randn(2, 3, t, 24, generator=gen).to(dtype) for _ in range(2))
        k_all, v_all, k_keep, v_keep = kv_window.kv_window(k_cache, v_cache, k_new, v_new, write_all=False)
        assert k_all is None and v_all is None
        assert torch.equal(k_keep, torch.cat([k_cache, k_new], dim=2)[:, :, t:])
        assert torch.equal(v_keep, torch.cat([v_cache, v_new], dim=2)[:, :, t:])
    with pytest.raises(ValueError, match="share memory"):
        kv_window.kv_window(k_cache, v_cache, k_new, v_new, keep_out=(k_cache, v_cache.clone()))
    with pytest.raises(ValueError, match="caches"):
        kv_window.kv_window(k_cache, v_cache, k_new[:, :2], v_new)
    with pytest.raises(ValueError, match="keep_out"):
        kv_window.kv_window(k_cache, v_cache, k_new, v_new, keep_out=(k_cache[:, :2], v_cache[:, :2]))


def _window_reference(q, k_cache, v_cache, k_new, v_new, start, window):
    """PyTorch's attention over the concatenated window with the boolean mask the codec built (fp32) -> [B, T, H*D]."""
    import torch.nn.functional as F
    b, h, t, d = q.shape
    cached = k_cache.shape[2]
    k, v = (torch.cat([c, n], dim=2).float().repeat_interleave(h // c.shape[1], dim=1)
            for c, n in ((k_cache, k_new), (v_cache, v_new)))
    q_pos, k_pos = start[:, None] + torch.arange(t), start[:, None] + torch.arange(-cached, t)
    delta = q_pos[:, :, None] - k_pos[:, None, :]
    mask = ((delta >= 0) & (delta < window) & (k_pos >= 0)[:, None, :])[:, None]
    out = F.scaled_dot_product_attention(q.float(), k, v, attn_mask=mask, scale=d ** -0.5)
    return out.transpose(1, 2).reshape(b, t, h * d)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float16, 2e-3)])
def check_window_attention_equals_the_masked_attention(dtype, tol):
    """kernels/window_attention.py: the streamed call's attention read from the carried window and the new rows,
    masked from the streams' first positions (a stream's first call, a young one, an old one), against PyTorch's
    attention over the concatenation with the boolean mask the codec builds: fp32 within 1e-6, fp16 within its
    rounding (tol relative to the output's scale). T = 20 spans two query blocks; 4 query heads share 2 KV heads;
    q as the rotary kernel leaves it (a transposed view); a head size under 16 (tl.dot's smallest) padded."""
    from voxflow.kernels.window_attention import window_attention
    gen = torch.Generator().manual_seed(21)
    window = 8
    start = torch.tensor([0, 3, 40])
    for t in (1, 5, 20):
        q = torch.randn(3, t, 4, 16, generator=gen).to(dtype).transpose(1, 2)
        k_cache, v_cache = (torch.randn(3, 2, window - 1, 16, generator=gen).to(dtype) for _ in range(2))
        k_new, v_new = (torch.randn(3, 2, t, 16, generator=gen).to(dtype) for _ in range(2))
        want = _window_reference(q, k_cache, v_cache, k_new, v_new, start, window)
        got = window_attention(q, k_cache, v_cache, k_new, v_new, start, 16 ** -0.5)
        assert got.shape == (3, t, 64) and got.dtype == dtype and got.is_contiguous()
        assert (got.float() - want).abs().max() <= tol * want.abs().max(), t
        # a young stream's unused cache slots (before its first frame) are not attended: garbage there changes
        # nothing; in slots it does attend, it does
        for c in (k_cache, v_cache):
            c[0], c[1, :, :window - 1 - 3], c[2, :, -1] = 1e3, 1e3, 1e3
        again = window_attention(q, k_cache, v_cache, k_new, v_new, start, 16 ** -0.5)
        assert torch.equal(again[:2], got[:2]) and not torch.equal(again[2], got[2])
    q8, k8, v8 = (x[..., :8] for x in (q, k_new, v_new))                      # head size 8 (the tiny decoder's)
    kc8, vc8 = k_cache[..., :8].contiguous(), v_cache[..., :8].contiguous()
    want = _window_reference(q8, kc8, vc8, k8, v8, start, window)
    got = window_attention(q8, kc8, vc8, k8, v8, start, 8 ** -0.5)
    assert got.shape == (3, 20, 32) and (got.float() - want).abs().max() <= tol * want.abs().max()
    every_other = torch.stack([start, torch.full_like(start, 10 ** 6)], dim=1)[:, 0]    # start, stride 2
    assert every_other.stride(0) == 2 and torch.equal(
        window_attention(q, k_cache, v_cache, k_new, v_new, every_other, 16 ** -0.5),
        window_attention(q, k_cache, v_cache, k_new, v_new, start, 16 ** -0.5))
    with pytest.raises(ValueError, match="start"):
        window_attention(q, k_cache, v_cache, k_new, v_new, start[:2], 1.0)
    with pytest.raises(ValueError, match="start"):
        window_attention(q, k_cache, v_cache, k_new, v_new, start.int(), 1.0)
    with pytest.raises(ValueError, match="alike"):
        window_attention(q, k_cache, v_cache, k_new[:, :, :1], v_new, start, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def check_rope_table_equals_the_frame_transformers(dtype):
    """kernels/rope_table.py: the codec's cos / sin tables for frames start .. start + T - 1 of each stream equal
    FrameTransformer.rope's (its inverse frequencies in the decoder's dtype, as a cast decoder holds them) to one
    unit in the last place of the output dtype (the interpreter's cos / sin are numpy's, not torch's), and the next
    positions (start + T) land in a strided tensor, nothing written between its entries."""
    from voxflow.kernels.rope_table import rope_table
    from voxflow.models.qwen3_tts.codec_decoder import FrameTransformer
    from voxflow.models.qwen3_tts.config import CodecDecoderConfig
    tr = FrameTransformer(CodecDecoderConfig(hidden_size=32, head_dim=16, num_attention_heads=2,
                                             num_key_value_heads=2, num_hidden_layers=1)).to(dtype)
    start = torch.tensor([0, 7, 123_456])
    for t in (1, 5):
        want_cos, want_sin = tr.rope(start[:, None] + torch.arange(t), dtype)
        nxt = torch.full((3, 2), -1, dtype=torch.long)
        cos, sin = rope_table(start, t, tr.inv_freq, dtype, nxt[:, 0])
        assert cos.shape == want_cos.shape == (3, t, 16) and cos.dtype == dtype
        assert_within_ulp(cos, want_cos, 1)
        assert_within_ulp(sin, want_sin, 1)
        assert nxt[:, 0].tolist() == (start + t).tolist() and (nxt[:, 1] == -1).all()
    with pytest.raises(ValueError, match="LongTensor"):
        rope_table(start.float(), 1, tr.inv_freq, dtype, nxt[:, 0])
    with pytest.raises(ValueError, match="next_positions"):
        rope_table(start, 1, tr.inv_freq, dtype, nxt[:2, 0])


@pytest.mark.parametrize("window_kernel", [True, False])
def check_codec_frame_rate_kernels_stream_like_the_plain_decoder(monkeypatch, window_kernel):
    """The codec decoder streamed a frame at a time with its frame-rate GPU path taken (q|k|v in one GEMM, the
    key / value window kernel, the window attention kernel or PyTorch's attention, the LayerScale'd adds fused with
    their norms, the RoPE and codebook kernels): the plain one-pass decode's audio within 1e-4
    (test_codec_decoder.py's streaming bound)."""
    from test_codec_decoder import random_codes, random_decoder           # tests/test_codec_decoder.py
    from voxflow.kernels import kv_window, rms_norm, rope_table, rotary, rvq_lookup, window_attention
    from voxflow.models.qwen3_tts import codec_decoder, codec_decoder_blocks
    from voxflow.models.qwen3_tts.codec_decoder_blocks import StateWriter
    from voxflow.models.qwen3_tts.codec_streaming import init_stream_state
    monkeypatch.setattr(codec_decoder, "WINDOW_ATTENTION", window_kernel)
    dec = random_decoder(seed=4).requires_grad_(False)
    codes = random_codes(3, seed=6)
    ran = []
    for module, name in ((kv_window, "kv_window"), (rotary, "apply_rotary"), (rvq_lookup, "rvq_lookup"),
                         (rms_norm, "add_rms_norm"), (window_attention, "window_attention"),
                         (rope_table, "rope_table")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, _real=real, _name=name, **kw: ran.append(_name) or _real(*a, **kw))
    with torch.no_grad():
        want = dec(codes)
        for module in (codec_decoder, rotary_layer, norm_layer):
            monkeypatch.setattr(module, "use_kernels", lambda t: True)
        monkeypatch.setattr(codec_decoder_blocks, "use_kernels", lambda t: t.dtype == torch.long)   # the lookups
        state = init_stream_state(dec, 1).tensors
        streamed = torch.cat([dec(codes[..., i:i + 1], state) for i in range(3)], dim=-1)
        # again through StateWriters whose slots start as garbage (as the pool's step runs it): the same bits
        carried, through_writer = init_stream_state(dec, 1).tensors, []
        for i in range(3):
            writer = StateWriter(carried, {k: torch.full_like(v, float("nan") if v.is_floating_point() else -1)
                                           for k, v in carried.items()})
            through_writer.append(dec(codes[..., i:i + 1], writer))
            carried = {k: writer.slots[k] if k in writer.written else carried[k] for k in carried}
    layers = len(dec.pre_transformer.layers)
    assert sorted(set(ran)) == ["add_rms_norm", "apply_rotary", "kv_window", "rope_table", "rvq_lookup"] + (
        ["window_attention"] if window_kernel else [])
    assert ran.count("rope_table") == 6
    assert ran.count("kv_window") == 6 * layers and ran.count("add_rms_norm") == 6 * 2 * layers
    assert ran.count("window_attention") == (6 * layers if window_kernel else 0)
    assert torch.equal(torch.cat(through_writer, dim=-1), streamed)
    assert all(torch.equal(carried[k], state[k]) for k in state)
    assert streamed.shape == want.shape and want.std() > 0.05
    torch.testing.assert_close(streamed, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def check_codec_attention_rotary_kernel_is_bit_exact(force_kernels, monkeypatch, dtype):
    """The codec decoder's sliding-window attention (its real 16 x 64 heads), streaming two calls with a state:
    through the rotary kernel, the same bits as through the torch expression, outputs and carried keys alike."""
    from voxflow.models.qwen3_tts.codec_decoder import SlidingWindowAttention, WindowMask
    from voxflow.models.qwen3_tts.config import CodecDecoderConfig
    torch.manual_seed(12)
    cfg = CodecDecoderConfig(hidden_size=128, sliding_window=6)
    attn = SlidingWindowAttention(cfg).to(dtype).eval().requires_grad_(False)
    attn.state_key = "attn"
    runs = []
    for kernels_on in (True, False):
        monkeypatch.setattr(rotary_layer, "use_kernels", lambda t, on=kernels_on: on)
        state = attn.init_state(2, "cpu", dtype)
        outs = []
        with torch.no_grad():
            for start, t in ((0, 3), (3, 4)):
                pos = torch.arange(start, start + t)[None].expand(2, -1)
                cos, sin = rotary_layer.RotaryEmbedding(64, 1e4)(pos, dtype)
                mask = WindowMask(cfg.sliding_window, t, torch.full((2,), start), attn.cache_len, "cpu")
                x = torch.randn(2, t, 128, generator=torch.Generator().manual_seed(start)).to(dtype)
                outs.append(attn(x, cos, sin, mask, state))
        runs.append((outs, state))
    assert force_kernels.count("apply_rotary") == 2                      # the kernel ran in the first pass only
    (fast, fast_state), (ref, ref_state) = runs
    assert all(torch.equal(a, b) for a, b in zip(fast, ref))
    assert all(torch.equal(fast_state[k], ref_state[k]) for k in ref_state)
    assert ref[1].abs().max() > 0.01


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def check_decoder_layer_kernels_on_vs_off(kernels, force_kernels, monkeypatch, dtype, tol):
    """A whole (tiny) Qwen3 decoder layer through the kernels vs the reference; tol relative to the output scale."""
    torch.manual_seed(10)
    layer = Qwen3DecoderLayer(64, 96, 4, 2, 16, 1e-6).to(dtype).eval().requires_grad_(False)
    for name, p in layer.named_parameters():
        if name.endswith("norm.weight"):
            p.data.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 64).to(dtype)
    cos, sin = cos_sin(2, 3, 16, dtype, torch.Generator().manual_seed(11))
    with torch.no_grad():
        fast = layer(x, cos, sin, None, None)
        assert set(force_kernels) == {"rms_norm", "apply_rotary", "silu_mul"}
        for mod in (norm_layer, rotary_layer, mlp_layer):
            monkeypatch.setattr(mod, "use_kernels", lambda t: False)
        ref = layer(x, cos, sin, None, None)
    scale = ref.float().abs().max()
    assert (fast.float() - ref.float()).abs().max() <= tol * scale


# The interpreted checks are collected only in the child process (see the module docstring).
if IN_CHILD:
    globals().update({"test_" + name[len("check_"):]: fn for name, fn in list(globals().items())
                      if name.startswith("check_")})
