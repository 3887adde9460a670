"""The transposed convolution as GEMM + overlap-add (voxflow/layers/conv_transpose_gemm.py) against
torch's conv_transpose1d, whole and streamed in pieces, and through the codec block that uses it on the GPU."""
import pytest
import torch
import torch.nn.functional as F

from voxflow.layers.conv_transpose_gemm import conv_transpose_gemm


@pytest.mark.parametrize("cin,cout,stride,kernel", [(6, 4, 3, 6), (5, 3, 4, 5), (4, 4, 2, 2), (8, 3, 8, 16)])
def test_gemm_equals_conv_transpose_whole_and_in_pieces(cin, cout, stride, kernel):
    torch.manual_seed(cin * stride)
    x = torch.randn(2, cin, 11, dtype=torch.float64)
    w = torch.randn(cin, cout, kernel, dtype=torch.float64)
    b = torch.randn(cout, dtype=torch.float64)
    full = F.conv_transpose1d(x, w, b, stride=stride)[..., :11 * stride]     # the causal layer keeps T * stride
    y, _ = conv_transpose_gemm(x, w, b, stride, None)
    torch.testing.assert_close(y, full, rtol=1e-12, atol=1e-12)
    pieces, tail = [], None
    for a, e in ((0, 1), (1, 5), (5, 11)):                                    # streamed: the tail carries over
        piece, tail = conv_transpose_gemm(x[..., a:e], w, b, stride, tail)
        pieces.append(piece)
    torch.testing.assert_close(torch.cat(pieces, -1), full, rtol=1e-12, atol=1e-12)


def test_bad_kernel_stride_pair_is_refused():
    with pytest.raises(ValueError, match="stride"):
        conv_transpose_gemm(torch.zeros(1, 2, 3), torch.zeros(2, 2, 7), None, 3, None)


def test_codec_block_takes_the_gemm_path_with_kernels_on(monkeypatch):
    """CausalConvTranspose1d with the kernel switch on (as on a GPU): streamed pieces == the plain one-pass module."""
    import voxflow.models.qwen3_tts.codec_decoder_blocks as blocks
    torch.manual_seed(0)
    m = blocks.CausalConvTranspose1d(6, 4, kernel_size=10, stride=5).double().requires_grad_(False)
    m.state_key = "up"
    x = torch.randn(3, 6, 9, dtype=torch.float64)
    want = m(x)
    calls = []
    real = __import__("voxflow.layers.conv_transpose_gemm", fromlist=["x"]).conv_transpose_gemm
    monkeypatch.setattr("voxflow.layers.conv_transpose_gemm.conv_transpose_gemm",
                        lambda *a: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(blocks, "use_kernels", lambda t: True)
    state = m.init_state(3, "cpu", torch.float64)
    got = torch.cat([m(x[..., :4], state), m(x[..., 4:], state)], -1)
    assert len(calls) == 2
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
