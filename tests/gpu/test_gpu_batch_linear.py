"""The code predictor's batch layer (voxflow/kernels/cp_layer_batch.py, on batch_linear.py's tensor-core GEMMs with
the norms folded into the weights) on CUDA at the real 1.7B shapes, against the plain torch code (kernel switch
off) with the tolerances of tests/test_kernel_batch_linear.py (its docstring says why), plus what only the GPU can
show: the wgmma code path (the interpreter runs tl.dot in fp32), the tuning script's candidate configs, 5 layers x
14 steps captured in a CUDA graph and replayed on new inputs, and CodePredictor.predict with CP_BATCH_LAYER on vs
off at 64 rows.
"""
import contextlib
import copy

import pytest
import torch

import voxflow.kernels as switch
from cp_layer_reference import (EPS, REAL, clone_cache, make_cache, make_code_predictor, make_layer,
                                norm_linear_inputs, norm_linear_reference)
from skinny_reference import reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")

DEV = "cuda"


@pytest.fixture(autouse=True)
def exact_references():
    """fp32 references without TF32, bf16 ones without reduced-precision split-K sums; the kernel switch kept."""
    m = torch.backends.cuda.matmul
    saved = m.allow_tf32, m.allow_bf16_reduced_precision_reduction, switch.kernels_enabled()
    m.allow_tf32, m.allow_bf16_reduced_precision_reduction = False, False
    yield
    m.allow_tf32, m.allow_bf16_reduced_precision_reduction = saved[:2]
    switch.set_kernels_enabled(saved[2])


@contextlib.contextmanager
def torch_only():
    on = switch.kernels_enabled()
    switch.set_kernels_enabled(False)
    try:
        yield
    finally:
        switch.set_kernels_enabled(on)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [2, 9, 64, 200])
@pytest.mark.parametrize("k,n,mode", [(1024, 4096, "norm"), (1024, 3072, "swiglu"), (1024, 2048, "norm"),
                                      (2048, 1024, "residual"), (3072, 1024, "residual")])
def test_batch_linear_real_shapes(k, n, mode, m, dtype):
    from voxflow.kernels.batch_linear import batch_linear, fold_norm
    swiglu = mode == "swiglu"
    x, w, nw = norm_linear_inputs(m, n, k, dtype, swiglu, device=DEV)
    if mode == "residual":
        res = (torch.randn(m, n, device=DEV) * 4).to(dtype)
        run = lambda: batch_linear(x, w, residual=res)                                  # noqa: E731
        with torch_only():
            y, y32, scale = reference(x, w, residual=res)
    else:
        wf = fold_norm(w, nw)
        run = lambda: batch_linear(x, wf, norm_eps=EPS, swiglu=swiglu)                  # noqa: E731
        with torch_only():
            y, y32, scale = norm_linear_reference(x, w, nw, swiglu)
    got = run()
    if dtype == torch.float32:
        assert (got - y).abs().max().item() <= 1e-5 * y.abs().max().item()
    else:
        bound = 2.0 ** -7 * scale if mode != "norm" else 2.0 ** -8 * (y32.abs() + scale)
        assert ((got.float() - y32).abs() <= bound).all(), ((got.float() - y32).abs() / scale).max().item()
    assert torch.equal(got, run())                                                     # deterministic


@pytest.mark.parametrize("config", [dict(BLOCK_N=32), dict(BLOCK_N=64, BLOCK_K=64, num_stages=3),
                                    dict(BLOCK_M=16), dict(BLOCK_M=128, num_warps=8), dict(num_stages=5),
                                    dict(BLOCK_N=32, num_warps=8)])
def test_batch_linear_config_overrides(config):
    from voxflow.kernels.batch_linear import batch_linear, fold_norm
    for n, swiglu in ((4096, False), (3072, True)):
        x, w, nw = norm_linear_inputs(64, n, 1024, torch.bfloat16, swiglu, seed=1, device=DEV)
        with torch_only():
            _, y32, scale = norm_linear_reference(x, w, nw, swiglu)
        got = batch_linear(x, fold_norm(w, nw), norm_eps=EPS, swiglu=swiglu, config=config)
        assert ((got.float() - y32).abs() <= 2.0 ** -7 * scale).all(), (config, swiglu)


