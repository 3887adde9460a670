"""Rotary position embedding for q and k in one Triton kernel (out of place), bit-exact with the reference.

The reference `apply_rotary` (voxflow/layers/rotary.py) is `q * cos + rotate_half(q) * sin` (and the same for k):
about ten kernels (cat, neg, slices, three multiplies/adds each). Rope is element-wise, so the kernel can keep
the reference's exact rounding: each product rounded to the activation dtype, then the sum rounded again, with
no fma contraction. In fp32, bf16 and fp16 the outputs are then equal bit-for-bit (tests assert `torch.equal`;
all three under the CPU interpreter, fp32 and bf16 also on an H200 at the real shapes).

Layout: one program per (batch, position) loads that position's cos/sin row once and rotates all q heads, then
all k heads. Inputs may be strided along batch, head and position (the layer's q/k are `.transpose(1, 2)`
views of [B, S, H, D]); the head dim must be unit-stride (else it is copied). Outputs keep q's and k's layout,
as the reference's element-wise ops do.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels.rms_norm import round_to

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, b, s, n_heads, src_sb, src_sh, src_ss, dst_sb, dst_sh, dst_ss,
                  c1, c2, s1, s2, d, d_mask, half, BLOCK_H: tl.constexpr):
    """Rotate heads [0, n_heads) of token (b, s). c1/s1: cos/sin of the first half of D, c2/s2: of the second."""
    dtype = src_ptr.dtype.element_ty
    heads = tl.arange(0, BLOCK_H)
    for h0 in range(0, n_heads, BLOCK_H):
        h = h0 + heads
        mask = (h < n_heads)[:, None] & d_mask[None, :]
        src = src_ptr + b * src_sb + s * src_ss + h[:, None].to(tl.int64) * src_sh + d[None, :]
        dst = dst_ptr + b * dst_sb + s * dst_ss + h[:, None].to(tl.int64) * dst_sh + d[None, :]
        x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
        # rotate_half(x) = cat(-x2, x1); each product and the sum rounded as torch rounds them.
        o1 = round_to(round_to(x1 * c1, dtype) + round_to(-x2 * s1, dtype), dtype)
        o2 = round_to(round_to(x2 * c2, dtype) + round_to(x1 * s2, dtype), dtype)
        tl.store(dst, o1.to(dtype), mask=mask)
        tl.store(dst + half, o2.to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
                   seq_len, n_q_heads, n_k_heads, half,
                   q_sb, q_sh, q_ss, k_sb, k_sh, k_ss,
                   qo_sb, qo_sh, qo_ss, ko_sb, ko_sh, ko_ss,
                   cos_sb, cos_ss, sin_sb, sin_ss,
                   BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // seq_len).to(tl.int64)
    s = (pid % seq_len).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    d_mask = d < half
    cos_row = cos_ptr + b * cos_sb + s * cos_ss + d
    sin_row = sin_ptr + b * sin_sb + s * sin_ss + d
    c1 = tl.load(cos_row, mask=d_mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_row + half, mask=d_mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_row, mask=d_mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_row + half, mask=d_mask, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, qo_ptr, b, s, n_q_heads, q_sb, q_sh, q_ss, qo_sb, qo_sh, qo_ss,
                  c1, c2, s1, s2, d, d_mask, half, BLOCK_H)
    _rotate_heads(k_ptr, ko_ptr, b, s, n_k_heads, k_sb, k_sh, k_ss, ko_sb, ko_sh, ko_ss,
                  c1, c2, s1, s2, d, d_mask, half, BLOCK_H)


def supported(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the kernel computes exactly what the reference would (else: use the reference).

    One dtype for all four (the reference would promote mixed ones), q [B, Hq, S, D], k [B, Hkv, S, D] and
    cos/sin [B or 1, S, D] on one device, D even, and no autograd graph to record.
    """
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return False
    b, _, s, d = q.shape
    if d % 2 or k.shape[0] != b or k.shape[2:] != (s, d) or cos.shape[1:] != (s, d) or cos.shape[0] not in (1, b):
        return False
    if q.dtype not in _DTYPES or any(t.dtype != q.dtype or t.device != q.device for t in (k, cos, sin)):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, cos, sin)))


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, Hq, S, D], k [B, Hkv, S, D], cos/sin [B, S, D] -> rotated (q, k), new tensors in q's/k's layout."""
    q, k = _unit_last(q), _unit_last(k)
    b, n_q, s, d = q.shape
    n_k = k.shape[1]
    cos = _unit_last(cos.expand(b, s, d))      # a batch-1 table broadcasts via a zero batch stride
    sin = _unit_last(sin.expand(b, s, d))
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if q.numel() == 0 and k.numel() == 0:
        return q_out, k_out
    half = d // 2
    block_half = triton.next_power_of_2(half)
    # Heads per loop step: a [BLOCK_H, D/2] tile per half, ~2k elements at head_dim 128.
    block_h = max(1, min(triton.next_power_of_2(max(n_q, n_k)), max(1, 2048 // block_half)))
    _rotary_kernel[(b * s,)](
        q, k, cos, sin, q_out, k_out,
        s, n_q, n_k, half,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        BLOCK_H=block_h, BLOCK_HALF=block_half, num_warps=4,
        enable_fp_fusion=False)   # the reference rounds each product before the add
    return q_out, k_out
