"""The code predictor's four-kernel decode layer (voxflow/kernels/cp_layer.py) and its two new kernels
(norm_linear.py: RMSNorm folded into the GEMM in one pass, optionally with the SwiGLU epilogue; attention_o_proj.py:
q/k norm + RoPE + cache append + attention + o_proj + residual) against the plain torch code, on the CPU under
Triton's interpreter (in a subprocess, see tests/interpreter_child.py). References: tests/cp_layer_reference.py.

Shapes: a tiny layer (hidden 64, 4 q / 2 kv heads of 32: the attention output twice the hidden size, as in the
1.7B model) with the GPU launch configs and with overrides (a multi-step K loop, a partial last N tile, one query
head per tile, all heads in one tile), and one case per kernel at the real 1.7B code-predictor shapes with wide
tiles (the interpreter pays per program). Cache lengths 0, 1 and 14; one and three rows (three: per-row RoPE too).

Tolerances (observed values in brackets, interpreter):
- norm_linear, fp32: <= 1e-5 * max |ref| [~1e-7]. Without the norm, + residual: skinny_linear's tolerances (its
  test's docstring; same rounding points). bf16: against the fp32 math from the unrounded normed row,
  one rounding of the result plus fp32 summation error, |got - y32| <= 2^-8 |y32| + 2^-12 * (|a| @ |W|^T)
  [max 2^-11 of the scale]; swiglu: gate and up rounded, silu rounded, the product rounded, so 2^-7 of the
  propagated scale (cp_layer_reference.norm_linear_reference). Also against the same-dtype torch result (which
  rounds the normed row twice): <= 2^-7 of the scale [~2^-10].
- attention_o_proj, fp32: <= 1e-5 * max |ref|; the new key within 1e-5 of the reference's (fp32 sum orders).
  bf16: >= 95% bit-equal to the torch result whose attention is fp32 rounded once [100%], within 2^-7 * (|att| @
  |W_o|^T + |residual|) of its fp32 version; the cache: positions < length untouched, position length = the
  reference's normed, rotated key [bit-equal] and the raw value, positions > length untouched.
- the whole layer vs Qwen3DecoderLayer.forward with the same StaticLayerKVCache: fp32 <= 1e-5 * max |ref|; bf16:
  both compared to the fp32 layer run on the same (upcast) inputs, the fused layer's error at most 1.5x the bf16
  torch layer's own plus 2^-9 * max |ref| (the fused path rounds the normed GEMM inputs less, not more) [the same
  max error, ~2^-8 of max |ref|: the output rounding dominates], and the same rule for the new key in the cache
  (2^-8 of max |key|).
"""
from __future__ import annotations

import copy

import pytest
import torch

from cp_layer_reference import (EPS, REAL, TINY, attention_inputs, attention_reference, clone_cache, make_cache,
                                make_layer, norm_linear_inputs, norm_linear_reference)
from float_compare import ulp_distance  # tests/float_compare.py
from skinny_reference import reference  # tests/skinny_reference.py
from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_CP_LAYER_CHILD"
IN_CHILD = in_child(CHILD_FLAG)
WIDE_NL = dict(BLOCK_N=256)                # real shapes: 16 / 12 programs instead of 256 / 384
WIDE_ATT = dict(BLOCK_N=256, BLOCK_H=16)   # 4 programs, all heads in each (no partial sums)


def check_norm_linear(dtype, m, n, k, swiglu, config, seed=0, plain_residual=False):
    """plain_residual: no norm, + a residual (a down_proj-like skinny GEMM), out written over the residual."""
    from voxflow.kernels.norm_linear import norm_linear, supported
    x, w, nw = norm_linear_inputs(m, n, k, dtype, swiglu, seed)
    if plain_residual:
        nw = None
        res = (torch.randn(m, n, generator=torch.Generator().manual_seed(seed)) * 4).to(dtype)
    assert supported(x, w, nw, swiglu=swiglu)
    if plain_residual:
        y, y32, scale = reference(x, w, residual=res.clone())
        got = norm_linear(x, w, None, EPS, residual=res, out=res, config=config)
        assert got.data_ptr() == res.data_ptr()
    else:
        got = norm_linear(x, w, nw, EPS, swiglu=swiglu, config=config)
        y, y32, scale = norm_linear_reference(x, w, nw, swiglu)
    label = (dtype, m, n, k, swiglu, config)
    assert got.shape == (m, n) and got.dtype == dtype, label
    if dtype == torch.float32:
        err = (got - y).abs().max().item()
        assert err <= 1e-5 * y.abs().max().item(), (label, err)
        return
    err32 = (got.float() - y32).abs()
    bound = 2.0 ** -7 * scale if swiglu or plain_residual else 2.0 ** -8 * y32.abs() + 2.0 ** -12 * scale
    assert (err32 <= bound).all(), (label, (err32 / scale).max().item())
    assert ((got.float() - y.float()).abs() <= 2.0 ** -7 * scale).all(), label


