"""The tensor-core decode GEMMs with the RMSNorm folded into the weight (voxflow/kernels/batch_linear.py) and the
code predictor's five-kernel batch layer built on them (cp_layer_batch.py), against the plain torch code, on the
CPU under Triton's interpreter (in a subprocess, see tests/interpreter_child.py). References:
tests/cp_layer_reference.py, tests/skinny_reference.py.

Tolerances (observed values in brackets, interpreter):
- normed GEMM, fp32: <= 1e-5 * max |ref| [~1e-7] (the fold's one fp32 rounding, summation order). bf16: against
  the fp32 math from the unrounded normed row, |got - y32| <= 2^-8 |y32| + 2^-8 * (|a| @ |W|^T): one rounding of
  the result plus one of the folded weight (2^-9 relative each) [max ~2^-10 of the scale]; swiglu 2^-7 of the
  propagated scale (cp_layer_reference.norm_linear_reference); also against the same-dtype torch result (which
  rounds the normed row twice): <= 2^-7 of the scale.
- plain + residual (out over the residual): skinny_reference's bounds (the same rounding points: residual +
  round(y), rounded): fp32 1e-5 of max |ref|, bf16 2^-7 of the scale.
- the layer vs Qwen3DecoderLayer.forward from the same cache: fp32 <= 1e-5 * max |ref|; bf16: both against the
  fp32 layer on the same inputs, the batch layer's error at most 1.5x the bf16 torch layer's own plus 2^-8 of
  max |ref| (the folded weights' rounding), and the same for the new key in the cache.
"""
from __future__ import annotations

import copy

import pytest
import torch

from cp_layer_reference import EPS, REAL, TINY, make_cache, make_layer, clone_cache, norm_linear_inputs, \
    norm_linear_reference
from interpreter_child import in_child, run_child  # tests/interpreter_child.py
from skinny_reference import reference  # tests/skinny_reference.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_BATCH_LINEAR_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def check_normed(dtype, m, n, k, swiglu, config, seed=0):
    from voxflow.kernels.batch_linear import batch_linear, fold_norm
    x, w, nw = norm_linear_inputs(m, n, k, dtype, swiglu, seed)
    got = batch_linear(x, fold_norm(w, nw), norm_eps=EPS, swiglu=swiglu, config=config)
    y, y32, scale = norm_linear_reference(x, w, nw, swiglu)
    label = (dtype, m, n, k, swiglu, config)
    assert got.shape == (m, n) and got.dtype == dtype, label
    if dtype == torch.float32:
        err = (got - y).abs().max().item()
        assert err <= 1e-5 * y.abs().max().item(), (label, err)
        return
    err32 = (got.float() - y32).abs()
    bound = 2.0 ** -7 * scale if swiglu else 2.0 ** -8 * (y32.abs() + scale)
    assert (err32 <= bound).all(), (label, (err32 / scale).max().item())
    assert ((got.float() - y.float()).abs() <= 2.0 ** -7 * scale).all(), label


def check_plain_residual(dtype, m, n, k, config, seed=0):
    from voxflow.kernels.batch_linear import batch_linear
    x, w, _ = norm_linear_inputs(m, n, k, dtype, False, seed)
    res = (torch.randn(m, n, generator=torch.Generator().manual_seed(seed + 7)) * 4).to(dtype)
    y, y32, scale = reference(x, w, residual=res.clone())
    got = batch_linear(x, w, residual=res, out=res, config=config)
    assert got.data_ptr() == res.data_ptr()
    if dtype == torch.float32:
        assert (got - y).abs().max().item() <= 1e-5 * y.abs().max().item(), (m, n, k, config)
    else:
        assert ((got.float() - y32).abs() <= 2.0 ** -7 * scale).all(), (m, n, k, config)


def check_gemm_cases(dtype):
    for swiglu in (False, True):
        check_normed(dtype, 20, 64, 128, swiglu, None)                                   # the GPU launch config
        # 20 rows in a masked 32-row tile; two row tiles of 16 with a K loop and a partial N tile
        check_normed(dtype, 20, 72, 128, swiglu, dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32))
        check_normed(dtype, 20, 72, 128, swiglu, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64))
    check_normed(dtype, 3, 64, 128, False, None)                                          # a few rows
    check_plain_residual(dtype, 20, 72, 128, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32))
    check_plain_residual(dtype, 9, 64, 256, None)


