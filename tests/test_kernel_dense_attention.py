"""The single-query dense-cache attention kernel (the code predictor's) against eager attention, on the CPU
through Triton's interpreter (in a subprocess: TRITON_INTERPRET must be set before triton is first imported).

Tolerances: fp32 <= 2e-6 absolute on O(1) outputs (summation order only); bf16 <= 2e-2 (the eager path rounds
scores and weights to bf16, the kernel keeps them in fp32)."""
from __future__ import annotations

import os

import pytest
import torch

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_DENSE_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def check_against_eager():
    from voxflow.kernels.dense_decode_attention import dense_decode_attention, supported
    from voxflow.layers.attention import eager_attention
    g = torch.Generator().manual_seed(0)
    for dtype, tol in ((torch.float32, 2e-6), (torch.bfloat16, 2e-2)):
        for b, hq, hkv, t, d in ((3, 4, 2, 1, 16), (2, 6, 2, 17, 32), (1, 4, 4, 16, 16), (2, 8, 2, 35, 16)):
            # q as the layer makes it: a transposed view of [B, S, H, D]
            q = torch.randn(b, 1, hq, d, generator=g).to(dtype).transpose(1, 2)
            k = torch.randn(b, hkv, t, d, generator=g).to(dtype)
            v = torch.randn(b, hkv, t, d, generator=g).to(dtype)
            assert supported(q, k)
            want = eager_attention(q, k, v, None, d ** -0.5).float()
            got = dense_decode_attention(q, k, v, d ** -0.5)
            assert got.shape == (b, 1, hq, d) and got.dtype == dtype
            err = (got.float() - want).abs().max().item()
            assert err <= tol, (dtype, b, hq, hkv, t, d, err)


def check_append_against_eager():
    """The append variant: attends over the cached prefix plus the new token, and writes the token into the cache."""
    from voxflow.kernels.dense_decode_attention import dense_decode_attention_append
    from voxflow.layers.attention import eager_attention
    g = torch.Generator().manual_seed(1)
    for dtype, tol in ((torch.float32, 2e-6), (torch.bfloat16, 2e-2)):
        for b, hq, hkv, length, d in ((3, 4, 2, 0, 16), (2, 6, 2, 5, 32), (1, 4, 4, 15, 16)):
            cache_k = torch.randn(b, hkv, 16, d, generator=g).to(dtype)
            cache_v = torch.randn(b, hkv, 16, d, generator=g).to(dtype)
            q = torch.randn(b, 1, hq, d, generator=g).to(dtype).transpose(1, 2)
            k_new = torch.randn(b, 1, hkv, d, generator=g).to(dtype).transpose(1, 2)   # views, as the layer has
            v_new = torch.randn(b, 1, hkv, d, generator=g).to(dtype).transpose(1, 2)
            keys = torch.cat((cache_k[:, :, :length], k_new), dim=2)
            values = torch.cat((cache_v[:, :, :length], v_new), dim=2)
            untouched = cache_k[:, :, length + 1:].clone()
            want = eager_attention(q, keys, values, None, d ** -0.5).float()
            got = dense_decode_attention_append(q, k_new, v_new, cache_k, cache_v, length, d ** -0.5)
            err = (got.float() - want).abs().max().item()
            assert err <= tol, (dtype, b, hq, hkv, length, d, err)
            assert torch.equal(cache_k[:, :, :length + 1], keys) and torch.equal(cache_v[:, :, :length + 1], values)
            assert torch.equal(cache_k[:, :, length + 1:], untouched)
    full = torch.zeros(1, 2, 4, 16)
    with pytest.raises(ValueError, match="no room"):
        dense_decode_attention_append(torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 16),
                                      full, full.clone(), 4, 0.25)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (torch.equal calls -0.0 and +0.0 equal)."""
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(ints[a.dtype]), b.view(ints[b.dtype]))


def check_norm_rope_append_against_the_two_kernels_it_fuses():
    """q/k norms + RoPE + append + attention in one kernel == the reference norms/RoPE then eager attention; the
    cache gets the normed, rotated key (bit-equal to the qk_norm_rope kernel's) and the raw value. Cases: an empty
    cache (the new position alone), grouped heads of 2 and 3 (padded to 4), 16 and 17 cached positions (one and two
    key tiles), the code predictor's head dim 128."""
    from voxflow.kernels.dense_decode_norm_rope import norm_rope_attend_append, supported
    from voxflow.kernels.qk_norm_rope import qk_norm_rope
    from voxflow.layers.attention import eager_attention
    from voxflow.layers.rotary import RotaryEmbedding
    g = torch.Generator().manual_seed(2)
    for dtype, tol in ((torch.float32, 2e-6), (torch.bfloat16, 2e-2)):
        for b, hq, hkv, length, d in ((2, 4, 2, 0, 16), (3, 6, 2, 7, 32), (1, 4, 4, 15, 16), (2, 4, 2, 16, 128),
                                      (1, 6, 2, 17, 16)):
            qkv = torch.randn(b, 1, (hq + 2 * hkv) * d, generator=g).to(dtype)       # a fused projection's output
            q = qkv[..., :hq * d].view(b, 1, hq, d)
            k = qkv[..., hq * d:(hq + hkv) * d].view(b, 1, hkv, d)
            v = qkv[..., (hq + hkv) * d:].view(b, 1, hkv, d)
            qw, kw = (torch.rand(d, generator=g) + 0.5).to(dtype), (torch.rand(d, generator=g) + 0.5).to(dtype)
            cos, sin = RotaryEmbedding(d, 1e6)(torch.tensor([[length]]), dtype)          # [1, 1, D]
            cache_k = torch.randn(b, hkv, 20, d, generator=g).to(dtype)
            cache_v = torch.randn(b, hkv, 20, d, generator=g).to(dtype)
            untouched = cache_k[:, :, length + 1:].clone(), cache_v[:, :, length + 1:].clone()
            assert supported(q, k, v, qw, kw, cos, sin)
            qn, kn = qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6, 1e-6)                   # [B, 1, H, D]
            keys = torch.cat((cache_k[:, :, :length], kn.transpose(1, 2)), dim=2)
            values = torch.cat((cache_v[:, :, :length], v.transpose(1, 2)), dim=2)
            want = eager_attention(qn.transpose(1, 2).float(), keys.float(), values.float(), None, d ** -0.5)
            q_written = torch.empty(b, hq, d, dtype=dtype)
            got = norm_rope_attend_append(q, k, v, qw, kw, 1e-6, 1e-6, cos, sin, cache_k, cache_v, length,
                                          d ** -0.5, query_scratch=q_written)
            err = (got.float() - want).abs().max().item()
            assert err <= tol, (dtype, b, hq, hkv, length, d, err)
            assert same_bits(cache_k[:, :, :length + 1], keys) and same_bits(cache_v[:, :, :length + 1], values)
            assert torch.equal(cache_k[:, :, length + 1:], untouched[0])
            assert torch.equal(cache_v[:, :, length + 1:], untouched[1])
            assert same_bits(q_written, qn[:, 0])
            # without a query scratch (the engine's call): the same output and cache
            again_k, again_v = cache_k.clone(), cache_v.clone()
            again_k[:, :, length], again_v[:, :, length] = 0, 0
            bare = norm_rope_attend_append(q, k, v, qw, kw, 1e-6, 1e-6, cos, sin, again_k, again_v, length,
                                           d ** -0.5)
            assert torch.equal(bare, got) and torch.equal(again_k, cache_k) and torch.equal(again_v, cache_v)