def check_norm_linear_cases(dtype):
    for m in (1, 3):
        for swiglu in (False, True):
            check_norm_linear(dtype, m, 64, 128, swiglu, None)                          # the GPU launch config
            check_norm_linear(dtype, m, 72, 128, swiglu, dict(BLOCK_N=32, BLOCK_K=32))  # K loop, partial N tile
        check_norm_linear(dtype, m, 72, 128, False, dict(BLOCK_N=32, BLOCK_K=32), plain_residual=True)
    check_norm_linear(dtype, 1, 4096, 1024, False, WIDE_NL)                             # cp q|k|v
    check_norm_linear(dtype, 1, 3072, 1024, True, WIDE_NL)                              # cp gate|up
    check_norm_linear(dtype, 1, 1024, 3072, False, WIDE_NL, plain_residual=True)        # cp down_proj


def check_norm_linear_weight_preload(dtype):
    """pdl.py's weight preload (the first K step's W tiles loaded before the PDL wait, that step peeled off the
    loop) gives the loop's bits: one K step or four, plain, swiglu and plain + residual."""
    from voxflow.kernels.norm_linear import norm_linear
    for swiglu, residual in ((False, False), (True, False), (False, True)):
        for config in (dict(BLOCK_N=32, BLOCK_K=32), dict(BLOCK_N=32, BLOCK_K=128)):
            x, w, nw = norm_linear_inputs(1, 72, 128, dtype, swiglu, 3)
            res = torch.randn(1, 72, generator=torch.Generator().manual_seed(4)).to(dtype) if residual else None
            nw = None if residual else nw
            got = [norm_linear(x, w, nw, EPS, swiglu=swiglu, residual=res, config=config, preload=p)
                   for p in (False, True)]
            assert torch.equal(*got), (dtype, swiglu, residual, config)


def run_attention(a, config=None, out=None):
    from voxflow.kernels.attention_o_proj import attention_o_proj, supported
    assert supported(a["qkv"], a["residual"], a["w_o"], a["q_weight"], a["k_weight"], a["cos"], a["sin"],
                     a["k_cache"], a["v_cache"], a["num_heads"])
    return attention_o_proj(a["qkv"], a["residual"], a["w_o"], a["q_weight"], a["k_weight"], EPS, EPS, a["cos"],
                            a["sin"], a["k_cache"], a["v_cache"], a["length"], a["num_heads"], a["scale"],
                            config=config, out=out)


def check_attention(shape, dtype, m, length, config, per_row_rope=False, in_place=False, seed=0):
    a = attention_inputs(shape, m, length, dtype, seed, per_row_rope)
    k_before, v_before = a["k_cache"].clone(), a["v_cache"].clone()
    want, want32, scale, keys, values = attention_reference(a)
    got = run_attention(a, config, out=a["residual"] if in_place else None)
    if in_place:
        assert got.data_ptr() == a["residual"].data_ptr()
    label = (dtype, m, length, config, per_row_rope)
    if dtype == torch.float32:
        err = (got - want).abs().max().item()
        assert err <= 1e-5 * want.abs().max().item(), (label, err)
        key_err = (a["k_cache"][:, :, length] - keys[:, :, length]).abs().max().item()
        assert key_err <= 1e-5 * keys[:, :, length].abs().max().item(), (label, key_err)
    else:
        assert ((got.float() - want32).abs() <= 2.0 ** -7 * scale).all(), label
        exact = (ulp_distance(got, want) == 0).float().mean().item()
        assert exact >= 0.95, (label, exact)
        assert torch.equal(a["k_cache"][:, :, length], keys[:, :, length]), label
    assert torch.equal(a["v_cache"][:, :, length], values[:, :, length]), label
    # untouched: the cached positions and everything past the new one
    assert torch.equal(a["k_cache"][:, :, :length], k_before[:, :, :length]), label
    assert torch.equal(a["v_cache"][:, :, :length], v_before[:, :, :length]), label
    assert torch.equal(a["k_cache"][:, :, length + 1:], k_before[:, :, length + 1:]), label
    assert torch.equal(a["v_cache"][:, :, length + 1:], v_before[:, :, length + 1:]), label


def check_attention_cases(dtype):
    for length in (0, 1, 14):
        check_attention(TINY, dtype, 1, length, None)                    # 2 head blocks x 4 column blocks
        check_attention(TINY, dtype, 3, length, dict(BLOCK_N=32, BLOCK_H=1), per_row_rope=length == 1,
                        in_place=length == 14)                          # 4 x 2: partial sums of 4 head blocks
        check_attention(REAL, dtype, 1, length, WIDE_ATT if length != 1 else dict(BLOCK_N=512, BLOCK_H=4))


