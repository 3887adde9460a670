"""The codec's fused SnakeBeta on CUDA: bit-exact against the torch expression (same sinf, same rounding points),
at codec-like shapes, fp32 and bf16, and inside a CUDA graph."""
import pytest
import torch

import voxflow.kernels as switch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")


def module(channels, dtype):
    from voxflow.models.qwen3_tts.codec_decoder_blocks import SnakeBeta
    torch.manual_seed(channels)
    m = SnakeBeta(channels)
    m.alpha.data.uniform_(-1.0, 1.0)
    m.beta.data.uniform_(-1.0, 1.0)
    return m.to("cuda", dtype).eval().requires_grad_(False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,c,t", [(1, 1536, 50), (16, 768, 400), (4, 96, 24000)])
def test_snake_beta_is_bit_exact_on_cuda(monkeypatch, dtype, b, c, t):
    m = module(c, dtype)
    x = (torch.randn(b, c, t, device="cuda") * 3).to(dtype)
    monkeypatch.setattr(switch, "_enabled", False)
    want = m(x)
    monkeypatch.setattr(switch, "_enabled", True)
    got = m(x)
    assert m._derived is not None                     # the kernel path ran (it caches the channel terms)
    assert torch.equal(got, want)


def test_snake_beta_replays_in_a_cuda_graph(monkeypatch):
    monkeypatch.setattr(switch, "_enabled", True)
    m = module(384, torch.float32)
    x = torch.randn(2, 384, 1000, device="cuda")
    m(x)                                            # terms cached and kernel compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = m(x)
    x.normal_()
    graph.replay()
    monkeypatch.setattr(switch, "_enabled", False)
    assert torch.equal(out, m(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_biases_fused_into_snake_and_residual_add_are_bit_exact(monkeypatch, dtype):
    """A residual unit with its convolutions' biases folded into act2's SnakeBeta and the residual add (the kernel
    path) equals the plain module on the GPU bit for bit: cuDNN computes the same bias-less convolution, and the
    folded adds round where PyTorch's separate adds round. (The kernel path would also run this low-rate conv as an
    im2col GEMM, another summation order; that is held to the plain decoder by tolerance in test_gpu_codec.py, so it
    is kept out of this bit-exact check.)"""
    from voxflow.layers import conv_im2col
    from voxflow.models.qwen3_tts.codec_decoder_blocks import ResidualUnit
    monkeypatch.setattr(conv_im2col, "MAX_UNFOLDED", 0)
    torch.manual_seed(0)
    unit = ResidualUnit(192, dilation=9)
    for act in (unit.act1, unit.act2):
        act.alpha.data.uniform_(-1.0, 1.0)
        act.beta.data.uniform_(-1.0, 1.0)
    unit = unit.to("cuda", dtype).eval().requires_grad_(False)
    x = torch.randn(8, 192, 2000, device="cuda").to(dtype)
    monkeypatch.setattr(switch, "_enabled", False)
    want = unit(x)
    monkeypatch.setattr(switch, "_enabled", True)
    assert torch.equal(unit(x), want)
