"""A 1-D transposed convolution with stride s and kernel k <= 2s, as ONE matrix multiply plus an overlap-add.

Why: cuDNN runs the codec decoder's upsampling transposed convolutions as "dgrad" kernels that reach ~24 TFLOP/s
on an H200 (a 1536 -> 768, k=16, s=8 layer over 64 streams x 25 frames: 10 ms, a tenth of the codec call;
benchmarks/results/h200/2026-12-01-session4/codec_run4.txt), while the same arithmetic as a GEMM runs on cuBLAS's
tensor-core kernels.

Input sample t contributes W[:, :, j] x[t] to output sample t*s + j for j < k. So G = x^T W (one GEMM,
[B*T, Cin] x [Cin, Cout*k]) holds every contribution; output sample t*s + j is G[t, :, j] plus, for j < k - s, the
spill G[t-1, :, s + j] of the previous input sample. The spill of the last sample is the streaming tail the next
call adds to its first samples (`tail`, what `CausalConvTranspose1d` keeps in its state).

Precision: the GEMM takes PyTorch's matmul TF32 switch as it stands; the codec decoder sets it to cuDNN's
(`torch.backends.cudnn.allow_tf32`, PyTorch's default: on) for its whole call with `conv_gemm_precision`
(CodecDecoder.forward), the same precision class as the cuDNN kernel this replaces; the GPU test holds it to the
plain path.
"""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def matmul_tf32(allowed: bool):
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def conv_gemm_precision():
    """Matrix multiplies (convolutions computed as GEMMs, and the codec's linears) in TF32 exactly when cuDNN's
    convolutions may (see Precision)."""
    return matmul_tf32(torch.backends.cudnn.allow_tf32)


def conv_transpose_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int,
                        tail: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, Cin, T], weight [Cin, Cout, k] with stride <= k <= 2 * stride, bias [Cout] or None, tail [B, Cout, k - s]
    (the previous call's spill; None: none, as at a sequence start) -> (y [B, Cout, T * s] with the bias, the new tail
    [B, Cout, k - s] without it)."""
    b, cin, t = x.shape
    cout, k = weight.shape[1], weight.shape[2]
    overlap = k - stride
    if not 0 <= overlap <= stride:
        raise ValueError(f"needs stride <= kernel <= 2 * stride, got kernel {k}, stride {stride}")
    g = torch.matmul(x.transpose(1, 2), weight.reshape(cin, cout * k)).view(b, t, cout, k)
    g = g.permute(0, 2, 1, 3)                                   # [B, Cout, T, k] (a view)
    y = torch.empty(b, cout, t, stride, dtype=x.dtype, device=x.device)
    if bias is None:
        y.copy_(g[..., :stride])
    else:
        torch.add(g[..., :stride], bias[:, None, None], out=y)
    if overlap:
        y[:, :, 1:, :overlap] += g[:, :, :-1, stride:]
        if tail is not None:
            y[:, :, 0, :overlap] += tail
    new_tail = g[:, :, -1, stride:].contiguous()
    return y.view(b, cout, t * stride), new_tail
