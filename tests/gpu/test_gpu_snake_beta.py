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
