"""The one-output-channel convolution over channels-last rows (voxflow/kernels/conv_to_one_channel.py) against
torch's conv1d (CPU: Triton's interpreter in a subprocess, since TRITON_INTERPRET must be set before triton is first
imported). fp32 within summation order; fp16 / bf16 within one rounding of the output."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_CONV_ONE_CHILD"
IN_CHILD = in_child(CHILD_FLAG)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int) -> torch.Tensor:
    """conv1d in float64 on x [B, rows, C] -> [B, T, 1], rounded as the kernel's output: the bias-less convolution
    to x's dtype, then + bias rounded again."""
    y = F.conv1d(x.double().transpose(1, 2), weight.double(), None, dilation=dilation).to(x.dtype)
    if bias is not None:
        y = (y.double() + bias.double()[None, :, None]).to(x.dtype)
    return y.transpose(1, 2)


def check_against_conv1d():
    from voxflow.kernels.conv_to_one_channel import BLOCK_T, conv_to_one_channel, packed_taps
    g = torch.Generator().manual_seed(0)
    # (channels, taps, dilation, output rows): the codec's last layer (96, k=7), channels not a power of two, a
    # dilation, one tap, outputs past one row tile
    for c, k, d, t in ((96, 7, 1, BLOCK_T + 37), (5, 3, 2, 20), (130, 1, 1, 9)):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = torch.randn(3, t + (k - 1) * d, c, generator=g).to(dtype)
            w = (torch.randn(1, c, k, generator=g) / (c * k) ** 0.5).to(dtype)
            b = torch.randn(1, generator=g).to(dtype)
            for bias in (b, None):
                got = conv_to_one_channel(x, packed_taps(w), bias, d)
                want = reference(x, w, bias, d)
                assert got.shape == (3, t, 1) and got.dtype == dtype
                if dtype == torch.float32:
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
                else:       # one rounding of the output apart at most (fp32 sums in another order)
                    ulp = torch.finfo(dtype).eps * want.float().abs().clamp_min(1.0)
                    assert ((got.float() - want.float()).abs() <= ulp).all(), (c, k, d, dtype)
    # integer inputs: every sum is exact in fp32 whatever its order, so the kernel's output must equal the reference
    # bit for bit, rounding points included (fp16 spacing is 2 above 2048: rounding the sum first, then adding 0.75
    # and rounding again, is not one rounding of the exact value)
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randint(0, 9, (2, 70, 96), generator=g).to(dtype)
        w = torch.randint(0, 5, (1, 96, 7), generator=g).to(dtype)
        b = torch.tensor([0.75], dtype=dtype)
        got, want = conv_to_one_channel(x, packed_taps(w), b), reference(x, w, b, 1)
        assert want.float().abs().max() > 2048 and torch.equal(got, want), dtype
    # the input's rows need not be contiguous beyond the channels (a buffer's view after its context rows)
    buf = torch.randn(2, 40, 8, generator=g)
    view = buf[:, 3:]
    w = torch.randn(1, 8, 7, generator=g)
    torch.testing.assert_close(conv_to_one_channel(view, packed_taps(w), None), reference(view, w, None, 1),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="taps"):
        conv_to_one_channel(buf, torch.zeros(7, 9), None)
    with pytest.raises(ValueError, match="rows hold no output"):
        conv_to_one_channel(buf[:, :5], packed_taps(w), None)
    with pytest.raises(ValueError, match="weight"):
        packed_taps(torch.zeros(2, 8, 7))


if IN_CHILD:
    def test_child_against_conv1d():
        check_against_conv1d()
else:
    def test_one_channel_kernel_under_the_interpreter():
        run_child(__file__, CHILD_FLAG)