def check_folded_norm_scales_the_projections_first():
    """folded_norm=(x, eps): the kernel on raw projections == the kernel without it on the projections scaled by
    x's RMSNorm row factor (folded_norms.scale_rows): output, written query, cache. The factor's fp32 sum runs in
    another order in the kernel than in torch, so a scaled element may round to the neighbouring value: outputs
    within the tolerances above, the cache and query within one ulp of the activation dtype (bf16: 2^-8 relative;
    fp32: 1e-6)."""
    from voxflow.kernels.dense_decode_norm_rope import norm_rope_attend_append
    from voxflow.layers.folded_norms import scale_rows
    from voxflow.layers.rotary import RotaryEmbedding
    g = torch.Generator().manual_seed(5)
    for dtype, tol, ulp in ((torch.float32, 2e-6, 1e-6), (torch.bfloat16, 2e-2, 2 ** -8)):
        b, hq, hkv, length, d, hidden = 3, 4, 2, 5, 16, 48
        x = (torch.randn(b, hidden, generator=g) * torch.tensor([[0.5], [2.0], [8.0]])).to(dtype)
        qkv = torch.randn(b, 1, (hq + 2 * hkv) * d, generator=g).to(dtype)
        qw, kw = (torch.rand(d, generator=g) + 0.5).to(dtype), (torch.rand(d, generator=g) + 0.5).to(dtype)
        cos, sin = RotaryEmbedding(d, 1e6)(torch.tensor([[length]]), dtype)
        caches = [torch.randn(b, hkv, 8, d, generator=g).to(dtype) for _ in range(2)]
        outs, written, filled = [], [], []
        for raw, folded in ((qkv, (x, 1e-6)), (scale_rows(qkv, x, 1e-6), None)):
            q = raw[..., :hq * d].view(b, 1, hq, d)
            k = raw[..., hq * d:(hq + hkv) * d].view(b, 1, hkv, d)
            v = raw[..., (hq + hkv) * d:].view(b, 1, hkv, d)
            ck, cv = caches[0].clone(), caches[1].clone()
            qs = torch.empty(b, hq, d, dtype=dtype)
            outs.append(norm_rope_attend_append(q, k, v, qw, kw, 1e-6, 1e-6, cos, sin, ck, cv, length, d ** -0.5,
                                                query_scratch=qs, folded_norm=folded))
            written.append(qs)
            filled.append((ck, cv))
        assert (outs[0].float() - outs[1].float()).abs().max().item() <= tol, dtype
        for a, want in ((written[0], written[1]), (filled[0][0], filled[1][0]), (filled[0][1], filled[1][1])):
            assert torch.allclose(a.float(), want.float(), rtol=ulp, atol=ulp), dtype
        # and the factor is really applied: unscaled projections give another value cache (x's rows are not unit)
        assert not torch.allclose(filled[0][1].float(), caches[1].float())


