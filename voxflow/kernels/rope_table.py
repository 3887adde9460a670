"""The codec's RoPE tables for one streaming call, and its streams' next positions, in one Triton launch.

A streamed codec call rotates frames start[b] .. start[b] + T - 1 of each stream: PyTorch built the positions (an
arange and an add), their fp32 angles against the inverse frequencies (a conversion, a multiply, a cat of the two
halves) and cos / sin in the activation dtype (two transcendental passes and two casts), then added T to the carried
frame counter: ~12 launches of a few hundred values each, a twentieth of a one-frame call's (counted on a CPU,
benchmarks/scripts/count_codec_launches.py). Here one program per (stream, frame) computes its row of both tables,
and the first frame's program writes the stream's next position.

Numerics: the reference's operations in its order, position and inverse frequency as fp32 (the frequency as the
module holds it, e.g. rounded to fp16 in a half-precision decoder), one fp32 product, cos and sin in fp32, one
rounding to the output dtype. cos / sin are the device's (libdevice) functions: as close as PyTorch's kernels, not
promised bit-equal to them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_table_kernel(start_ptr, inv_freq_ptr, cos_ptr, sin_ptr, next_ptr, next_stride, T, HALF,
                       BLOCK: tl.constexpr):
    row = tl.program_id(0)                                     # b * T + t
    b = row // T
    t = row % T
    start = tl.load(start_ptr + b)
    if t == 0:
        tl.store(next_ptr + b * next_stride, start + T)
    i = tl.arange(0, BLOCK)
    ok = i < HALF
    angle = (start + t).to(tl.float32) * tl.load(inv_freq_ptr + i, mask=ok, other=0.0).to(tl.float32)
    dtype = cos_ptr.dtype.element_ty
    base = row.to(tl.int64) * (2 * HALF)
    c = tl.cos(angle).to(dtype)
    s = tl.sin(angle).to(dtype)
    tl.store(cos_ptr + base + i, c, mask=ok)                   # cat([angles, angles]): both halves the same
    tl.store(cos_ptr + base + HALF + i, c, mask=ok)
    tl.store(sin_ptr + base + i, s, mask=ok)
    tl.store(sin_ptr + base + HALF + i, s, mask=ok)


def supported(start: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> bool:
    return (start.dtype == torch.long and start.dim() == 1 and start.is_contiguous() and inv_freq.dim() == 1
            and inv_freq.is_contiguous() and inv_freq.device == start.device and inv_freq.is_floating_point()
            and dtype in (torch.float32, torch.float16, torch.bfloat16))


def rope_table(start: torch.Tensor, frames: int, inv_freq: torch.Tensor, dtype: torch.dtype,
               next_positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, frames, 2 * len(inv_freq)] in `dtype` for positions start[b] + t (start: LongTensor [B]), as
    `FrameTransformer.rope` makes them; next_positions [B] (int64, any stride, not overlapping start) gets start +
    frames."""
    if not supported(start, inv_freq, dtype):
        raise ValueError(f"start must be a contiguous LongTensor [B] and inv_freq a float [D / 2] on its device, got "
                         f"{start.dtype} {tuple(start.shape)} / {inv_freq.dtype} {tuple(inv_freq.shape)}")
    if (next_positions.shape != start.shape or next_positions.dtype != torch.long
            or next_positions.device != start.device):
        raise ValueError(f"next_positions must be a LongTensor {tuple(start.shape)} on {start.device}")
    if next_positions.untyped_storage().data_ptr() == start.untyped_storage().data_ptr():
        raise ValueError("next_positions must not share memory with start (the frames' programs read it)")
    b, half = start.shape[0], inv_freq.shape[0]
    cos = torch.empty((b, frames, 2 * half), dtype=dtype, device=start.device)
    sin = torch.empty_like(cos)
    if frames == 0:
        next_positions.copy_(start)
    elif b:
        _rope_table_kernel[(b * frames,)](start, inv_freq, cos, sin, next_positions, next_positions.stride(0), frames,
                                          half, BLOCK=triton.next_power_of_2(half), num_warps=1)
    return cos, sin
