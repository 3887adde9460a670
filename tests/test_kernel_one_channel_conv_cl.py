"""The codec's last convolution on its own kernel (voxflow/kernels/one_channel_conv_cl.py) against conv1d in
float64, on CPU tensors through Triton's interpreter (in a subprocess, see tests/interpreter_child.py), and against
the implicit-GEMM kernel it replaces (causal_conv.conv1d_channels_last).

Tolerances: fp32 sums in another order than the float64 reference: 1e-5 relative to the sum of |terms|. bf16 /
fp16: the kernel sums exact products in fp32 and rounds twice where torch stores (the convolution, + bias), so it is
within an ulp of each rounded value (the convolution's, the output's) of the float64 value rounded the same way,
plus the fp32 sum's error (bounded by 2 ulps of each, and 1e-6 of the sum of |terms|).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from interpreter_child import in_child, run_child  # tests/interpreter_child.py

pytest.importorskip("triton", reason="triton is not importable here: the Triton kernels cannot be run")

CHILD_FLAG = "VOXFLOW_ONE_CHANNEL_CONV_CHILD"
IN_CHILD = in_child(CHILD_FLAG)
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


def case(b, t, cin, k, d, dtype, seed=0):
    """Inputs [B, ctx + T, Cin] channels-last (and [B, Cin, ctx + T]), a [1, Cin, k] weight and its bias."""
    g = torch.Generator().manual_seed(seed)
    x_ncl = torch.randn(b, cin, (k - 1) * d + t, generator=g).to(dtype)
    w = (torch.randn(1, cin, k, generator=g) / (cin * k) ** 0.5).to(dtype)
    bias = (torch.randn(1, generator=g) * 0.1).to(dtype)
    return x_ncl, w, bias


if IN_CHILD:
    # (B, T, Cin, k, dilation): the codec's 96 channels (three unmasked 32-channel slices), 64 (one 64 slice), a Cin
    # no slice divides (masked), T not a multiple of the tile, one row, dilation, the 1x1
    SHAPES = ((2, 300, 96, 7, 1), (1, 129, 64, 7, 1), (3, 70, 40, 7, 1), (1, 1, 96, 7, 1), (2, 50, 24, 3, 2),
              (2, 40, 16, 1, 1))

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
    @pytest.mark.parametrize("b, t, cin, k, d", SHAPES)
    def test_equals_conv1d(dtype, b, t, cin, k, d):
        from voxflow.kernels.causal_conv import pack_weight
        from voxflow.kernels.one_channel_conv_cl import conv1d_to_one_channel
        x_ncl, w, bias = case(b, t, cin, k, d, dtype)
        x = x_ncl.transpose(1, 2).contiguous()
        exact = F.conv1d(x_ncl.double(), w.double(), None, dilation=d)                      # [B, 1, T]
        scale = F.conv1d(x_ncl.double().abs(), w.double().abs(), None, dilation=d)
        for with_bias in (True, False):
            got = conv1d_to_one_channel(x, pack_weight(w), bias if with_bias else None, d)
            assert got.shape == (b, t, 1) and got.dtype == dtype and got.is_contiguous()
            got = got.transpose(1, 2).double()
            if dtype == torch.float32:
                want = exact + (bias.double() if with_bias else 0)
                bound = 1e-5 * (scale + 1.0)
            else:
                want = exact.to(dtype).double()
                if with_bias:
                    want = (want + bias.double()).to(dtype).double()
                bound = 2 * ULP[dtype] * (exact.abs() + want.abs()) + 1e-6 * scale     # each rounding's ulp
            assert ((got - want).abs() <= bound).all(), (got - want).abs().max()

    def test_equals_the_implicit_gemm_kernel():
        """Against the kernel it replaces, at the stack's own strides: the input is the rows of a buffer after the
        convolution's left context (a batch stride other than T * C is not allowed to matter)."""
        from voxflow.kernels.causal_conv import conv1d_channels_last, pack_weight
        from voxflow.kernels.one_channel_conv_cl import conv1d_to_one_channel
        x_ncl, w, bias = case(3, 200, 96, 7, 1, torch.float32, seed=1)
        wide = torch.zeros(3, 210, 104)
        x = wide[:, 4:, :96]                                    # rows 4.. of a wider buffer: strides (21840, 104, 1)
        x.copy_(x_ncl.transpose(1, 2))
        packed = pack_weight(w)
        got = conv1d_to_one_channel(x, packed, bias)
        want = conv1d_channels_last(x, packed, bias)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

    @pytest.mark.parametrize("block_t, warps", [(64, 2), (256, 8)])
    def test_other_launches_compute_the_same(block_t, warps):
        from voxflow.kernels.causal_conv import pack_weight
        from voxflow.kernels.one_channel_conv_cl import conv1d_to_one_channel
        x_ncl, w, bias = case(2, 300, 96, 7, 1, torch.float16, seed=2)
        x = x_ncl.transpose(1, 2).contiguous()
        packed = pack_weight(w)
        assert torch.equal(conv1d_to_one_channel(x, packed, bias, launch=(block_t, warps)),
                           conv1d_to_one_channel(x, packed, bias))
else:
    def test_one_channel_conv_under_the_interpreter():
        run_child(__file__, CHILD_FLAG)


def test_bad_operands_are_refused():
    from voxflow.kernels.one_channel_conv_cl import conv1d_to_one_channel
    x = torch.zeros(2, 20, 8)
    with pytest.raises(ValueError, match="weight_packed"):
        conv1d_to_one_channel(x, torch.zeros(7, 2, 8), None)                  # two output channels
    with pytest.raises(ValueError, match="weight_packed"):
        conv1d_to_one_channel(x, torch.zeros(7, 1, 4), None)                  # Cin differs
    with pytest.raises(ValueError, match="unit channel stride"):
        conv1d_to_one_channel(torch.zeros(2, 8, 20).transpose(1, 2), torch.zeros(7, 1, 8), None)
    with pytest.raises(ValueError, match="bias"):
        conv1d_to_one_channel(x, torch.zeros(7, 1, 8), torch.zeros(2))
    with pytest.raises(ValueError, match="hold no output"):
        conv1d_to_one_channel(torch.zeros(2, 5, 8), torch.zeros(7, 1, 8), None)
    with pytest.raises(ValueError, match="fp32 / bf16 / fp16"):
        conv1d_to_one_channel(x.double(), torch.zeros(7, 1, 8, dtype=torch.float64), None)


def test_channel_slices():
    from voxflow.kernels.one_channel_conv_cl import channel_block
    assert channel_block(96) == (32, True)
    assert channel_block(128) == (64, True)
    assert channel_block(48) == (16, True)
    assert channel_block(40) == (32, False)