def check_attention_joint(shape, dtype, length, config, seed=0):
    """attention_o_proj's joint form (two tokens of cache row 0 at positions length, length + 1; the second attends
    to the first from registers) against two one-token calls in order (the second reading the first's key / value
    from the cache): the same cache bits; outputs fp32 within 1e-5 of max |out| (the softmax sums the first token's
    term in another order), bf16 within 2^-7 of scale and >= 95% bit-equal; the cache past length + 1 untouched."""
    from voxflow.kernels.attention_o_proj import attention_o_proj, supported
    a = attention_inputs(shape, 2, length, dtype, seed, per_row_rope=True)
    k0, v0 = a["k_cache"][:1].clone(), a["v_cache"][:1].clone()           # cache row 0 only
    args = (a["w_o"], a["q_weight"], a["k_weight"], EPS, EPS)
    seq_k, seq_v = k0.clone(), v0.clone()
    want = torch.cat([attention_o_proj(a["qkv"][t:t + 1], a["residual"][t:t + 1], *args, a["cos"][t], a["sin"][t],
                                       seq_k, seq_v, length + t, a["num_heads"], a["scale"], config=config)
                      for t in range(2)])
    jk, jv = k0.clone(), v0.clone()
    assert supported(a["qkv"], a["residual"], a["w_o"], a["q_weight"], a["k_weight"], a["cos"], a["sin"], jk, jv,
                     a["num_heads"], joint=True)
    got = attention_o_proj(a["qkv"], a["residual"], *args, a["cos"], a["sin"], jk, jv, length, a["num_heads"],
                           a["scale"], config=config, joint=True)
    label = (dtype, length, config)
    assert torch.equal(jk, seq_k) and torch.equal(jv, seq_v), label
    assert torch.equal(jk[:, :, length + 2:], k0[:, :, length + 2:]), label
    if dtype == torch.float32:
        assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item(), label
    else:
        assert ((got.float() - want.float()).abs() <= 2.0 ** -7 * a["scale"] * want.float().abs().max()).all(), label
        assert (ulp_distance(got, want) == 0).float().mean().item() >= 0.95, label


def check_attention_joint_cases(dtype):
    for length in (0, 5):
        check_attention_joint(TINY, dtype, length, None)                        # partial sums of 2 head blocks
        check_attention_joint(TINY, dtype, length, dict(BLOCK_N=32, BLOCK_H=4))  # one head block: no partials
    check_attention_joint(REAL, dtype, 0, WIDE_ATT)


def _layer_weights(layer):
    from voxflow.models.qwen3_tts.code_predictor import _layer_weights
    return _layer_weights(layer)


