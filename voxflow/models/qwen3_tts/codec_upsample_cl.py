"""The codec decoder's upsampling stages (2 x (transposed conv x2 + ConvNeXt) after the frame transformer) over
channels-last rows [B, T, C] on a GPU.

In the decoder's [B, C, T] layout (codec_decoder.CodecDecoder._decode) the stages cost ~0.44 ms of kernels in a
16-stream 25-frame call on an H100's 64 SMs (session 54's profile, kernels #111-137), about half of it layout work:
transposing copies before and after each LayerNorm and MLP, broadcast bias and gain passes, a concatenation for the
depthwise convolution's context, cuDNN's depthwise kernel (~20 us), and the second transposed convolution's GEMM on
a 50-row [C, T] operand whose 100-byte leading dimension sends cuBLAS to a slow unaligned CUTLASS kernel (47 us for
3.4 GFLOP). The frame transformer already works on rows, so here the stages stay in rows:
- the transposed convolution with kernel == stride (no overlap, no state) is one GEMM with its bias: output row t
  holds the stride's phases side by side, [B, T, s * C] being [B, T * s, C] in memory;
- a ConvNeXt block is the depthwise convolution + bias + LayerNorm in one kernel that also writes the next context
  (kernels/dwconv_layer_norm.py), the two linears (cuBLAS, bias in the GEMM), GELU, and the gained residual in one
  addcmul.
The result goes on to the waveform stack as a [B, C, T] view of the rows.

Numerics: PyTorch's rounding points but two: the transposed convolution's bias is added inside the GEMM (one
rounding, not two) and x + gamma * h is rounded once (not gamma * h first): within an ulp of the [B, C, T] path.
On by default on a GPU (VOXFLOW_CODEC_UPSAMPLE_CL=0 turns it off). On an H100: the codec call alone 2-6% faster
(session 57: 16 streams on 64 SMs, 1.83 -> 1.72 ms at 1 frame, 10.49 -> 10.28 at 25); served, 0.6B c=64 over HTTP,
ten alternating runs on two machines in session 58: 765.1 audio-s/s on average (763.5-766.4) against 762.7
(755.1-768.4) without it. Session 57's one pair, 1.3-2.6% slower, came in a call whose host phases the path never
touches were slower too (benchmarks/results/h100/2026-12-07-session58/).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from voxflow.kernels import use_kernels
from voxflow.layers.derived_weights import per_weight_version

from .codec_decoder_blocks import CausalConvTranspose1d, ConvNeXtBlock, StreamTensors, new_value

ENABLED = os.environ.get("VOXFLOW_CODEC_UPSAMPLE_CL", "1") == "1"


def supported(stages: nn.ModuleList, rows: torch.Tensor) -> bool:
    """ENABLED, on CUDA with kernels on, what the channels-last kernels take (causal_conv.supported), and every stage a
    transposed convolution with kernel == stride followed by a ConvNeXt block."""
    from voxflow.kernels.causal_conv import supported as kernels_take     # (dtype, no autograd graph)
    if not (ENABLED and use_kernels(rows) and kernels_take(rows)):
        return False
    return all(len(stage) == 2 and isinstance(stage[0], CausalConvTranspose1d) and stage[0].overlap == 0
               and isinstance(stage[1], ConvNeXtBlock) for stage in stages)


def upsample_rows(stages: nn.ModuleList, rows: torch.Tensor, state: StreamTensors | None) -> torch.Tensor:
    """`for up, block in stages: h = block(up(h, state), state)` on rows [B, T, C] -> rows [B, T * prod(strides), C]
    (contiguous); `state` (None: whole sequences from silence) updated as the [B, C, T] path updates it."""
    for up, block in stages:
        rows = conv_transpose_rows(up, rows)
        rows = convnext_rows(block, rows, state)
    return rows


def conv_transpose_rows(up: CausalConvTranspose1d, rows: torch.Tensor) -> torch.Tensor:
    """A transposed convolution with kernel == stride on rows [B, T, Cin] -> [B, T * s, Cout]: one GEMM with the
    weight [Cin, Cout, s] as [Cin, s * Cout] (column j * Cout + c: phase j of channel c) and the bias tiled s times."""
    weight, bias, s = up.conv.weight, up.conv.bias, up.stride
    if up.overlap:
        raise ValueError("conv_transpose_rows takes kernel == stride only (no spill between calls)")
    b, t, cin = rows.shape
    cout = weight.shape[1]
    params = (weight,) if bias is None else (weight, bias)

    def derive():
        packed = weight.permute(0, 2, 1).reshape(cin, s * cout).contiguous()
        return packed, (bias.repeat(s) if bias is not None else None)
    packed, tiled = per_weight_version(up, params, derive, tag="rows")
    flat = rows.reshape(b * t, cin)
    y = torch.mm(flat, packed) if tiled is None else torch.addmm(tiled, flat, packed)
    return y.view(b, t * s, cout)


def convnext_rows(block: ConvNeXtBlock, rows: torch.Tensor, state: StreamTensors | None) -> torch.Tensor:
    """ConvNeXtBlock.forward on rows [B, T, C] -> rows; the depthwise convolution's context read from and written
    to state[block.dwconv.state_key] ([B, C, K - 1]; zeros and not kept without a state)."""
    from voxflow.kernels.dwconv_layer_norm import dwconv_layer_norm
    dw, norm = block.dwconv, block.norm
    b, _, c = rows.shape
    if state is None:
        ctx = rows.new_zeros((b, c, dw.context))
        new_ctx = torch.empty_like(ctx)
    else:
        ctx = state[dw.state_key]                   # (contiguous, or a pool row's view: unit time stride)
        new_ctx = new_value(state, dw.state_key, ctx)
    normed = dwconv_layer_norm(rows, ctx, dw.conv.weight, dw.conv.bias, norm.weight, norm.bias, norm.eps, new_ctx)
    h = F.linear(F.gelu(F.linear(normed, block.pwconv1.weight, block.pwconv1.bias)), block.pwconv2.weight,
                 block.pwconv2.bias)
    return torch.addcmul(rows, h, block.gamma)