def _fold(layer):
    from voxflow.kernels import cp_layer_batch
    attn, mlp = layer.self_attn, layer.mlp
    return cp_layer_batch.fold_layer(attn.fused_qkv(), layer.input_layernorm, attn.q_norm, attn.k_norm,
                                     attn.o_proj.weight, mlp.fused_gate_up(), layer.post_attention_layernorm,
                                     mlp.down_proj.weight, attn.num_heads, attn.num_kv_heads, attn.head_dim,
                                     attn.scale)


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [16, 64])
def test_layer_matches_the_torch_layer(m, dtype):
    from voxflow.kernels import cp_layer_batch
    from voxflow.layers.rotary import RotaryEmbedding
    layer = make_layer(REAL, dtype, device=DEV)
    x = (torch.randn(m, REAL["hidden"], device=DEV) * 4).to(dtype)
    length = 9
    cos, sin = RotaryEmbedding(REAL["head_dim"], 1e6, 64).to(DEV)._compute(torch.tensor([[length]], device=DEV),
                                                                          dtype)
    cache = make_cache(REAL, m, length, dtype, device=DEV)
    ref_cache = clone_cache(cache)
    with torch_only():
        want = layer(x[:, None], cos, sin, ref_cache, None)[:, 0]
    got = cp_layer_batch.layer_step(x, _fold(layer), cos, sin, cache.k, cache.v, cache.claim())
    if dtype == torch.float32:
        assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
        return
    with torch_only():
        layer32 = copy.deepcopy(layer).float()
        cache32 = clone_cache(make_cache(REAL, m, length, dtype, device=DEV))
        cache32.k, cache32.v = cache32.k.float(), cache32.v.float()
        want32 = layer32(x.float()[:, None], cos.float(), sin.float(), cache32, None)[:, 0]
    err_batch = (got.float() - want32).abs().max().item()
    err_ref = (want.float() - want32).abs().max().item()
    assert err_batch <= 1.5 * err_ref + 2.0 ** -8 * want32.abs().max().item(), (err_batch, err_ref)


@torch.no_grad()
def test_five_layers_in_a_cuda_graph():
    """5 layers x 14 single-token steps captured once, replayed on new inputs == the same steps run eagerly."""
    from voxflow.kernels import cp_layer_batch
    from voxflow.layers.rotary import RotaryEmbedding
    from voxflow.layers.static_kv_cache import StaticKVCache
    m, dtype = 64, torch.bfloat16
    layers = [make_layer(REAL, dtype, seed=i, device=DEV) for i in range(5)]
    weights = [_fold(layer) for layer in layers]
    cos_all, sin_all = RotaryEmbedding(REAL["head_dim"], 1e6, 64).to(DEV).prefix(16, torch.device(DEV), dtype)
    cache = StaticKVCache(5, m, REAL["kv_heads"], 16, REAL["head_dim"], dtype, torch.device(DEV))
    x_in = torch.empty(m, REAL["hidden"], device=DEV, dtype=dtype)

    def frame():
        for c in cache.layers:
            c.length = 1
        x = x_in
        for t in range(1, 15):
            for w, c in zip(weights, cache.layers):
                x = cp_layer_batch.layer_step(x, w, cos_all[:, t:t + 1], sin_all[:, t:t + 1], c.k, c.v, c.claim())
        return x
    x_in.copy_(torch.randn(m, REAL["hidden"], device=DEV))
    frame()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = frame()
    x_in.copy_(torch.randn(m, REAL["hidden"], device=DEV) * 3)
    graph.replay()
    replayed = out.clone()
    assert torch.equal(replayed, frame())


@torch.no_grad()
def test_predict_batch_layer_on_vs_off():
    """CodePredictor.predict at 64 rows with CP_BATCH_LAYER on vs off: the batch layer on every single-token step,
    teacher-forced logits within 5e-2 of max |logit| (the CPU test's bound), fp32 greedy codes equal."""
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import cp_layer_batch
    saved = cp_mod.CP_BATCH_LAYER, cp_layer_batch.layer_step
    calls = []
    cp_layer_batch.layer_step = lambda *a, **kw: (calls.append(1), saved[1](*a, **kw))[1]
    try:
        for dtype in (torch.float32, torch.bfloat16):
            cp = make_code_predictor(dtype, DEV)
            h, c0 = (torch.randn(64, 2048, device=DEV) * 2).to(dtype), torch.randn(64, 2048, device=DEV).to(dtype)
            greedy = lambda logits, j: logits.argmax(-1)            # noqa: E731
            cp_mod.CP_BATCH_LAYER = False
            codes_off, logits_off = cp.predict(h, c0, greedy)
            forced = lambda logits, j: codes_off[:, j]              # noqa: E731
            cp_mod.CP_BATCH_LAYER = True
            calls.clear()
            codes_on, logits_forced = cp.predict(h, c0, forced)
            assert len(calls) == 5 * 14, "the batch layer did not run on every single-token step"
            err = (logits_forced.float() - logits_off.float()).abs().max().item()
            assert err <= 5e-2 * logits_off.float().abs().max().item(), (dtype, err)
            if dtype == torch.float32:
                assert torch.equal(cp.predict(h, c0, greedy)[0], codes_off)
    finally:
        cp_mod.CP_BATCH_LAYER, cp_layer_batch.layer_step = saved
