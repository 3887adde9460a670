"""A code-predictor decode step's whole attention core in one Triton kernel: per-head q/k RMSNorm, RoPE, the
append of the new key/value to the preallocated cache, and single-query attention over the cache.

Before, each of the 75 code-predictor layer steps of a frame launched two kernels for this (qk_norm_rope.py, then
dense_decode_attention.py's append variant), ~3 us each on an H200 at batch 1. Here one program per (row, KV
head) runs the same two computations back to back: it normalises and rotates its group's query heads into a small
scratch buffer and the new key straight into cache position T (the shared `_norm_rope_heads`, so the bits are
qk_norm_rope's), copies the new value, and after a block barrier attends over positions [0, T] exactly as the
dense kernel does (`_attend_cached`). The KV heads of a row are disjoint, so no program reads what another writes.

There is no form keeping the normed query and the new key / value in registers (no barrier, no read-back):
session 41 (H100) measured it slower: 0.6B c=64 full steps 5.82-5.83 ms against 5.75-5.79 with the barrier form,
1.7B c=64 6.56 against 6.47; its code is in commit 23949d1.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from voxflow.kernels import use_pdl
from voxflow.kernels.dense_decode_attention import _attend_cached
from voxflow.kernels.dense_decode_attention import supported as attention_supported
from voxflow.kernels.qk_norm_rope import _norm_rope_heads, rope_halves
from voxflow.kernels.pdl import launch_kwargs, wait_for_previous_kernel
from voxflow.kernels.qk_norm_rope import supported as norm_rope_supported
from voxflow.kernels.rms_norm import MAX_ROW_FACTOR_WIDTH, round_to, row_factor


NUM_WARPS = 4      # Triton's default; benchmarks/scripts/tune_cp_attention.py times others
# One warp a program from this many rows on (0: NUM_WARPS at every size). H200, bf16 (benchmarks/results/h200/
# 2026-12-02-session13, call 4): 256 rows 22.2 -> 10.4 us a call, 64 rows 8.7 -> 7.2; at 1-16 rows 4 warps are
# the fastest. Another warp count sums the norms in another order, so the bf16 bits of the normed query / key may
# differ by one ulp from the 4-warp kernel's (both round the same fp32 norm). Served (session 14, call 1): step
# c=64 9.09 -> 8.97 ms, c=256 20.47 -> 19.73; HTTP c=64 479.0 audio-s/s. VOXFLOW_CP_ATTENTION_ONE_WARP_ROWS=0: off.
ONE_WARP_FROM_ROWS = int(os.environ.get("VOXFLOW_CP_ATTENTION_ONE_WARP_ROWS", "64"))


def launch_warps(rows: int) -> int:
    """num_warps for a call over `rows` rows (ONE_WARP_FROM_ROWS, else NUM_WARPS)."""
    return 1 if ONE_WARP_FROM_ROWS and rows >= ONE_WARP_FROM_ROWS else NUM_WARPS


@triton.jit
def _norm_rope_attend_kernel(qr_ptr, kr_ptr, vr_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qs_ptr, k_ptr, v_ptr, out_ptr,
                             T, T1, scale, half, inv_d, q_eps, k_eps,
                             sqr_b, sqr_s, sqr_h, skr_b, skr_s, skr_h, svr_b, svr_s, svr_h, cos_sb, cos_ss, sin_sb,
                             sin_ss, sqs_b, sqs_s, sqs_h, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_b, so_s, so_h,
                             x_ptr, sx_b, sx_s, hidden, inv_h, x_eps,
                             GROUPS: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK_HALF: tl.constexpr,
                             BLOCK_T: tl.constexpr, USE_PDL: tl.constexpr, FOLDED: tl.constexpr,
                             BLOCK_X: tl.constexpr, NEW: tl.constexpr):
    # (T1 = T + 1, passed in: a loop bound computed in the kernel from runtime values trips Triton 3.6's
    # interpreter; T1 + s below adds a constexpr, which it takes)
    if USE_PDL:                 # pdl.py: nothing read before the previous kernel's results are visible
        wait_for_previous_kernel(USE_PDL)
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    dh = tl.arange(0, BLOCK_HALF)
    dh_mask = dh < half
    h0 = kvh * GROUPS
    d = tl.arange(0, D)
    # 1. the NEW tokens (s = 0 .. NEW - 1, at cache positions T + s): q heads of the group -> scratch, k -> the
    #    cache (normed, rotated), v -> the cache
    for s in tl.static_range(NEW):
        c1, c2, s1, s2 = rope_halves(cos_ptr + b * cos_sb + s * cos_ss + dh, sin_ptr + b * sin_sb + s * sin_ss + dh,
                                     dh, dh_mask, half)
        if FOLDED:
            # The layer's input RMSNorm was folded into the q|k|v weight (voxflow/layers/folded_norms.py): its row
            # factor rsqrt(mean(x^2) + eps), fp32 statistics of the layer input row as the reference norm takes
            # them, scales the raw projections here.
            r = row_factor(x_ptr + b * sx_b + s * sx_s, hidden, inv_h, x_eps, BLOCK_X)
        else:
            r = 1.0
        _norm_rope_heads(qr_ptr, qs_ptr, qw_ptr, b, s, h0, h0 + GROUPS, sqr_b, sqr_s, sqr_h, sqs_b, sqs_s, sqs_h,
                         c1, c2, s1, s2, dh, dh_mask, half, inv_d, q_eps, GP, r, FOLDED)
        # (the cache's position stride as the token stride: token s lands at position T + s)
        _norm_rope_heads(kr_ptr, k_ptr + T * sk_t, kw_ptr, b, s, kvh, kvh + 1, skr_b, skr_s, skr_h, sk_b, sk_t, sk_h,
                         c1, c2, s1, s2, dh, dh_mask, half, inv_d, k_eps, 2, r, FOLDED)
        vn = tl.load(vr_ptr + b * svr_b + s * svr_s + kvh * svr_h + d)
        if FOLDED:
            vdt = vr_ptr.dtype.element_ty
            vn = round_to(vn.to(tl.float32) * r, vdt).to(vdt)
        tl.store(v_ptr + b * sv_b + kvh * sv_h + (T + s) * sv_t + d, vn)
    tl.debug_barrier()          # the stores above are read back below by other threads of this program
    # 2. token s attends over positions [0, T + s] (causal among the new ones) with its normed, rotated queries
    g = tl.arange(0, GP)
    gmask = g < GROUPS
    heads = h0 + g
    for s in tl.static_range(NEW):
        q = tl.load(qs_ptr + b * sqs_b + s * sqs_s + heads[:, None] * sqs_h + d[None, :], mask=gmask[:, None],
                    other=0.0)
        m, l, acc = _attend_cached(q.to(tl.float32), k_ptr, v_ptr, b, kvh, T1 + s, scale, sk_b, sk_h, sk_t,
                                   sv_b, sv_h, sv_t, GP, D, BLOCK_T)
        out = acc / l[:, None]
        tl.store(out_ptr + b * so_b + s * so_s + heads[:, None] * so_h + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=gmask[:, None])


# At most this many new tokens a call: the code predictor's 2-token first step (positions 0 and 1) takes 2; the
# kernel unrolls its per-token loops.
MAX_NEW = 4


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
              cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Raw projections q [B, S, Hq, D], k / v [B, S, Hkv, D] (per-head views; 1 <= S <= MAX_NEW new tokens), norm
    weights [D], cos / sin [1 or B, S, D]: where both fused kernels it stands for would run (unit-stride head
    dim)."""
    if not norm_rope_supported(q, k, q_weight, k_weight, cos, sin):
        return False
    if not 1 <= q.shape[1] <= MAX_NEW or v.shape != k.shape or v.dtype != q.dtype:
        return False
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return False
    return attention_supported(q[:, :1].transpose(1, 2), k[:, :1].transpose(1, 2))


