"""Single-query attention over a small contiguous KV cache (the code predictor's: at most 16 positions) in one
Triton kernel, beside its torch reference (`voxflow.layers.attention.eager_attention`).

The code predictor runs 15 single-token steps per frame through 5 layers; eager attention is ~8 kernels each
(GQA repeat of k and v, q.k^T, scale, softmax, cast, p.v, transpose): ~600 launches a frame for a few hundred
flops. Here one program per (row, KV head) loads the group's query heads once, streams the keys/values in tiles
with an fp32 online softmax, and writes [B, 1, Hq, D] directly. `dense_decode_attention_append` also takes the
step's new key/value, attends to it from registers and writes it into a preallocated cache (the code predictor's
StaticKVCache), so the append costs no kernels of its own. Numerics: scores, softmax and the weighted sum in
fp32 (the eager bf16 path rounds scores and weights to bf16 in between), so bf16 results agree to bf16 rounding,
fp32 results to ~1e-6.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _attend_cached(q, k_ptr, v_ptr, b, kvh, T, scale, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                   GP: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr):
    """fp32 queries q [GP, D] of one (row, KV head) over cache positions [0, T): the online-softmax state
    (running max m, running sum l, unnormalised accumulator acc)."""
    d = tl.arange(0, D)
    t = tl.arange(0, BLOCK_T)
    m = tl.full((GP,), float("-inf"), tl.float32)
    l = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, D), tl.float32)
    for start in range(0, T, BLOCK_T):
        tt = start + t
        tmask = tt < T
        k = tl.load(k_ptr + b * sk_b + kvh * sk_h + tt[:, None] * sk_t + d[None, :], mask=tmask[:, None], other=0.0)
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2) * scale           # [GP, BLOCK_T]
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + b * sv_b + kvh * sv_h + tt[:, None] * sv_t + d[None, :], mask=tmask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m = m_new
    return m, l, acc


@triton.jit
def _dense_decode_kernel(q_ptr, k_ptr, v_ptr, out_ptr, kn_ptr, vn_ptr, T, scale,
                         sq_b, sq_h, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_b, so_h, skn_b, skn_h, svn_b, svn_h,
                         GROUPS: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
                         APPEND: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    gmask = g < GROUPS
    heads = kvh * GROUPS + g
    q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=gmask[:, None], other=0.0)
    q = q.to(tl.float32)
    m, l, acc = _attend_cached(q, k_ptr, v_ptr, b, kvh, T, scale, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                               GP, D, BLOCK_T)
    if APPEND:
        # The new token: attended from registers (the cache's first T positions are the old ones) and written to
        # cache position T for the next steps -- the append that was two copy kernels.
        kn = tl.load(kn_ptr + b * skn_b + kvh * skn_h + d)
        vn = tl.load(vn_ptr + b * svn_b + kvh * svn_h + d)
        tl.store(k_ptr + b * sk_b + kvh * sk_h + T * sk_t + d, kn)
        tl.store(v_ptr + b * sv_b + kvh * sv_h + T * sv_t + d, vn)
        s = tl.sum(q * kn.to(tl.float32)[None, :], axis=1) * scale                          # [GP]
        m_new = tl.maximum(m, s)
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        l = l * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * vn.to(tl.float32)[None, :]
    out = acc / l[:, None]
    tl.store(out_ptr + b * so_b + heads[:, None] * so_h + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=gmask[:, None])


def supported(q: torch.Tensor, k: torch.Tensor) -> bool:
    d = q.shape[-1]
    return q.dim() == 4 and q.shape[2] == 1 and d >= 16 and d & (d - 1) == 0 and q.shape[1] % k.shape[1] == 0


def dense_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, Hq, 1, D], k/v [B, Hkv, T, D] (any strides with a unit last stride) -> [B, 1, Hq, D] in q's dtype."""
    return _launch(q, k, v, k.shape[2], scale, None, None)


def dense_decode_attention_append(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                                  v_cache: torch.Tensor, length: int, scale: float) -> torch.Tensor:
    """Attention of q over the cache's first `length` positions plus the new token (k_new / v_new [B, Hkv, 1, D]),
    which is also written to cache position `length`: k_cache / v_cache [B, Hkv, >= length + 1, D] are updated in
    place. Same result as appending then calling `dense_decode_attention` on the first length + 1 positions."""
    if k_cache.shape[2] <= length:
        raise ValueError(f"cache of {k_cache.shape[2]} positions has no room at position {length}")
    return _launch(q, k_cache, v_cache, length, scale, k_new, v_new)


def _launch(q, k, v, t, scale, k_new, v_new) -> torch.Tensor:
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    append = k_new is not None
    if append:
        k_new, v_new = (x if x.stride(-1) == 1 else x.contiguous() for x in (k_new, v_new))
    else:
        k_new, v_new = k, v                          # unused (APPEND is compiled out)
    groups = hq // hkv
    out = torch.empty(b, 1, hq, d, dtype=q.dtype, device=q.device)
    _dense_decode_kernel[(b, hkv)](q, k, v, out, k_new, v_new, t, float(scale),
                                   q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
                                   v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(2),
                                   k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
                                   GROUPS=groups, GP=max(2, triton.next_power_of_2(groups)), D=d, BLOCK_T=16,
                                   APPEND=append)
    return out
