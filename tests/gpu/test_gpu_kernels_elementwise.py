"""The element-wise Triton kernels on CUDA at Qwen3-TTS shapes, held to the torch reference on the same GPU.

Shapes: hidden 2048 (talker) and 1024 (code predictor) with intermediate 6144 / 3072, head_dim 128, 16 query and
8 KV heads, batch 1 and 64, a decode step (S=1) and a short prefill (S=7). Tolerances (output-dtype ulp):
- rotary: bit-exact, fp32 and bf16 (same rounding order, fma contraction off);
- RMSNorm: <= 8 ulp fp32, <= 2 ulp bf16 (the fp32 sum of squares is added in another order than torch's).
  Measured on an H200 (torch 2.11, triton 3.6), 8192 random rows: width 128 bit-exact in fp32 and bf16; widths
  1024/2048 fp32 84% bit-equal, max 5 ulp; bf16 all but a handful bit-equal, max 2 ulp (1 ulp in the normalised
  value before the weight multiply, 2 in the product when the weight drops it a binade);
- silu*mul: bit-exact (same expf and IEEE division as torch's CUDA kernel; measured on 4M elements per dtype);
- one whole Qwen3 decoder layer, kernels on vs off: max |diff| <= 1e-5 (fp32) / 2e-2 (bf16) of the output's max.
Also: the layers really dispatch to the kernels on CUDA, and the kernels replay inside a CUDA graph.
"""
import pytest
import torch
import torch.nn.functional as F

from float_compare import assert_within_ulp  # tests/float_compare.py

import voxflow.kernels as switch
from voxflow.kernels import rms_norm as k_norm
from voxflow.kernels import rotary as k_rotary
from voxflow.kernels import silu_mul as k_silu
from voxflow.layers import mlp as mlp_layer
from voxflow.layers import rms_norm as norm_layer
from voxflow.layers import rotary as rotary_layer
from voxflow.layers.attention import attention_bias
from voxflow.layers.qwen3_layer import Qwen3DecoderLayer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")

DEV = "cuda"
DTYPES = [torch.float32, torch.bfloat16]
SIZES = [(2048, 6144), (1024, 3072)]      # (hidden, intermediate): talker, code predictor
BATCHES = [1, 64]
SEQS = [1, 7]
HEAD_DIM, N_Q, N_KV = 128, 16, 8
NORM_ULP = {torch.float32: 8, torch.bfloat16: 2}