@torch.no_grad()
def check_layer(shape, dtype, m, length, configs=None, seed=0):
    """cp_layer.layer_step vs Qwen3DecoderLayer.forward (torch, CPU) from the same cache contents."""
    from voxflow.kernels import cp_layer
    from voxflow.layers.rotary import RotaryEmbedding
    layer = make_layer(shape, dtype, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = (torch.randn(m, shape["hidden"], generator=g) * 4).to(dtype)
    cos, sin = RotaryEmbedding(shape["head_dim"], 1e6, 64)._compute(torch.tensor([[length]]), dtype)
    cache = make_cache(shape, m, length, dtype, seed)
    ref_cache = clone_cache(cache)
    want = layer(x[:, None], cos, sin, ref_cache, None)[:, 0]
    w = _layer_weights(layer)
    assert cp_layer.supported(x, w, cos, sin, cache.k, cache.v)
    saved = dict(cp_layer.CONFIGS)
    cp_layer.CONFIGS.update(configs or {})
    try:
        x_before = x.clone()
        got = cp_layer.layer_step(x, w, cos, sin, cache.k, cache.v, cache.claim())
    finally:
        cp_layer.CONFIGS.update(saved)
    assert torch.equal(x, x_before), "layer_step must leave its input rows alone"
    assert cache.length == ref_cache.length == length + 1
    label = (shape["hidden"], dtype, m, length)
    k_new, k_ref = cache.k[:, :, length].float(), ref_cache.k[:, :, length].float()
    assert torch.equal(cache.k[:, :, :length], ref_cache.k[:, :, :length]), label
    assert torch.equal(cache.k[:, :, length + 1:], ref_cache.k[:, :, length + 1:]), label
    if dtype == torch.float32:
        err = (got - want).abs().max().item()
        assert err <= 1e-5 * want.abs().max().item(), (label, err)
        assert (k_new - k_ref).abs().max().item() <= 1e-5 * k_ref.abs().max().item(), label
        assert (cache.v[:, :, length] - ref_cache.v[:, :, length]).abs().max().item() <= 1e-5 * \
            ref_cache.v[:, :, length].abs().max().item(), label
        return
    layer32 = copy.deepcopy(layer).float()
    cache32 = clone_cache(make_cache(shape, m, length, dtype, seed))
    cache32.k, cache32.v = cache32.k.float(), cache32.v.float()
    want32 = layer32(x.float()[:, None], cos.float(), sin.float(), cache32, None)[:, 0]
    err_fused = (got.float() - want32).abs().max().item()
    err_ref = (want.float() - want32).abs().max().item()
    assert err_fused <= 1.5 * err_ref + 2.0 ** -9 * want32.abs().max().item(), (label, err_fused, err_ref)
    k32 = cache32.k[:, :, length]
    err_fused, err_ref = (k_new - k32).abs().max().item(), (k_ref - k32).abs().max().item()
    assert err_fused <= 1.5 * err_ref + 2.0 ** -8 * k32.abs().max().item(), (label, "key", err_fused, err_ref)


WIDE_LAYER = dict(qkv=WIDE_NL, attention_o_proj=WIDE_ATT, gate_up=WIDE_NL, down=dict(BLOCK_N=256))
TINY_WIDE = dict(qkv=dict(BLOCK_N=64), attention_o_proj=dict(BLOCK_N=64), gate_up=dict(BLOCK_N=64),
                 down=dict(BLOCK_N=64))


def check_layer_cases(dtype):
    check_layer(TINY, dtype, 1, 1)                                   # the GPU launch configs
    for length in (0, 14):
        check_layer(TINY, dtype, 1, length, TINY_WIDE)
    check_layer(TINY, dtype, 3, 5, TINY_WIDE)
    check_layer(REAL, dtype, 1, 14, WIDE_LAYER)


if IN_CHILD:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_child_norm_linear(dtype):
        check_norm_linear_cases(dtype)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_child_norm_linear_weight_preload(dtype):
        check_norm_linear_weight_preload(dtype)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_child_attention_o_proj(dtype):
        check_attention_cases(dtype)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_child_attention_o_proj_joint(dtype):
        check_attention_joint_cases(dtype)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_child_layer(dtype):
        check_layer_cases(dtype)
else:
    def test_cp_layer_kernels_under_the_interpreter_match_torch():
        run_child(__file__, CHILD_FLAG)


# Validation runs before any launch: these need no interpreter (and run in both processes).

def test_norm_linear_weight_preload_is_for_one_row():
    from voxflow.kernels.norm_linear import norm_linear
    x, w, nw = norm_linear_inputs(3, 64, 128, torch.float32, False, 0)
    with pytest.raises(ValueError, match="one row"):
        norm_linear(x, w, nw, EPS, preload=True)


def test_supported_accepts_the_real_shapes_and_rejects_others():
    from voxflow.kernels import attention_o_proj as attn
    from voxflow.kernels import norm_linear as nl
    bf = torch.bfloat16
    x = torch.zeros(1, 1024, dtype=bf)
    nw = torch.zeros(1024, dtype=bf)
    assert nl.supported(x, torch.zeros(4096, 1024, dtype=bf), nw)
    assert nl.supported(x, torch.zeros(6144, 1024, dtype=bf), nw, swiglu=True)
    assert not nl.supported(torch.zeros(9, 1024, dtype=bf), torch.zeros(4096, 1024, dtype=bf), nw)   # rows
    assert not nl.supported(x, torch.zeros(4096, 1024), nw)                                            # dtypes
    assert not nl.supported(x, torch.zeros(4095, 1024, dtype=bf), nw, swiglu=True)                     # odd 2N
    a = attention_inputs(REAL, 1, 3, bf)
    args = [a[k] for k in ("qkv", "residual", "w_o", "q_weight", "k_weight", "cos", "sin", "k_cache", "v_cache",
                           "num_heads")]
    assert attn.supported(*args)
    assert attn.supported(None, *args[1:], qkv_width=a["qkv"].shape[1])
    assert not attn.supported(None, *args[1:], qkv_width=a["qkv"].shape[1] - 128)
    assert not attn.supported(*args[:-1], 12)                                    # 12 / 8 heads
    big = torch.zeros(1, 8, 128, 128, dtype=bf)
    assert not attn.supported(*args[:7], big, big, 16)                           # cache longer than one key tile
    with pytest.raises(ValueError, match="no room"):
        attn.attention_o_proj(*args[:5], EPS, EPS, *args[5:9], 16, 16, 0.1)
