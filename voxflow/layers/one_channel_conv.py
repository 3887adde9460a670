"""A 1-D convolution with ONE output channel (the codec decoder's last layer, 96 channels -> the waveform, k=7) as a
matrix multiply plus k shifted adds.

Why: for bf16 inputs cuDNN picks a generic kernel for this shape (`implicit_convolve_sgemm`: 18 ms of an 88 ms
64 x 25-frame codec call on an H200, benchmarks/results/h200/2026-12-01-session4/codec_run4.txt) although the layer
is ~2 GFLOP. Z = x^T W (one GEMM, N = k) gives each input sample's contribution to each tap; output sample t is
sum_j Z[t + j*dilation, j]. The k-term sum runs in fp32.
"""
from __future__ import annotations

import torch


def one_channel_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int = 1
                       ) -> torch.Tensor:
    """x [B, Cin, T + (k-1)*dilation] (already left-padded), weight [1, Cin, k], bias [1] -> [B, 1, T] (valid conv)."""
    b, cin, total = x.shape
    if weight.dim() != 3 or weight.shape[0] != 1 or weight.shape[1] != cin:
        raise ValueError(f"expected a [1, {cin}, k] weight, got {tuple(weight.shape)}")
    k = weight.shape[2]
    t = total - (k - 1) * dilation
    z = torch.matmul(x.transpose(1, 2), weight[0])                    # [B, T_in, k]
    if z.dtype in (torch.bfloat16, torch.float16):
        z = z.float()
    y = z[:, 0:t, 0].clone()
    for j in range(1, k):
        y += z[:, j * dilation: j * dilation + t, j]
    if bias is not None:
        y += bias.to(y.dtype)
    return y.to(x.dtype)[:, None]
