"""The fused q/k RMSNorm + RoPE kernel and the decoder layer's fused paths on CUDA, at Qwen3-TTS shapes.

Shapes: head_dim 128, 16 query and 8 KV heads (talker and code predictor alike), batch 1 and 64, a decode step
(S=1) and a short prefill (S=7); the projections as the layer makes them (contiguous) and as slices of a fused
qkv projection (strided rows). Held to the plain torch reference on the same GPU (kernel switch off):
- bf16: >= 99% of elements bit-equal and max |diff| <= 1 eps of the head row's largest |value| (under the CPU
  interpreter it is bit-exact; on the GPU the fp32 sum of squares is added in another order than torch's and
  rsqrt may differ in the last bit, which can flip a bf16 rounding now and then);
- fp32: max |diff| <= 8 eps of the head row's largest |value| (an element-wise ulp bound does not fit: the rope
  sum can cancel to near zero);
- against the per-op kernels the layer used before (rms_norm x2 + rotary), the same bounds;
- a whole Qwen3DecoderLayer, kernels on vs off: max |diff| <= 1e-5 (fp32) / 2e-2 (bf16) of the output's max,
  and the layer really calls the two fusions (qk_norm_rope, add_rms_norm) and not the per-op rotary;
- the kernel and a whole layer with the fusions capture into a CUDA graph and replay on new inputs.
"""
import pytest
import torch

import voxflow.kernels as switch
from voxflow.kernels import qk_norm_rope as fused
from voxflow.kernels import rms_norm as k_norm
from voxflow.kernels import rotary as k_rotary
from voxflow.layers import qwen3_layer
from voxflow.layers import rotary as rotary_layer
from voxflow.layers.attention import KVCache, attention_bias
from voxflow.layers.qwen3_layer import Qwen3DecoderLayer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")

DEV = "cuda"
HEAD_DIM, N_Q, N_KV = 128, 16, 8
ROW_EPS = {torch.float32: 8, torch.bfloat16: 1}
MIN_BIT_EQUAL = {torch.float32: 0.5, torch.bfloat16: 0.99}