def check_new_tokens_equal_one_at_a_time():
    """S new tokens a row in one call (the code predictor's 2-token first step) == S one-token calls in order, bit
    for bit: outputs, written queries, cache (each token's work is the one-token kernel's, and token s attends
    over positions [0, length + s]); and against eager attention with a causal mask over the normed, rotated
    queries / keys within the tolerances above. With and without a folded norm (rows [B * S, H]), S = 2 and 3,
    grouped heads of 2 and 3, an empty cache and one past a key tile."""
    from voxflow.kernels.dense_decode_norm_rope import norm_rope_attend_append, supported, supported_folded
    from voxflow.kernels.qk_norm_rope import qk_norm_rope
    from voxflow.layers.attention import attention_bias, eager_attention
    from voxflow.layers.folded_norms import scale_rows
    from voxflow.layers.rotary import RotaryEmbedding
    g = torch.Generator().manual_seed(7)
    for dtype, tol in ((torch.float32, 2e-6), (torch.bfloat16, 2e-2)):
        for b, hq, hkv, length, d, new, folded in ((2, 4, 2, 0, 16, 2, False), (3, 6, 2, 15, 32, 2, True),
                                                    (1, 4, 2, 5, 16, 3, True), (2, 4, 4, 0, 128, 2, True)):
            hidden = 48
            x = (torch.randn(b * new, hidden, generator=g) * 2).to(dtype)
            qkv = torch.randn(b, new, (hq + 2 * hkv) * d, generator=g).to(dtype)
            qw, kw = (torch.rand(d, generator=g) + 0.5).to(dtype), (torch.rand(d, generator=g) + 0.5).to(dtype)
            cos, sin = RotaryEmbedding(d, 1e6)(torch.arange(length, length + new)[None], dtype)    # [1, S, D]
            caches = [torch.randn(b, hkv, 20, d, generator=g).to(dtype) for _ in range(2)]

            def split(t):
                return (t[..., :hq * d].view(b, -1, hq, d), t[..., hq * d:(hq + hkv) * d].view(b, -1, hkv, d),
                        t[..., (hq + hkv) * d:].view(b, -1, hkv, d))
            q, k, v = split(qkv)
            assert supported(q, k, v, qw, kw, cos, sin) and supported_folded(x, q)
            fold = (x, 1e-6) if folded else None
            ck, cv = caches[0].clone(), caches[1].clone()
            qs = torch.empty(b, new, hq, d, dtype=dtype)
            got = norm_rope_attend_append(q, k, v, qw, kw, 1e-6, 1e-6, cos, sin, ck, cv, length, d ** -0.5,
                                          query_scratch=qs, folded_norm=fold)
            assert got.shape == (b, new, hq, d)
            one_k, one_v = caches[0].clone(), caches[1].clone()
            rows = x.view(b, new, hidden)
            for s in range(new):
                qs1 = torch.empty(b, hq, d, dtype=dtype)
                one = norm_rope_attend_append(q[:, s:s + 1], k[:, s:s + 1], v[:, s:s + 1], qw, kw, 1e-6, 1e-6,
                                              cos[:, s:s + 1], sin[:, s:s + 1], one_k, one_v, length + s,
                                              d ** -0.5, query_scratch=qs1,
                                              folded_norm=(rows[:, s].contiguous(), 1e-6) if folded else None)
                assert same_bits(one[:, 0], got[:, s]) and same_bits(qs1, qs[:, s]), (dtype, b, new, s)
            assert same_bits(one_k, ck) and same_bits(one_v, cv)
            assert torch.equal(ck[:, :, length + new:], caches[0][:, :, length + new:])
            # eager, causal over the cached prefix + the new tokens
            scaled = scale_rows(qkv.view(b * new, -1), x, 1e-6).view(b, new, -1) if folded else qkv
            q2, k2, v2 = split(scaled)
            qn, kn = qk_norm_rope(q2, k2, qw, kw, cos, sin, 1e-6, 1e-6)
            keys = torch.cat((caches[0][:, :, :length], kn.transpose(1, 2)), dim=2).float()
            values = torch.cat((caches[1][:, :, :length], v2.transpose(1, 2)), dim=2).float()
            mask = attention_bias(new, length + new, None, batch=b, dtype=torch.float32, device=q.device)
            want = eager_attention(qn.transpose(1, 2).float(), keys, values, mask, d ** -0.5)
            err = (got.float() - want).abs().max().item()
            assert err <= tol + (2e-2 if folded and dtype == torch.bfloat16 else 0), (dtype, b, new, err)