def supported_folded(x: torch.Tensor, q: torch.Tensor) -> bool:
    """Rows x [B * S, H] for `folded_norm` (row b * S + s is token s of row b): q's dtype and device, a unit last
    stride, H <= 4096 (rms_norm.py's MAX_ROW_FACTOR_WIDTH)."""
    return (x.dim() == 2 and x.shape[0] == q.shape[0] * q.shape[1] and x.dtype == q.dtype and x.device == q.device
            and x.stride(-1) == 1 and 1 <= x.shape[1] <= MAX_ROW_FACTOR_WIDTH)


def norm_rope_attend_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                            k_weight: torch.Tensor, q_eps: float, k_eps: float, cos: torch.Tensor, sin: torch.Tensor,
                            k_cache: torch.Tensor, v_cache: torch.Tensor, length: int, scale: float,
                            num_warps: int | None = None, query_scratch: torch.Tensor | None = None,
                            folded_norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
    """S new tokens a row (q [B, S, Hq, D], k / v [B, S, Hkv, D]): token s attends with rope(norm(q_s)) over
    cache[:length] + [rope(norm(k_0)), ..., rope(norm(k_s))] (values likewise) -> [B, S, Hq, D] -- the causal
    S-token step; the new keys / values are written at cache positions length .. length + S - 1 (k_cache /
    v_cache [B, Hkv, >= length + S, D]). S = 1 is a decode step.
    num_warps: Triton's launch option (None: `launch_warps`). query_scratch: a contiguous tensor of q's dtype,
    [B, Hq, D] for S = 1 and [B, S, Hq, D] otherwise, to receive rope(norm(q)) as the kernel rounded it (None: a
    temporary) - tests hold the output against attention over exactly that query.
    folded_norm (x [B * S, H] with a unit last stride, eps): q / k / v are projections of x through a weight with
    the layer's input RMSNorm weight folded in, so each is first scaled by its row's rsqrt(mean(x^2) + eps) and
    rounded to q's dtype (folded_norms.scale_rows' numerics); see `supported_folded` for x's constraints."""
    b, new, hq, d = q.shape
    hkv = k.shape[2]
    if not 1 <= new <= MAX_NEW:
        raise ValueError(f"{new} new tokens a row; the kernel takes 1 to {MAX_NEW}")
    if folded_norm is not None:
        x, x_eps = folded_norm
        if not supported_folded(x, q):
            raise ValueError(f"folded_norm rows {tuple(x.shape)} do not fit q {tuple(q.shape)}")
        x_args = (x, new * x.stride(0), x.stride(0), x.shape[1], 1.0 / x.shape[1], float(x_eps))
    else:
        x_args = (q, 0, 0, 1, 1.0, 0.0)          # unused (FOLDED is compiled out)
    if k_cache.shape[2] < length + new:
        raise ValueError(f"cache of {k_cache.shape[2]} positions has no room for {new} at position {length}")
    groups = hq // hkv
    scratch_shape = (b, hq, d) if new == 1 else (b, new, hq, d)     # (one token: the decode step's [B, Hq, D])
    if query_scratch is not None and (query_scratch.shape != scratch_shape or query_scratch.dtype != q.dtype
                                      or not query_scratch.is_contiguous() or query_scratch.device != q.device):
        raise ValueError(f"query_scratch must be a contiguous {scratch_shape} {q.dtype} tensor on {q.device}")
    out = torch.empty(b, new, hq, d, dtype=q.dtype, device=q.device)
    half = d // 2
    pdl = use_pdl(q)
    scratch = torch.empty(scratch_shape, dtype=q.dtype, device=q.device) if query_scratch is None else query_scratch
    scratch = scratch.view(b, new, hq, d)
    _norm_rope_attend_kernel[(b, hkv)](
        q, k, v, q_weight.contiguous(), k_weight.contiguous(), cos, sin, scratch, k_cache, v_cache, out,
        length, length + 1, float(scale), half, 1.0 / d, float(q_eps), float(k_eps),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1),
        sin.stride(0) if sin.shape[0] > 1 else 0, sin.stride(1), scratch.stride(0), scratch.stride(1),
        scratch.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0),
        v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), out.stride(2), *x_args,
        GROUPS=groups, GP=max(2, triton.next_power_of_2(groups)), D=d, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_T=16, USE_PDL=pdl, FOLDED=folded_norm is not None,
        BLOCK_X=triton.next_power_of_2(x_args[3]), NEW=new, num_warps=num_warps or launch_warps(b),
        enable_fp_fusion=False,   # qk_norm_rope's rounding: no fma contraction in the norm and the rotation
        **launch_kwargs(pdl))
    return out
