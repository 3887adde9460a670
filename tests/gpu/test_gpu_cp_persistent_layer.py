"""The code predictor's one-launch layer step (voxflow/kernels/cp_persistent_layer.py) on CUDA at the real 1.7B
shapes. What only the GPU can show:

- the one launch with grid barriers gives the same bits as the phase-by-phase launches the CPU tests run (same
  tiles, same arithmetic), output, sums of squares and cache, at 1..64 rows and several cache lengths, first layer
  and chained (the next layer fed `.ssq`), and leaves its barrier counters at zero (so the next launch starts
  clean): a missing or misplaced barrier reads a phase's input before it is written;
- against the torch layer (kernel switch off) with tests/cp_layer_reference.check_layer_step's tolerances;
- five layers x 14 steps at 64 rows captured in one CUDA graph: replays on new inputs equal the eager run, and
  repeat bit for bit (the counters reset inside the graph too);
- CodePredictor.predict with CP_PERSISTENT on vs off at 8 and 64 rows: the persistent layer ran on every
  single-token step, fp32 greedy codes equal; bf16 teacher-forced logits within 5e-2 of max |logit|.
"""
import contextlib
import dataclasses

import pytest
import torch

import voxflow.kernels as switch
from cp_layer_reference import REAL, check_layer_step, make_cache, make_code_predictor, make_layer

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


def on_gpu(w):
    return dataclasses.replace(w, **{f.name: getattr(w, f.name).to(DEV) for f in dataclasses.fields(w)
                                     if isinstance(getattr(w, f.name), torch.Tensor)})


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 2, 8, 33, 64])
def test_one_launch_equals_the_phase_launches(m, dtype):
    from voxflow.kernels import cp_persistent_layer as pl
    from voxflow.layers.rotary import RotaryEmbedding
    from voxflow.models.qwen3_tts.code_predictor import _layer_weights
    w = _layer_weights(make_layer(REAL, dtype, seed=m, device=DEV))
    for length in (0, 7, 15):
        cos, sin = RotaryEmbedding(128, 1e6, 64).to(DEV)._compute(torch.tensor([[length]], device=DEV), dtype)
        x = (torch.randn(m, REAL["hidden"], device=DEV) * 4).to(dtype)
        a = make_cache(REAL, m, length, dtype, seed=length, device=DEV)
        b = make_cache(REAL, m, length, dtype, seed=length, device=DEV)
        phased = pl.layer_step(x, w, cos, sin, a.k, a.v, length, phased=True)
        for _ in range(3):          # repeated launches: the counters must come back to zero each time
            one = pl.layer_step(x, w, cos, sin, b.k, b.v, length)
            assert torch.equal(one, phased) and torch.equal(one.ssq, phased.ssq), (m, dtype, length)
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v), (m, dtype, length)
        # chained: the next layer from these rows' sums of squares (no sums-of-squares phase), both ways
        a2 = make_cache(REAL, m, length, dtype, seed=length + 1, device=DEV)
        b2 = make_cache(REAL, m, length, dtype, seed=length + 1, device=DEV)
        phased2 = pl.layer_step(phased, w, cos, sin, a2.k, a2.v, length, phased=True, ssq_in=phased.ssq)
        one2 = pl.layer_step(one, w, cos, sin, b2.k, b2.v, length, ssq_in=one.ssq)
        assert torch.equal(one2, phased2) and torch.equal(a2.k, b2.k), (m, dtype, length)
        assert not pl._barrier_counters(x.device).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,length", [(1, 0), (2, 14), (64, 9)])
def test_layer_matches_the_torch_layer(m, length, dtype):
    """check_layer_step builds the layer and the reference on the CPU; the step runs on the GPU."""
    from voxflow.kernels import cp_persistent_layer as pl

    def step(x, w, cos, sin, cache):
        k, v = cache.k.to(DEV), cache.v.to(DEV)
        out = pl.layer_step(x.to(DEV), on_gpu(w), cos.to(DEV), sin.to(DEV), k, v, cache.claim())
        cache.k.copy_(k.cpu())
        cache.v.copy_(v.cpu())
        return out.cpu()
    check_layer_step(step, REAL, dtype, m, length)


@torch.no_grad()
def test_five_layers_in_a_cuda_graph():
    from voxflow.kernels import cp_persistent_layer as pl
    from voxflow.layers.rotary import RotaryEmbedding
    from voxflow.layers.static_kv_cache import StaticKVCache
    from voxflow.models.qwen3_tts.code_predictor import _layer_weights
    dtype, m = torch.bfloat16, 64
    weights = [_layer_weights(make_layer(REAL, dtype, seed=i, device=DEV)) for i in range(5)]
    cos_all, sin_all = RotaryEmbedding(128, 1e6, 64).to(DEV).prefix(16, torch.device(DEV), dtype)
    x0 = (torch.randn(m, REAL["hidden"], device=DEV) * 4).to(dtype)
    cache = StaticKVCache(5, m, 8, 16, 128, dtype, torch.device(DEV))

    def frame():
        for c in cache.layers:
            c.length = 1
        x = x0
        for t in range(1, 15):
            for i, (w, c) in enumerate(zip(weights, cache.layers)):
                x = pl.layer_step(x, w, cos_all[:, t:t + 1], sin_all[:, t:t + 1], c.k, c.v, c.claim(),
                                  ssq_in=x.ssq if i else None)
        return x
    for c in cache.layers:
        c.k.normal_()
        c.v.normal_()
    frame()                                               # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = frame()
    x0.copy_((torch.randn(m, REAL["hidden"], device=DEV) * 4).to(dtype))
    weights[2].down.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.clone()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, replayed)
    assert torch.equal(replayed, frame())


@torch.no_grad()
@pytest.mark.parametrize("rows", [8, 64])
def test_predict_persistent_on_vs_off(rows):
    import voxflow.models.qwen3_tts.code_predictor as cp_mod
    from voxflow.kernels import cp_persistent_layer as pl
    saved = cp_mod.CP_PERSISTENT, pl.layer_step
    calls = []
    pl.layer_step = lambda *a, **kw: (calls.append(1), saved[1](*a, **kw))[1]
    try:
        for dtype in (torch.float32, torch.bfloat16):
            cp = make_code_predictor(dtype, DEV)
            h = (torch.randn(rows, 2048, device=DEV) * 2).to(dtype)
            c0 = torch.randn(rows, 2048, device=DEV).to(dtype)
            greedy = lambda logits, j: logits.argmax(-1)            # noqa: E731
            cp_mod.CP_PERSISTENT = False
            codes_off, logits_off = cp.predict(h, c0, greedy)
            forced = lambda logits, j: codes_off[:, j]              # noqa: E731
            cp_mod.CP_PERSISTENT = True
            calls.clear()
            codes_on, _ = cp.predict(h, c0, greedy)
            assert len(calls) == 5 * 14, "the persistent layer did not run on every single-token step"
            _, logits_forced = cp.predict(h, c0, forced)
            err = (logits_forced.float() - logits_off.float()).abs().max().item()
            assert err <= 5e-2 * logits_off.float().abs().max().item(), (dtype, err)
            if dtype == torch.float32:
                assert torch.equal(codes_on, codes_off)
    finally:
        cp_mod.CP_PERSISTENT, pl.layer_step = saved
