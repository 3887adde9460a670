"""The decode layers' batch GEMMs (voxflow/kernels/batch_linear.py: o_proj / down_proj + residual, gate|up with
silu * up, on tensor cores) on CUDA at the real 1.7B shapes of the code predictor and the talker, against the plain
torch code (kernel switch off) with tests/test_kernel_batch_linear.py's tolerances, plus what only the GPU can show:
the wgmma code path (the interpreter runs tl.dot in fp32), candidate configs, and a decoder layer with BATCH_GEMMS
on captured in a CUDA graph and replayed on new inputs (equal to the eager result).
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F

import voxflow.kernels as switch
from cp_layer_reference import REAL, make_cache, make_layer
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


def expected(x, w, mode, res):
    """(same-dtype torch result, fp32 result, error scale) of the unfused expression."""
    with torch_only():
        if mode == "residual":
            return reference(x, w, residual=res)
        n = w.shape[0] // 2
        gate_up, gate_up32, scale_gu = reference(x, w)
        g32, u32 = gate_up32[:, :n], gate_up32[:, n:]
        y32 = F.silu(g32) * u32
        scale = 1.1 * scale_gu[:, :n] * u32.abs() + F.silu(g32).abs() * scale_gu[:, n:] + y32.abs()
        return F.silu(gate_up[:, :n]) * gate_up[:, n:], y32, scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [9, 64, 200])
@pytest.mark.parametrize("k,n,mode", [(1024, 3072, "swiglu"), (2048, 1024, "residual"), (3072, 1024, "residual"),
                                      (2048, 6144, "swiglu"), (2048, 2048, "residual"), (6144, 2048, "residual")])
def test_batch_linear_real_shapes(k, n, mode, m, dtype):
    from voxflow.kernels.batch_linear import batch_linear
    g = torch.Generator(device=DEV).manual_seed(m)
    x = (torch.randn(m, k, device=DEV, generator=g) * 2).to(dtype)
    w = (torch.randn(2 * n if mode == "swiglu" else n, k, device=DEV, generator=g) * k ** -0.5).to(dtype)
    res = (torch.randn(m, n, device=DEV, generator=g) * 4).to(dtype)
    run = lambda: batch_linear(x, w, swiglu=mode == "swiglu", residual=res if mode == "residual" else None)  # noqa
    got = run()
    y, y32, scale = expected(x, w, mode, res)
    if dtype == torch.float32:
        assert (got - y).abs().max().item() <= 1e-5 * y.abs().max().item()
    else:
        assert ((got.float() - y32).abs() <= 2.0 ** -7 * scale).all(), ((got.float() - y32).abs() / scale).max()
    assert torch.equal(got, run())                                                     # deterministic


@pytest.mark.parametrize("config", [dict(BLOCK_N=32), dict(BLOCK_N=64, BLOCK_K=64, num_stages=3), dict(BLOCK_M=16),
                                    dict(BLOCK_M=128, num_warps=8), dict(num_stages=6), dict(BLOCK_N=32, num_warps=8)])
def test_batch_linear_config_overrides(config):
    from voxflow.kernels.batch_linear import batch_linear
    for n, k, mode in ((3072, 1024, "swiglu"), (1024, 3072, "residual")):
        x = torch.randn(64, k, device=DEV).to(torch.bfloat16)
        w = (torch.randn(2 * n if mode == "swiglu" else n, k, device=DEV) * k ** -0.5).to(torch.bfloat16)
        res = (torch.randn(64, n, device=DEV) * 4).to(torch.bfloat16)
        _, y32, scale = expected(x, w, mode, res)
        got = batch_linear(x, w, swiglu=mode == "swiglu", residual=res if mode == "residual" else None, config=config)
        assert ((got.float() - y32).abs() <= 2.0 ** -7 * scale).all(), (config, mode)


@torch.no_grad()
@pytest.mark.parametrize("m", [16, 64, 200])
def test_layer_with_batch_gemms_in_a_cuda_graph(m):
    """A code-predictor-sized layer (bf16) with BATCH_GEMMS at a single-token step: the three batch GEMMs ran
    (spied), the result within the bf16 layer's own error of the kernel path without them, and a CUDA graph of
    it replayed on new inputs == the eager result."""
    from voxflow.kernels import batch_linear as bl
    from voxflow.layers.rotary import RotaryEmbedding
    dtype = torch.bfloat16
    layer = make_layer(REAL, dtype, device=DEV)
    cos, sin = RotaryEmbedding(REAL["head_dim"], 1e6, 64).to(DEV)._compute(torch.tensor([[5]], device=DEV), dtype)
    x_in = (torch.randn(m, 1, REAL["hidden"], device=DEV) * 4).to(dtype)
    layer.batch_gemms = False
    cache = make_cache(REAL, m, 5, dtype, device=DEV)
    want = layer(x_in, cos, sin, cache, None)
    calls, real = [], bl.batch_linear
    bl.batch_linear = lambda *a, **kw: (calls.append(1), real(*a, **kw))[1]
    try:
        layer.batch_gemms = True
        cache = make_cache(REAL, m, 5, dtype, device=DEV)
        got = layer(x_in, cos, sin, cache, None)
        assert len(calls) == 3
        scale = want.float().abs().max().item()
        assert (got.float() - want.float()).abs().max().item() <= 2.0 ** -6 * scale
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            cache.length = 5
            out = layer(x_in, cos, sin, cache, None)
        x_in.copy_(torch.randn(m, 1, REAL["hidden"], device=DEV) * 3)
        graph.replay()
        replayed = out.clone()
        cache.length = 5
        assert torch.equal(replayed, layer(x_in, cos, sin, cache, None))
    finally:
        bl.batch_linear = real
