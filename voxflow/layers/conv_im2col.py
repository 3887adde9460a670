"""A small 1-D convolution (groups = 1) as one GEMM over its unfolded input (im2col).

Why: for some shapes cuDNN picks a generic kernel. On an H200 the codec decoder's 1024 -> 1536, k=7 convolution at
the 50 Hz frame rate took 17.8 ms of a 71 ms 64 x 25-frame bf16 codec call in `implicit_convolve_sgemm` (~8 TFLOP/s;
benchmarks/results/h200/2026-12-01-session4/codec_run5_after_fusions.txt). At these low rates the unfolded input
(k copies of the activation) is small, and one GEMM over it runs on cuBLAS's tensor-core kernels. Callers use it
only while the unfolded input stays small (`fits`); the high-rate layers keep cuDNN.

Precision: the GEMM takes PyTorch's matmul TF32 switch as it stands; the codec decoder, its only user, sets it to
cuDNN's for its whole call (CodecDecoder.forward), so fp32 inputs multiply in TF32 exactly as the cuDNN kernel did.
"""
from __future__ import annotations

import torch

MAX_UNFOLDED = 1 << 26          # elements of the unfolded input (128 MB in bf16)


def fits(x: torch.Tensor, kernel_size: int) -> bool:
    return x.shape[0] * x.shape[1] * x.shape[2] * kernel_size <= MAX_UNFOLDED


def conv1d_im2col(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int = 1
                  ) -> torch.Tensor:
    """x [B, Cin, T + (k-1)*dilation] (already padded), weight [Cout, Cin, k], bias [Cout] -> [B, Cout, T] (valid)."""
    b, cin, total = x.shape
    cout, wcin, k = weight.shape
    if wcin != cin:
        raise ValueError(f"weight has {wcin} input channels, x has {cin}")
    span = (k - 1) * dilation + 1
    t = total - span + 1
    cols = x.unfold(2, span, 1)[..., ::dilation]                     # [B, Cin, T, k] (a view)
    cols = cols.permute(0, 2, 1, 3).reshape(b * t, cin * k)          # the one copy: [B*T, Cin*k]
    out = torch.matmul(cols, weight.reshape(cout, cin * k).t())      # [B*T, Cout]
    if bias is not None:
        out += bias
    return out.view(b, t, cout).transpose(1, 2).contiguous()
