"""The small-convolution GEMM (voxflow/layers/conv_im2col.py) against conv1d, and the codec block that uses it."""
import pytest
import torch
import torch.nn.functional as F

from voxflow.layers.conv_im2col import conv1d_im2col, fits


@pytest.mark.parametrize("k,dilation", [(7, 1), (3, 3), (2, 1)])
def test_equals_conv1d(k, dilation):
    torch.manual_seed(k + dilation)
    x = torch.randn(3, 5, 30, dtype=torch.float64)
    w = torch.randn(4, 5, k, dtype=torch.float64)
    b = torch.randn(4, dtype=torch.float64)
    for bias in (b, None):
        got = conv1d_im2col(x, w, bias, dilation)
        assert got.is_contiguous()
        torch.testing.assert_close(got, F.conv1d(x, w, bias, dilation=dilation), rtol=1e-12, atol=1e-12)


def test_fits_limits_the_unfolded_size():
    assert fits(torch.empty(64, 1024, 106, device="meta"), 7)           # the codec's frame-rate layer
    assert not fits(torch.empty(64, 768, 806, device="meta"), 7)        # a 400 Hz layer stays on cuDNN


def test_codec_causal_conv_takes_it_with_kernels_on(monkeypatch):
    """A causal conv with the kernel switch on (as on a GPU), streamed: equal to the plain layer."""
    import voxflow.models.qwen3_tts.codec_decoder_blocks as blocks
    torch.manual_seed(0)
    m = blocks.CausalConv1d(6, 4, kernel_size=7).double().requires_grad_(False)
    m.state_key = "c"
    x = torch.randn(2, 6, 20, dtype=torch.float64)
    want = m(x)
    calls = []
    import voxflow.layers.conv_im2col as mod
    real = mod.conv1d_im2col
    monkeypatch.setattr(mod, "conv1d_im2col", lambda *a: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(blocks, "use_kernels", lambda t: True)
    state = m.init_state(2, "cpu", torch.float64)
    got = torch.cat([m(x[..., :9], state), m(x[..., 9:], state)], -1)
    assert len(calls) == 2
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