if IN_CHILD:
    def test_child_folded_norm():
        check_folded_norm_scales_the_projections_first()

    def test_child_norm_rope_append():
        check_norm_rope_append_against_the_two_kernels_it_fuses()

    def test_child_new_tokens_equal_one_at_a_time():
        check_new_tokens_equal_one_at_a_time()

    def test_child_against_eager():
        check_against_eager()

    def test_child_append_against_eager():
        check_append_against_eager()
else:
    def test_dense_kernel_under_the_interpreter_matches_eager_attention():
        run_child(__file__, CHILD_FLAG)


def test_norm_rope_append_refuses_a_query_scratch_of_the_wrong_shape():
    """The caller's query_scratch must be the contiguous [B, Hq, D] the kernel writes, else a clear error before
    any launch (a wrong shape would be written out of bounds)."""
    from voxflow.kernels.dense_decode_norm_rope import norm_rope_attend_append
    q, kv = torch.zeros(2, 1, 4, 16), torch.zeros(2, 1, 2, 16)
    w, cos = torch.ones(16), torch.ones(1, 1, 16)
    cache = torch.zeros(2, 2, 4, 16)
    wrong_shape, strided = torch.empty(2, 4, 8), torch.empty(4, 2, 16).transpose(0, 1)
    for bad in (wrong_shape, strided, torch.empty(2, 4, 16, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match="query_scratch"):
            norm_rope_attend_append(q, kv, kv, w, w, 1e-6, 1e-6, cos, cos, cache, cache.clone(), 0, 0.25,
                                    query_scratch=bad)


def test_norm_rope_append_refuses_new_tokens_it_cannot_take():
    """S new tokens a row: more than MAX_NEW is not `supported` and raises; a query scratch must then be the
    [B, S, Hq, D] the kernel writes; the cache must have room for all S -- each a clear error before any launch."""
    from voxflow.kernels.dense_decode_norm_rope import MAX_NEW, norm_rope_attend_append, supported
    w, cache = torch.ones(16), torch.zeros(2, 2, 8, 16)

    def tokens(s):
        return torch.zeros(2, s, 4, 16), torch.zeros(2, s, 2, 16), torch.ones(1, s, 16)
    q, kv, cos = tokens(MAX_NEW + 1)
    assert not supported(q, kv, kv, w, w, cos, cos)
    with pytest.raises(ValueError, match="new tokens"):
        norm_rope_attend_append(q, kv, kv, w, w, 1e-6, 1e-6, cos, cos, cache, cache.clone(), 0, 0.25)
    q, kv, cos = tokens(2)
    assert supported(q, kv, kv, w, w, cos, cos)
    with pytest.raises(ValueError, match="query_scratch"):
        norm_rope_attend_append(q, kv, kv, w, w, 1e-6, 1e-6, cos, cos, cache, cache.clone(), 0, 0.25,
                                query_scratch=torch.empty(2, 4, 16))
    with pytest.raises(ValueError, match="no room"):
        norm_rope_attend_append(q, kv, kv, w, w, 1e-6, 1e-6, cos, cos, cache, cache.clone(), 7, 0.25)


def test_launch_warps_one_warp_only_from_the_switch_rows(monkeypatch):
    """dense_decode_norm_rope.launch_warps: NUM_WARPS at every size while ONE_WARP_FROM_ROWS is 0; with it set
    (64 by default), one warp from that many rows on and NUM_WARPS below."""
    from voxflow.kernels import dense_decode_norm_rope as nra
    if "VOXFLOW_CP_ATTENTION_ONE_WARP_ROWS" not in os.environ:
        assert nra.ONE_WARP_FROM_ROWS == 64
    monkeypatch.setattr(nra, "ONE_WARP_FROM_ROWS", 0)
    assert [nra.launch_warps(r) for r in (1, 64, 256)] == [nra.NUM_WARPS] * 3
    monkeypatch.setattr(nra, "ONE_WARP_FROM_ROWS", 64)
    assert [nra.launch_warps(r) for r in (1, 63, 64, 256)] == [nra.NUM_WARPS, nra.NUM_WARPS, 1, 1]