@pytest.fixture(autouse=True)
def reference_numerics(monkeypatch):
    """Plain fp32 matmuls, and the kernel switch restored after each test."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    on = switch.kernels_enabled()
    yield
    switch.set_kernels_enabled(on)


def reference_rms_norm(x, w, eps):
    switch.set_kernels_enabled(False)
    try:
        return norm_layer.rms_norm(x, w, eps)
    finally:
        switch.set_kernels_enabled(True)


def rand(*shape, dtype, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen, device=DEV) * scale).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [h for h, _ in SIZES])
@pytest.mark.parametrize("b", BATCHES)
@pytest.mark.parametrize("s", SEQS)
def test_rms_norm_hidden(dtype, hidden, b, s):
    gen = torch.Generator(device=DEV).manual_seed(0)
    x = rand(b, s, hidden, dtype=dtype, gen=gen, scale=3.0)
    w = (torch.rand(hidden, generator=gen, device=DEV) + 0.5).to(dtype)
    assert_within_ulp(k_norm.rms_norm(x, w, 1e-6), reference_rms_norm(x, w, 1e-6), NORM_ULP[dtype])
    r = rand(b, s, hidden, dtype=dtype, gen=gen)
    normed, summed = k_norm.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(summed, x + r)
    assert_within_ulp(normed, reference_rms_norm(x + r, w, 1e-6), NORM_ULP[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [N_Q, N_KV])
@pytest.mark.parametrize("b", BATCHES)
def test_rms_norm_per_head(dtype, heads, b):
    """q_norm / k_norm: [B, S, H, 128] rows, and the transposed [B, H, S, 128] view."""
    gen = torch.Generator(device=DEV).manual_seed(1)
    x = rand(b, 7, heads, HEAD_DIM, dtype=dtype, gen=gen, scale=2.0)
    w = (torch.rand(HEAD_DIM, generator=gen, device=DEV) + 0.5).to(dtype)
    for view in (x, x.transpose(1, 2)):
        assert_within_ulp(k_norm.rms_norm(view, w, 1e-6), reference_rms_norm(view, w, 1e-6), NORM_ULP[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b", BATCHES)
@pytest.mark.parametrize("s", SEQS)
def test_rotary_bit_exact(dtype, b, s):
    gen = torch.Generator(device=DEV).manual_seed(2)
    q = rand(b, s, N_Q, HEAD_DIM, dtype=dtype, gen=gen).transpose(1, 2)     # the layer's views
    k = rand(b, s, N_KV, HEAD_DIM, dtype=dtype, gen=gen).transpose(1, 2)
    positions = torch.randint(0, 30000, (b, s), generator=gen, device=DEV)
    cos, sin = rotary_layer.RotaryEmbedding(HEAD_DIM, 1e6).to(DEV)(positions, dtype)
    switch.set_kernels_enabled(False)
    expect_q, expect_k = rotary_layer.apply_rotary(q, k, cos, sin)
    got_q, got_k = k_rotary.apply_rotary(q, k, cos, sin)
    assert torch.equal(got_q, expect_q), f"q: max |diff| {(got_q - expect_q).abs().max()}"
    assert torch.equal(got_k, expect_k), f"k: max |diff| {(got_k - expect_k).abs().max()}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [i for _, i in SIZES])
@pytest.mark.parametrize("b", BATCHES)
@pytest.mark.parametrize("s", SEQS)
def test_silu_mul(dtype, inter, b, s):
    gen = torch.Generator(device=DEV).manual_seed(3)
    gate = rand(b, s, inter, dtype=dtype, gen=gen, scale=4.0)
    up = rand(b, s, inter, dtype=dtype, gen=gen)
    assert_within_ulp(k_silu.silu_mul(gate, up), F.silu(gate) * up, 0)


def test_layers_dispatch_on_cuda(monkeypatch):
    calls = []
    for mod, fn in ((k_norm, "rms_norm"), (k_rotary, "apply_rotary"), (k_silu, "silu_mul")):
        real = getattr(mod, fn)
        monkeypatch.setattr(mod, fn, lambda *a, _real=real, _fn=fn: (calls.append(_fn), _real(*a))[1])
    gen = torch.Generator(device=DEV).manual_seed(4)
    x = rand(2, 1, 1024, dtype=torch.bfloat16, gen=gen)
    mlp = mlp_layer.SwiGLU(1024, 3072).to(DEV, torch.bfloat16).requires_grad_(False)
    q = rand(2, 1, N_Q, HEAD_DIM, dtype=torch.bfloat16, gen=gen).transpose(1, 2)
    k = rand(2, 1, N_KV, HEAD_DIM, dtype=torch.bfloat16, gen=gen).transpose(1, 2)
    cos, sin = rotary_layer.RotaryEmbedding(HEAD_DIM, 1e6).to(DEV)(torch.zeros(2, 1, dtype=torch.long, device=DEV),
                                                                  torch.bfloat16)
    w = torch.ones(1024, device=DEV, dtype=torch.bfloat16)
    switch.set_kernels_enabled(True)
    norm_layer.rms_norm(x, w, 1e-6), rotary_layer.apply_rotary(q, k, cos, sin), mlp(x)
    assert calls == ["rms_norm", "apply_rotary", "silu_mul"]
    switch.set_kernels_enabled(False)
    norm_layer.rms_norm(x, w, 1e-6), rotary_layer.apply_rotary(q, k, cos, sin), mlp(x)
    assert len(calls) == 3


def test_kernels_replay_in_a_cuda_graph():
    """No host syncs: the three kernels capture into a CUDA graph and replay on new inputs."""
    gen = torch.Generator(device=DEV).manual_seed(5)
    dt = torch.bfloat16
    x = rand(4, 1, 1024, dtype=dt, gen=gen)
    w = (torch.rand(1024, generator=gen, device=DEV) + 0.5).to(dt)
    q = rand(4, 1, N_Q, HEAD_DIM, dtype=dt, gen=gen).transpose(1, 2)
    k = rand(4, 1, N_KV, HEAD_DIM, dtype=dt, gen=gen).transpose(1, 2)
    pos = torch.randint(0, 4000, (4, 1), generator=gen, device=DEV)
    cos, sin = rotary_layer.RotaryEmbedding(HEAD_DIM, 1e6).to(DEV)(pos, dt)
    gate, up = rand(4, 1, 3072, dtype=dt, gen=gen), rand(4, 1, 3072, dtype=dt, gen=gen)

    def step():
        return (k_norm.rms_norm(x, w, 1e-6), *k_norm.add_rms_norm(x, x, w, 1e-6),
                *k_rotary.apply_rotary(q, k, cos, sin), k_silu.silu_mul(gate, up))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):            # warm-up (Triton compiles) outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for t in (x, q, k, gate, up):            # new inputs in the captured buffers
        t.copy_(torch.randn(t.shape, generator=gen, device=DEV).to(dt))
    graph.replay()
    torch.cuda.synchronize()
    for got, expect in zip(outs, step()):
        assert torch.equal(got, expect)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("hidden,inter", SIZES)
@pytest.mark.parametrize("b", BATCHES)
def test_decoder_layer_kernels_on_vs_off(dtype, tol, hidden, inter, b):
    torch.manual_seed(6)
    layer = Qwen3DecoderLayer(hidden, inter, N_Q, N_KV, HEAD_DIM, 1e-6).to(DEV, dtype).eval().requires_grad_(False)
    for name, p in layer.named_parameters():
        if name.endswith("norm.weight"):
            p.uniform_(0.5, 1.5)
    s = 5
    x = torch.randn(b, s, hidden, device=DEV).to(dtype)
    positions = torch.arange(s, device=DEV).expand(b, s) + 100
    cos, sin = rotary_layer.RotaryEmbedding(HEAD_DIM, 1e6).to(DEV)(positions, dtype)
    bias = attention_bias(s, s, None, batch=b, dtype=dtype, device=torch.device(DEV))
    with torch.no_grad():
        switch.set_kernels_enabled(True)
        fast = layer(x, cos, sin, None, bias)
        switch.set_kernels_enabled(False)
        ref = layer(x, cos, sin, None, bias)
    assert torch.isfinite(fast).all()
    rel = ((fast.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert rel <= tol, f"kernels on vs off: max |diff| = {rel:.2e} of max |out|"
