"""The one-output-channel convolution as GEMM + shifted adds (voxflow/layers/one_channel_conv.py) against conv1d."""
import pytest
import torch
import torch.nn.functional as F

from voxflow.layers.one_channel_conv import one_channel_conv1d


@pytest.mark.parametrize("k,dilation", [(7, 1), (3, 2), (1, 1)])
def test_equals_conv1d(k, dilation):
    torch.manual_seed(k)
    x = torch.randn(3, 5, 40, dtype=torch.float64)
    w = torch.randn(1, 5, k, dtype=torch.float64)
    b = torch.randn(1, dtype=torch.float64)
    want = F.conv1d(x, w, b, dilation=dilation)
    got = one_channel_conv1d(x, w, b, dilation)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(one_channel_conv1d(x, w, None, dilation), F.conv1d(x, w, None, dilation=dilation),
                               rtol=1e-12, atol=1e-12)


def test_wrong_weight_is_refused():
    with pytest.raises(ValueError, match="weight"):
        one_channel_conv1d(torch.zeros(1, 4, 10), torch.zeros(2, 4, 3), None)


def test_codec_final_conv_takes_it_for_bf16_with_kernels_on(monkeypatch):
    """The codec's causal conv to one channel, kernel switch on and bf16 (as on a GPU): this path, streamed, within
    bf16 rounding of the plain layer."""
    import voxflow.models.qwen3_tts.codec_decoder_blocks as blocks
    torch.manual_seed(0)
    m = blocks.CausalConv1d(16, 1, kernel_size=7).to(torch.bfloat16).requires_grad_(False)
    m.state_key = "out"
    x = torch.randn(2, 16, 30).to(torch.bfloat16)
    want = m(x).float()
    calls = []
    real = one_channel_conv1d
    monkeypatch.setattr("voxflow.layers.one_channel_conv.one_channel_conv1d", lambda *a: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(blocks, "use_kernels", lambda t: True)
    state = m.init_state(2, "cpu", torch.bfloat16)
    got = torch.cat([m(x[..., :11], state), m(x[..., 11:], state)], -1).float()
    assert len(calls) == 2
    assert ((got - want).abs() <= want.abs() * 2 ** -6 + 0.02).all()
