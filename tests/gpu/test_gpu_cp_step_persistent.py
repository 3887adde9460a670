"""The experimental persistent code-predictor step (voxflow/kernels/cp_step_persistent.py: 5 layers + norm + lm_head
in one launch with grid barriers) on CUDA at the 1.7B shapes, against its phased version (the same tile functions,
one launch per phase, which the CPU interpreter tests hold to torch):

- no barrier gave up (the error flag stays 0), the caches get the same new keys (within 1 ulp: the phased kernels
  contract FMAs, the persistent one does not) and values (bit-equal for layer 0, whose input is the same);
- logits: fp32 within 1e-5 of max |logit|, bf16 within 2^-6 of it and >= 95% bit-equal;
- the step captured in a CUDA graph (the counter memset included) and replayed on new input rows;
- CodePredictor.predict with CP_PERSISTENT_STEP on vs the four-kernel path: fp32 greedy codes equal.
"""
import pytest
import torch

from cp_layer_reference import EPS, REAL, make_code_predictor, make_layer
from float_compare import ulp_distance

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")

DEV = "cuda"


def setup(dtype, m, length, seed=0):
    from voxflow.layers.rotary import RotaryEmbedding
    from voxflow.layers.static_kv_cache import StaticKVCache
    from voxflow.models.qwen3_tts.code_predictor import _layer_weights
    layers = [make_layer(REAL, dtype, seed=seed + i, device=DEV) for i in range(5)]
    weights = [_layer_weights(layer) for layer in layers]
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(m, 1024, generator=g, device=DEV) * 4).to(dtype)
    head_w = (torch.randn(2048, 1024, generator=g, device=DEV) * 1024 ** -0.5).to(dtype)
    head_norm = (torch.rand(1024, generator=g, device=DEV) + 0.5).to(dtype)
    cos, sin = RotaryEmbedding(128, 1e6, 64).to(DEV)._compute(torch.tensor([[length]], device=DEV), dtype)
    cache = StaticKVCache(5, m, 8, 16, 128, dtype, torch.device(DEV))
    cache.k_all.normal_(generator=g)
    cache.v_all.normal_(generator=g)
    for c in cache.layers:
        c.length = length
    return layers, weights, x, head_w, head_norm, cos, sin, cache


def clone(cache):
    from voxflow.layers.static_kv_cache import StaticKVCache
    c = StaticKVCache.__new__(StaticKVCache)
    c.k_all, c.v_all = cache.k_all.clone(), cache.v_all.clone()
    from voxflow.layers.static_kv_cache import StaticLayerKVCache
    c.layers = []
    for i, layer in enumerate(cache.layers):
        lc = StaticLayerKVCache(0, 0, 0, 0, None, None, c.k_all[i], c.v_all[i])
        lc.length = layer.length
        c.layers.append(lc)
    return c


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 2])
def test_persistent_step_matches_the_phased_one(m, dtype):
    from voxflow.kernels import cp_step_persistent as ps
    for length in (1, 8, 15):
        layers, weights, x, head_w, head_norm, cos, sin, cache = setup(dtype, m, length, seed=length)
        phased_cache = clone(cache)
        assert ps.supported(x, weights, cache, cos, sin, head_w, head_norm)
        offsets = ps.layer_offsets(weights)
        x_before = x.clone()
        sync = torch.zeros(2, dtype=torch.int32, device=DEV)
        got = ps.cp_step_persistent(x, weights, offsets, cache, length, cos, sin, head_w, head_norm, EPS, sync=sync)
        torch.cuda.synchronize()
        assert sync[1].item() == 0, "a grid barrier gave up (not all programs resident?)"
        assert sync[0].item() == 4 * 5 * torch.cuda.get_device_properties(0).multi_processor_count
        assert torch.equal(x, x_before)
        want = ps.cp_step_phased(x, weights, phased_cache, length, cos, sin, head_w, head_norm, EPS)
        tol = (1e-5 if dtype == torch.float32 else 2.0 ** -6) * want.abs().max().item()
        assert (got.float() - want.float()).abs().max().item() <= tol, length
        if dtype == torch.bfloat16:
            assert (ulp_distance(got, want) == 0).float().mean().item() >= 0.95, length
        assert torch.equal(cache.v_all[0, :, :, length], phased_cache.v_all[0, :, :, length])
        new_k, ref_k = cache.k_all[:, :, :, length], phased_cache.k_all[:, :, :, length]
        if dtype == torch.bfloat16:
            assert (ulp_distance(new_k[0], ref_k[0]) <= 1).all()
        assert torch.equal(cache.k_all[:, :, :, :length], phased_cache.k_all[:, :, :, :length])
        assert all(c.length == length + 1 for c in cache.layers)


@torch.no_grad()
def test_persistent_step_in_a_cuda_graph():
    from voxflow.kernels import cp_step_persistent as ps
    layers, weights, x, head_w, head_norm, cos, sin, cache = setup(torch.bfloat16, 1, 6, seed=3)
    offsets = ps.layer_offsets(weights)
    sync = torch.zeros(2, dtype=torch.int32, device=DEV)

    def step():
        for c in cache.layers:
            c.length = 6
        return ps.cp_step_persistent(x, weights, offsets, cache, 6, cos, sin, head_w, head_norm, EPS, sync=sync)
    step()                                                # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    x.copy_((torch.randn_like(x.float()) * 4).to(x.dtype))
    graph.replay()
    torch.cuda.synchronize()
    assert sync[1].item() == 0
    assert torch.equal(out, step())


@torch.no_grad()
def test_predict_persistent_step_on_vs_off():
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import cp_step_persistent as ps
    cp = make_code_predictor(torch.float32, DEV)
    h, c0 = torch.randn(1, 2048, device=DEV) * 2, torch.randn(1, 2048, device=DEV)
    greedy = lambda logits, j: logits.argmax(-1)            # noqa: E731
    saved = cp_mod.CP_PERSISTENT_STEP, ps.cp_step_persistent
    calls = []
    ps.cp_step_persistent = lambda *a, **kw: (calls.append(1), saved[1](*a, **kw))[1]
    try:
        cp_mod.CP_PERSISTENT_STEP = False
        codes_off, logits_off = cp.predict(h, c0, greedy)
        cp_mod.CP_PERSISTENT_STEP = True
        codes_on, logits_on = cp.predict(h, c0, greedy)
    finally:
        cp_mod.CP_PERSISTENT_STEP, ps.cp_step_persistent = saved
    assert len(calls) == 14, "the persistent step did not run on every single-token step"
    assert torch.equal(codes_on, codes_off)
    assert (logits_on - logits_off).abs().max().item() <= 1e-4 * logits_off.abs().max().item()