@torch.no_grad()
def check_layer(shape, dtype, m, length, wide=False, seed=0):
    """cp_layer_batch.layer_step vs Qwen3DecoderLayer.forward (torch, CPU) from the same cache contents."""
    from voxflow.kernels import batch_linear as bl, cp_layer_batch
    from voxflow.layers.rotary import RotaryEmbedding
    layer = make_layer(shape, dtype, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = (torch.randn(m, shape["hidden"], generator=g) * 4).to(dtype)
    cos, sin = RotaryEmbedding(shape["head_dim"], 1e6, 64)._compute(torch.tensor([[length]]), dtype)
    cache = make_cache(shape, m, length, dtype, seed)
    ref_cache = clone_cache(cache)
    want = layer(x[:, None], cos, sin, ref_cache, None)[:, 0]
    attn, mlp = layer.self_attn, layer.mlp
    w = cp_layer_batch.fold_layer(attn.fused_qkv(), layer.input_layernorm, attn.q_norm, attn.k_norm,
                                  attn.o_proj.weight, mlp.fused_gate_up(), layer.post_attention_layernorm,
                                  mlp.down_proj.weight, attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scale)
    assert cp_layer_batch.supported(x, w, cos, sin, cache.k, length)
    real_config = bl.launch_config
    if wide:        # few programs: the interpreter pays per program
        bl.launch_config = lambda *a, **kw: {**real_config(*a, **kw), "BLOCK_N": 256}
    try:
        x_before = x.clone()
        got = cp_layer_batch.layer_step(x, w, cos, sin, cache.k, cache.v, cache.claim())
    finally:
        bl.launch_config = real_config
    assert torch.equal(x, x_before), "layer_step must leave its input rows alone"
    label = (shape["hidden"], dtype, m, length)
    k_new, k_ref = cache.k[:, :, length].float(), ref_cache.k[:, :, length].float()
    assert torch.equal(cache.k[:, :, :length], ref_cache.k[:, :, :length]), label
    assert torch.equal(cache.k[:, :, length + 1:], ref_cache.k[:, :, length + 1:]), label
    if dtype == torch.float32:
        err = (got - want).abs().max().item()
        assert err <= 1e-5 * want.abs().max().item(), (label, err)
        assert (k_new - k_ref).abs().max().item() <= 1e-5 * k_ref.abs().max().item(), label
        return
    layer32 = copy.deepcopy(layer).float()
    cache32 = clone_cache(make_cache(shape, m, length, dtype, seed))
    cache32.k, cache32.v = cache32.k.float(), cache32.v.float()
    want32 = layer32(x.float()[:, None], cos.float(), sin.float(), cache32, None)[:, 0]
    err_batch = (got.float() - want32).abs().max().item()
    err_ref = (want.float() - want32).abs().max().item()
    assert err_batch <= 1.5 * err_ref + 2.0 ** -8 * want32.abs().max().item(), (label, err_batch, err_ref)
    k32 = cache32.k[:, :, length]
    err_batch, err_ref = (k_new - k32).abs().max().item(), (k_ref - k32).abs().max().item()
    assert err_batch <= 1.5 * err_ref + 2.0 ** -8 * k32.abs().max().item(), (label, "key", err_batch, err_ref)


if IN_CHILD:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_child_gemms(dtype):
        check_gemm_cases(dtype)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_child_layer(dtype):
        check_layer(TINY, dtype, 12, 0)
        check_layer(TINY, dtype, 20, 14)
        if dtype == torch.bfloat16:
            check_layer(REAL, dtype, 9, 3, wide=True)
else:
    def test_batch_linear_kernels_under_the_interpreter_match_torch():
        run_child(__file__, CHILD_FLAG)


# Validation runs before any launch: these need no interpreter (and run in both processes).

def test_supported_and_errors():
    from voxflow.kernels import batch_linear as bl
    bf = torch.bfloat16
    x = torch.zeros(64, 1024, dtype=bf)
    assert bl.supported(x, torch.zeros(4096, 1024, dtype=bf))
    assert bl.supported(x, torch.zeros(6144, 1024, dtype=bf), swiglu=True)
    assert bl.supported(x, torch.zeros(1024, 1024, dtype=bf), residual=torch.zeros(64, 1024, dtype=bf))
    assert not bl.supported(x, torch.zeros(4096, 1024))                                    # dtypes
    assert not bl.supported(x, torch.zeros(4096, 1000, dtype=bf))                          # K
    assert not bl.supported(x, torch.zeros(4095, 1024, dtype=bf), swiglu=True)             # odd 2N
    assert not bl.supported(x, torch.zeros(1024, 2048, dtype=bf).t())                      # W not contiguous
    assert not bl.supported(x, torch.zeros(1024, 1024, dtype=bf), residual=torch.zeros(64, 512, dtype=bf))
    with pytest.raises(ValueError, match="unsupported"):
        bl.batch_linear(x, torch.zeros(4096, 1000, dtype=bf))
    with pytest.raises(ValueError, match="unknown config"):
        bl.batch_linear(x, torch.zeros(64, 1024, dtype=bf), config=dict(BLOCK_Q=4))
    with pytest.raises(ValueError, match="BLOCK_K"):
        bl.batch_linear(x, torch.zeros(64, 1024, dtype=bf), config=dict(BLOCK_K=48))


def test_fold_norm_scales_the_input_columns():
    from voxflow.kernels.batch_linear import fold_norm
    w = torch.randn(6, 4, dtype=torch.bfloat16)
    g = torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=torch.bfloat16)
    folded = fold_norm(w, g)
    assert folded.dtype == w.dtype and torch.equal(folded, (w.float() * g.float()).to(torch.bfloat16))
    assert torch.equal(folded[:, 2], w[:, 2]) and torch.equal(folded[:, 0], (w[:, 0].float() / 2).bfloat16())