@pytest.fixture(autouse=True)
def reference_numerics(monkeypatch):
    """Plain fp32 matmuls, and the kernel switch restored after each test."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    on = switch.kernels_enabled()
    yield
    switch.set_kernels_enabled(on)


def assert_matches(got, expect, dtype):
    assert got.shape == expect.shape and got.dtype == expect.dtype == dtype, (got.shape, got.dtype, expect.dtype)
    row_max = expect.float().abs().amax(-1, keepdim=True)
    err = ((got.float() - expect.float()).abs() / row_max).max().item() / torch.finfo(dtype).eps
    equal = (got == expect).float().mean().item()
    assert err <= ROW_EPS[dtype], f"max |diff| {err:.2f} eps of the row max > {ROW_EPS[dtype]} ({equal:.2%} equal)"
    assert equal >= MIN_BIT_EQUAL[dtype], f"only {equal:.2%} bit-equal"


def inputs(b, s, dtype, gen, layout="separate"):
    width = (N_Q + 2 * N_KV) * HEAD_DIM
    if layout == "separate":
        q = (torch.randn(b, s, N_Q * HEAD_DIM, generator=gen, device=DEV) * 3).to(dtype).unflatten(-1, (N_Q, -1))
        k = (torch.randn(b, s, N_KV * HEAD_DIM, generator=gen, device=DEV) * 3).to(dtype).unflatten(-1, (N_KV, -1))
    else:   # slices of one fused qkv projection
        qkv = (torch.randn(b, s, width, generator=gen, device=DEV) * 3).to(dtype)
        q = qkv[..., :N_Q * HEAD_DIM].unflatten(-1, (N_Q, HEAD_DIM))
        k = qkv[..., N_Q * HEAD_DIM:(N_Q + N_KV) * HEAD_DIM].unflatten(-1, (N_KV, HEAD_DIM))
    qw = (torch.rand(HEAD_DIM, generator=gen, device=DEV) + 0.5).to(dtype)
    kw = (torch.rand(HEAD_DIM, generator=gen, device=DEV) + 0.5).to(dtype)
    positions = torch.randint(0, 30000, (b, s), generator=gen, device=DEV)
    cos, sin = rotary_layer.RotaryEmbedding(HEAD_DIM, 1e6).to(DEV)(positions, dtype)
    return q, k, qw, kw, cos, sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b", [1, 64])
@pytest.mark.parametrize("s", [1, 7])
@pytest.mark.parametrize("layout", ["separate", "fused"])
def test_kernel_matches_reference(dtype, b, s, layout):
    gen = torch.Generator(device=DEV).manual_seed(0)
    args = inputs(b, s, dtype, gen, layout)
    assert fused.supported(*args)
    got_q, got_k = fused.qk_norm_rope(*args, 1e-6, 1e-6)
    switch.set_kernels_enabled(False)
    expect_q, expect_k = fused.qk_norm_rope_reference(*args, 1e-6, 1e-6)          # plain torch
    assert_matches(got_q, expect_q, dtype)
    assert_matches(got_k, expect_k, dtype)
    switch.set_kernels_enabled(True)
    per_op_q, per_op_k = fused.qk_norm_rope_reference(*args, 1e-6, 1e-6)          # rms_norm x2 + rotary kernels
    assert_matches(got_q, per_op_q, dtype)
    assert_matches(got_k, per_op_k, dtype)
    assert got_q.is_contiguous() and got_k.is_contiguous()


def _layer(hidden, inter, dtype):
    torch.manual_seed(1)
    layer = Qwen3DecoderLayer(hidden, inter, N_Q, N_KV, HEAD_DIM, 1e-6).to(DEV, dtype).eval().requires_grad_(False)
    for name, p in layer.named_parameters():
        if name.endswith("norm.weight"):
            p.uniform_(0.5, 1.5)
    return layer


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("hidden,inter", [(2048, 6144), (1024, 3072)])
@pytest.mark.parametrize("b", [1, 64])
def test_decoder_layer_fused_vs_reference(monkeypatch, dtype, tol, hidden, inter, b):
    """A 5-token prefill then a decode step through a KV cache, kernels on vs off."""
    calls = []
    for mod, fn in ((fused, "qk_norm_rope"), (k_norm, "add_rms_norm"), (k_rotary, "apply_rotary")):
        real = getattr(mod, fn)
        monkeypatch.setattr(mod, fn, lambda *a, _real=real, _fn=fn: (calls.append(_fn), _real(*a))[1])
    monkeypatch.setattr(qwen3_layer, "SKINNY_MAX_ROWS", 0)     # the skinny-GEMM layer path is tested on its own
    layer = _layer(hidden, inter, dtype)
    x = torch.randn(b, 6, hidden, device=DEV).to(dtype)
    positions = torch.arange(6, device=DEV).expand(b, 6) + 100
    cos, sin = rotary_layer.RotaryEmbedding(HEAD_DIM, 1e6).to(DEV)(positions, dtype)

    def run():
        cache = KVCache(1)
        bias = attention_bias(5, 5, None, batch=b, dtype=dtype, device=torch.device(DEV))
        first = layer(x[:, :5], cos[:, :5], sin[:, :5], cache[0], bias)
        return torch.cat((first, layer(x[:, 5:], cos[:, 5:], sin[:, 5:], cache[0], None)), dim=1)

    with torch.no_grad():
        switch.set_kernels_enabled(True)
        fast = run()
        assert calls == ["qk_norm_rope", "add_rms_norm"] * 2
        switch.set_kernels_enabled(False)
        ref = run()
        assert len(calls) == 4
    assert torch.isfinite(fast).all()
    rel = ((fast.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert rel <= tol, f"kernels on vs off: max |diff| = {rel:.2e} of max |out|"


def _capture(step):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):            # warm-up (Triton compiles) outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    return graph, outs


def test_kernel_replays_in_a_cuda_graph():
    gen = torch.Generator(device=DEV).manual_seed(2)
    q, k, qw, kw, cos, sin = inputs(4, 1, torch.bfloat16, gen, "fused")
    graph, outs = _capture(lambda: fused.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6, 1e-6))
    for t in (q, k, cos, sin):               # new inputs in the captured buffers
        t.copy_(torch.randn(t.shape, generator=gen, device=DEV).to(t.dtype))
    graph.replay()
    torch.cuda.synchronize()
    expect = fused.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6, 1e-6)
    assert torch.equal(outs[0], expect[0]) and torch.equal(outs[1], expect[1])


def test_decoder_layer_replays_in_a_cuda_graph():
    """A decode step of a whole layer (fused paths on) captured and replayed with a new input token."""
    dtype, b = torch.bfloat16, 8
    layer = _layer(1024, 3072, dtype)
    gen = torch.Generator(device=DEV).manual_seed(3)
    x = torch.randn(b, 1, 1024, generator=gen, device=DEV).to(dtype)
    past_k = torch.randn(b, N_KV, 9, HEAD_DIM, generator=gen, device=DEV).to(dtype)
    past_v = torch.randn(b, N_KV, 9, HEAD_DIM, generator=gen, device=DEV).to(dtype)
    positions = torch.full((b, 1), 9, device=DEV)
    cos, sin = rotary_layer.RotaryEmbedding(HEAD_DIM, 1e6).to(DEV)(positions, dtype)

    def step():
        cache = KVCache(1)
        cache[0].append(past_k, past_v)
        return layer(x, cos, sin, cache[0], None)

    switch.set_kernels_enabled(True)
    with torch.no_grad():
        graph, out = _capture(step)
        x.copy_(torch.randn(x.shape, generator=gen, device=DEV).to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        expect = step()
    assert torch.equal(out, expect)
