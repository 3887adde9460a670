"""Per-head RMSNorm of q and k followed by RoPE, both tensors, in one Triton kernel (out of place).

Why: Qwen3 attention normalises q and k per head (q_norm / k_norm over head_dim) and then rotates them. With the
per-op kernels that is three launches (rms_norm(q), rms_norm(k), rotary(q, k)) and two round trips of q and k
through memory; the plain torch path is ~30 kernels. The decoder layer runs 28x per talker frame and 75x per
code-predictor frame, inside CUDA graphs where each launch still costs 2-3 us, so this is one launch instead.

Numerics are the reference's, step by step (voxflow/layers/rms_norm.py, then voxflow/layers/rotary.py), with
every intermediate rounded to the activation dtype where torch would store it:
  y  = round(x * rsqrt(mean(x^2) + eps))       fp32 statistics, cast to the input dtype *before* the weight
  n  = round(y * w)                             the weight multiply in the activation dtype
  o1 = round(round(n1 * cos1) + round(-n2 * sin1))    rotate_half: [n1, n2] -> [-n2, n1]
  o2 = round(round(n2 * cos2) + round(n1 * sin2))
with fma contraction off. The one freedom left is the order of the fp32 sum of squares (a tree over the two
half-rows here, torch's vectorised order there), which can move the mean of squares by an ulp or two, exactly as
for the per-op RMSNorm kernel. Measured under the CPU interpreter against the torch reference (8x16 tokens x 24
heads, head dims 128/16/8, random data): bf16 bit-exact; fp32 70-87% bit-equal, max |diff| 2.7 eps of the head
row's largest |value|. (In fp32 a per-element ulp count is meaningless here: the rope sum can cancel to near zero,
where an ulp of its operands is hundreds of ulp of the result.) The tests (tests/test_kernel_qk_norm_rope.py,
tests/gpu/test_gpu_qk_norm_rope.py) allow bf16 >= 99% bit-equal and <= 1 eps of the row max, fp32 <= 8 eps.
Not yet measured on a GPU.

Layout: q [B, S, Hq, D] and k [B, S, Hkv, D] are the projections viewed per head (before the layer's
`.transpose(1, 2)`), with any strides along batch, position and head (e.g. slices of a fused qkv projection);
the head dim must be unit-stride (else it is copied). Outputs are new contiguous [B, S, H, D] tensors, so their
`.transpose(1, 2)` is the [B, H, S, D] view the layer has always passed on (the reference's norm returns
contiguous [B, S, H, D] and rope keeps that layout). The grid is (B*S tokens) x (head blocks of q, then of k):
each program loads its token's cos/sin row and its norm weight once and handles BLOCK_H heads as two
[BLOCK_H, D/2] half tiles, which is all rotate-half needs (no in-register permutation). At B=1 decode the three
programs (16 q heads + 8 k heads, 8 per block, D=128) spread over three SMs instead of queueing on one.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels import use_pdl
from voxflow.kernels.pdl import launch_kwargs, trigger_mode, wait_for_previous_kernel
from voxflow.kernels.rms_norm import MAX_ROW_FACTOR_WIDTH, round_to, row_factor

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MAX_HEAD_DIM = 1024          # a head row (two half tiles) sits in registers; wider stays on the reference
_TILE = 1024                  # elements per program per half tile at most: 8 heads x 64 at head_dim 128


@triton.jit
def rope_halves(cos_row, sin_row, d, d_mask, half):
    """One position's rotary row as rotate-half takes it: cos[:half], cos[half:], sin[:half], sin[half:], each
    [1, BLOCK_HALF] fp32 (masked lanes 0). cos_row / sin_row: pointers to the row's first element plus d."""
    c1 = tl.load(cos_row, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_row + half, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_row, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_row + half, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    return c1, c2, s1, s2


@triton.jit
def _norm_rope_heads(src_ptr, dst_ptr, w_ptr, b, s, h0, n_heads, src_sb, src_ss, src_sh, dst_sb, dst_ss, dst_sh,
                     c1, c2, s1, s2, d, d_mask, half, inv_d, eps, BLOCK_H: tl.constexpr, row_scale=1.0,
                     ROW_SCALE: tl.constexpr = False):
    """Heads [h0, h0 + BLOCK_H) of token (b, s): RMSNorm over the head dim, weight, then rotate-half RoPE.
    ROW_SCALE: the raw projection is first multiplied by `row_scale` (fp32) and rounded to the activation dtype --
    the token's input RMSNorm when it was folded into the projection weight (voxflow/layers/folded_norms.py)."""
    dtype = src_ptr.dtype.element_ty
    h = h0 + tl.arange(0, BLOCK_H)
    mask = (h < n_heads)[:, None] & d_mask[None, :]
    src = src_ptr + b * src_sb + s * src_ss + h[:, None].to(tl.int64) * src_sh + d[None, :]
    dst = dst_ptr + b * dst_sb + s * dst_ss + h[:, None].to(tl.int64) * dst_sh + d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    if ROW_SCALE:
        x1 = round_to(x1 * row_scale, dtype)
        x2 = round_to(x2 * row_scale, dtype)
    # RMSNorm: fp32 statistics over the whole head (both halves; masked lanes add 0), mean as sum * fl(1/D)
    # like torch's CUDA mean; the normalised value is rounded to the activation dtype before the weight.
    mean_sq = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) * inv_d
    rstd = tl.math.rsqrt(mean_sq + eps)[:, None]
    w1 = tl.load(w_ptr + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(w_ptr + half + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    n1 = round_to(round_to(x1 * rstd, dtype) * w1, dtype)
    n2 = round_to(round_to(x2 * rstd, dtype) * w2, dtype)
    # RoPE: rotate_half(n) = cat(-n2, n1); each product and the sum rounded as torch rounds them.
    o1 = round_to(round_to(n1 * c1, dtype) + round_to(-n2 * s1, dtype), dtype)
    o2 = round_to(round_to(n2 * c2, dtype) + round_to(n1 * s2, dtype), dtype)
    tl.store(dst, o1.to(dtype), mask=mask)
    tl.store(dst + half, o2.to(dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
                         seq_len, n_q_heads, n_k_heads, n_q_blocks, half, inv_d, q_eps, k_eps,
                         q_sb, q_ss, q_sh, k_sb, k_ss, k_sh,
                         qo_sb, qo_ss, qo_sh, ko_sb, ko_ss, ko_sh,
                         cos_sb, cos_ss, sin_sb, sin_ss,
                         x_ptr, v_ptr, vo_ptr, sx_t, hidden, inv_h, x_eps, n_k_blocks,
                         v_sb, v_ss, v_sh, vo_sb, vo_ss, vo_sh,
                         BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, USE_PDL: tl.constexpr,
                         FOLDED: tl.constexpr, BLOCK_X: tl.constexpr):
    if USE_PDL:                 # pdl.py: nothing read before the previous kernel's results are visible
        wait_for_previous_kernel(USE_PDL)
    token = tl.program_id(0)
    block = tl.program_id(1)
    b = (token // seq_len).to(tl.int64)
    s = (token % seq_len).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    d_mask = d < half
    if FOLDED:
        # The token's input RMSNorm was folded into the q|k|v weight (voxflow/layers/folded_norms.py): its row
        # factor from the layer input row x (fp32 statistics, as the reference norm) scales the raw projections.
        r = row_factor(x_ptr + token.to(tl.int64) * sx_t, hidden, inv_h, x_eps, BLOCK_X)
    else:
        r = 1.0
    c1, c2, s1, s2 = rope_halves(cos_ptr + b * cos_sb + s * cos_ss + d, sin_ptr + b * sin_sb + s * sin_ss + d, d,
                                 d_mask, half)
    if block < n_q_blocks:
        _norm_rope_heads(q_ptr, qo_ptr, qw_ptr, b, s, block * BLOCK_H, n_q_heads,
                         q_sb, q_ss, q_sh, qo_sb, qo_ss, qo_sh,
                         c1, c2, s1, s2, d, d_mask, half, inv_d, q_eps, BLOCK_H, r, FOLDED)
    elif block < n_q_blocks + n_k_blocks:
        _norm_rope_heads(k_ptr, ko_ptr, kw_ptr, b, s, (block - n_q_blocks) * BLOCK_H, n_k_heads,
                         k_sb, k_ss, k_sh, ko_sb, ko_ss, ko_sh,
                         c1, c2, s1, s2, d, d_mask, half, inv_d, k_eps, BLOCK_H, r, FOLDED)
    else:
        if FOLDED:      # (only launched with it: the grid has value blocks then)
            # value heads: only the factor (no norm, no rotation), rounded as a projection output
            h = (block - n_q_blocks - n_k_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)
            mask = (h < n_k_heads)[:, None] & d_mask[None, :]
            src = v_ptr + b * v_sb + s * v_ss + h[:, None].to(tl.int64) * v_sh + d[None, :]
            dst = vo_ptr + b * vo_sb + s * vo_ss + h[:, None].to(tl.int64) * vo_sh + d[None, :]
            vdt = v_ptr.dtype.element_ty
            v1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
            v2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
            tl.store(dst, round_to(v1 * r, vdt).to(vdt), mask=mask)
            tl.store(dst + half, round_to(v2 * r, vdt).to(vdt), mask=mask)


def supported(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
              cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the kernel computes what the reference would for these inputs (else: use the reference).

    q [B, S, Hq, D], k [B, S, Hkv, D], weights [D], cos/sin [B or 1, S, D]; D even and at most 1024; one dtype
    for all six (the reference would promote mixed ones, e.g. an fp32 norm weight gives fp32 q), one device, and
    no autograd graph to record (the kernel has no backward).
    """
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return False
    b, s, _, d = q.shape
    if d % 2 or d > _MAX_HEAD_DIM or k.shape[:2] != (b, s) or k.shape[3] != d:
        return False
    if q_weight.shape != (d,) or k_weight.shape != (d,) or cos.shape[1:] != (s, d) or cos.shape[0] not in (1, b):
        return False
    tensors = (q, k, q_weight, k_weight, cos, sin)
    if q.dtype not in _DTYPES or any(t.dtype != q.dtype or t.device != q.device for t in tensors):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def supported_folded(x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """`folded=` inputs: x [B * S, H <= MAX_ROW_FACTOR_WIDTH] rows with a unit last stride, v shaped as k; one dtype
    and device with q."""
    b, s = q.shape[:2]
    return (x.dim() == 2 and x.shape[0] == b * s and 1 <= x.shape[1] <= MAX_ROW_FACTOR_WIDTH and x.stride(-1) == 1
            and v.shape == k.shape and all(t.dtype == q.dtype and t.device == q.device for t in (x, v)))


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, q_eps: float, k_eps: float,
                 folded: tuple[torch.Tensor, float, torch.Tensor] | None = None):
    """q [B, S, Hq, D], k [B, S, Hkv, D] (any strides, unit-stride D preferred) -> new contiguous (q, k) of the
    same shapes: rope(rms_norm(q, q_weight)), rope(rms_norm(k, k_weight)); cos/sin [B or 1, S, D].

    folded (x [B * S, H], eps, v [B, S, Hkv, D]): q, k and v are projections of the rows x through a weight with
    the layer's input RMSNorm folded in (voxflow/layers/folded_norms.py); each is first scaled by its row's
    rsqrt(mean(x^2) + eps) and rounded to q's dtype, and the scaled v comes back too: (q, k, v)."""
    q, k = _unit_last(q), _unit_last(k)
    b, s, n_q, d = q.shape
    n_k = k.shape[2]
    if folded is not None:
        x, x_eps, v = folded
        if not supported_folded(x, q, k, v):
            raise ValueError(f"folded rows {tuple(x.shape)} / v {tuple(v.shape)} do not fit q {tuple(q.shape)}")
        v = _unit_last(v)
        v_out = torch.empty((b, s, n_k, d), dtype=v.dtype, device=v.device)
    cos = _unit_last(cos.expand(b, s, d))      # a batch-1 table broadcasts via a zero batch stride
    sin = _unit_last(sin.expand(b, s, d))
    q_out = torch.empty((b, s, n_q, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((b, s, n_k, d), dtype=k.dtype, device=k.device)
    if b * s == 0 or (n_q == 0 and n_k == 0):
        return (q_out, k_out) if folded is None else (q_out, k_out, v_out)
    half = d // 2
    block_half = triton.next_power_of_2(half)
    block_h = max(1, min(triton.next_power_of_2(max(n_q, n_k)), _TILE // block_half))
    n_q_blocks, n_k_blocks = triton.cdiv(n_q, block_h), triton.cdiv(n_k, block_h)
    n_blocks = n_q_blocks + n_k_blocks * (1 if folded is None else 2)
    if folded is not None:
        folded_args = (x, v, v_out, x.stride(0), x.shape[1], 1.0 / x.shape[1], float(x_eps), n_k_blocks,
                       v.stride(0), v.stride(1), v.stride(2), v_out.stride(0), v_out.stride(1), v_out.stride(2))
    else:
        folded_args = (q, q, q, 0, 1, 1.0, 0.0, n_k_blocks, 0, 0, 0, 0, 0, 0)     # unused (FOLDED compiled out)
    # Two [8, 64] fp32 half tiles at head_dim 128: four warps keep every lane busy without spilling.
    num_warps = 4 if block_h * block_half >= 512 else 1
    pdl = use_pdl(q)
    _qk_norm_rope_kernel[(b * s, n_blocks)](
        q, k, q_weight.contiguous(), k_weight.contiguous(), cos, sin, q_out, k_out,
        s, n_q, n_k, n_q_blocks, half, 1.0 / d, float(q_eps), float(k_eps),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1), *folded_args,
        BLOCK_H=block_h, BLOCK_HALF=block_half, USE_PDL=trigger_mode(pdl, "qk_norm_rope"), FOLDED=folded is not None,
        BLOCK_X=triton.next_power_of_2(folded_args[4]), num_warps=num_warps,
        enable_fp_fusion=False,   # no fma contraction: the reference rounds every product before the add
        **launch_kwargs(pdl))
    return (q_out, k_out) if folded is None else (q_out, k_out, v_out)


def qk_norm_rope_reference(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                           cos: torch.Tensor, sin: torch.Tensor, q_eps: float, k_eps: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """What Qwen3Attention computed before the fusion, from the same layer functions, in the kernel's layout.

    These functions dispatch to the per-op kernels on CUDA when the switch is on; turn it off
    (`voxflow.kernels.set_kernels_enabled(False)`) for the plain torch numbers.
    """
    from voxflow.layers.rms_norm import rms_norm
    from voxflow.layers.rotary import apply_rotary
    q = rms_norm(q, q_weight, q_eps).transpose(1, 2)
    k = rms_norm(k, k_weight, k_eps).transpose(1, 2)
    q, k = apply_rotary(q, k, cos, sin)
    return q.transpose(1, 2), k.transpose(1, 2)
