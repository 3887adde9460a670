"""The codec's sliding-window attention for one streaming call, in one Triton kernel.

A streamed call's T queries (frames start .. start + T - 1 of each stream) attend over the carried L = window - 1
keys (positions start - L .. start - 1) followed by the call's T new ones, each query to the `window` frames that
end at itself and to none before its stream's first frame. With L = window - 1 that is, for query i, the contiguous
key range j in [max(i, L - start), i + L] of the L + T: never empty (j = i + L is the query's own frame).

In PyTorch that was the window concatenated (kv_window.py), a boolean mask built from the positions, cuDNN's
F.scaled_dot_product_attention (11.5 us a layer for a 16-stream 1-frame call on an H100, session 39, 8 a call) and a
transpose copy of its output for o_proj. Here one launch a layer reads the keys / values where they lie (the
carried window and the call's new rows), takes the mask from `start`, runs an fp32 online softmax and writes the
output as the [B, T, H * D] rows o_proj reads. Numerics: scores and the softmax in fp32 (fp32 inputs: IEEE
products, ~1e-6 of the reference), the weights rounded to the input dtype before the product with the values, as
flash attention does: half-precision results agree with PyTorch's to half-precision rounding, not bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _window_rows(cache_ptr, new_ptr, b, kvh, j, L, hi, d, d_ok, c_sb, c_sh, c_ss, n_sb, n_sh, n_st):
    """Key / value rows j (<= hi) of (row b, KV head kvh): the carried window's for j < L, else the call's j - L."""
    cached = j < L
    in_range = j <= hi
    from_cache = tl.load(cache_ptr + b * c_sb + kvh * c_sh + j.to(tl.int64)[:, None] * c_ss + d[None, :],
                         mask=(cached & in_range)[:, None] & d_ok[None, :], other=0.0)
    from_new = tl.load(new_ptr + b * n_sb + kvh * n_sh + (j - L).to(tl.int64)[:, None] * n_st + d[None, :],
                       mask=(~cached & in_range)[:, None] & d_ok[None, :], other=0.0)
    return tl.where(cached[:, None], from_cache, from_new)


@triton.jit
def _window_attention_kernel(q_ptr, kc_ptr, vc_ptr, kn_ptr, vn_ptr, start_ptr, start_stride, out_ptr, H, KVH, L, T, D,
                             scale,
                             q_sb, q_sh, q_st, kc_sb, kc_sh, kc_ss, vc_sb, vc_sh, vc_ss,
                             kn_sb, kn_sh, kn_st, vn_sb, vn_sh, vn_st,
                             BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                             IEEE: tl.constexpr):
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = bh % H
    kvh = (h // (H // KVH)).to(tl.int64)
    h = h.to(tl.int64)
    i0 = tl.program_id(1) * BLOCK_T
    i = i0 + tl.arange(0, BLOCK_T)
    i_ok = i < T
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    start = tl.load(start_ptr + b * start_stride).to(tl.int32)
    first = tl.maximum(L - start, 0)                       # the first key slot that holds one of the stream's frames
    q = tl.load(q_ptr + b * q_sb + h * q_sh + i.to(tl.int64)[:, None] * q_st + d[None, :],
                mask=i_ok[:, None] & d_ok[None, :], other=0.0)
    lo = tl.maximum(i0, first)                             # the block's key range: its first query's first key ..
    hi = tl.minimum(i0 + BLOCK_T - 1, T - 1) + L           # .. its last query's own frame
    m = tl.full((BLOCK_T,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_T,), tl.float32)
    acc = tl.zeros((BLOCK_T, BLOCK_D), tl.float32)
    row_lo = tl.maximum(i, first)
    for j0 in range(lo, hi + 1, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        k = _window_rows(kc_ptr, kn_ptr, b, kvh, j, L, hi, d, d_ok, kc_sb, kc_sh, kc_ss, kn_sb, kn_sh, kn_st)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        allowed = (j[None, :] >= row_lo[:, None]) & (j[None, :] <= (i + L)[:, None]) & (j <= hi)[None, :]
        s = tl.where(allowed, s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row with no key yet (or a padding row)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        l = l * alpha + tl.sum(p, axis=1)
        v = _window_rows(vc_ptr, vn_ptr, b, kvh, j, L, hi, d, d_ok, vc_sb, vc_sh, vc_ss, vn_sb, vn_sh, vn_st)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    rows = (b * T + i.to(tl.int64)) * (H * D) + h * D
    tl.store(out_ptr + rows[:, None] + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=i_ok[:, None] & d_ok[None, :])


def supported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor,
              v_new: torch.Tensor) -> bool:
    """q [B, H, T, D]; caches [B, KVH, L, D], new keys / values [B, KVH, T, D]; one dtype and device, unit stride
    along D, D <= 256, H a multiple of KVH, no autograd."""
    tensors = (q, k_cache, v_cache, k_new, v_new)
    if any(t.dim() != 4 for t in tensors):
        return False
    b, h, t, d = q.shape
    kvh, cached = k_cache.shape[1], k_cache.shape[2]
    shapes_fit = (k_cache.shape == v_cache.shape == (b, kvh, cached, d) and k_new.shape == v_new.shape == (b, kvh, t, d)
                  and kvh > 0 and h % kvh == 0 and 0 < d <= 256)
    return (shapes_fit and all(x.dtype == q.dtype and x.device == q.device and x.stride(3) == 1 for x in tensors)
            and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and not (torch.is_grad_enabled() and any(x.requires_grad for x in tensors)))


def window_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor,
                     v_new: torch.Tensor, start: torch.Tensor, scale: float) -> torch.Tensor:
    """Queries q [B, H, T, D] of frames start[b] + i over the carried keys / values [B, KVH, L, D] (frames start - L
    .. start - 1, L = window - 1) and the call's new ones [B, KVH, T, D] -> the attention output as [B, T, H * D]
    (the module docstring's key ranges). start: LongTensor [B] (frames each stream had before the call)."""
    if not supported(q, k_cache, v_cache, k_new, v_new):
        raise ValueError(f"q [B, H, T, D], caches [B, KVH, L, D] and new keys [B, KVH, T, D] alike needed, got "
                         f"{tuple(q.shape)} / {tuple(k_cache.shape)} / {tuple(k_new.shape)}")
    b, h, t, d = q.shape
    if start.shape != (b,) or start.dtype != torch.long or start.device != q.device:
        raise ValueError(f"start must be a LongTensor [{b}] on {q.device}, got {start.dtype} {tuple(start.shape)} on "
                         f"{start.device}")
    kvh, cached = k_cache.shape[1], k_cache.shape[2]
    out = q.new_empty((b, t, h * d))
    if b and t:
        block_t = 16                                  # tl.dot's smallest tile; a one-frame call uses one row of it
        ieee = q.dtype == torch.float32
        # fp32 (IEEE dots) at 32 keys a tile and 4 warps spilled (255 registers + 320 B at head size 64, sm_90):
        # half the tile on twice the warps fits (142, no spill)
        block_n, warps = (16, 8) if ieee else (32, 4)
        _window_attention_kernel[(b * h, triton.cdiv(t, block_t))](
            q, k_cache, v_cache, k_new, v_new, start, start.stride(0), out, h, kvh, cached, t, d, scale,
            *q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3], *k_new.stride()[:3], *v_new.stride()[:3],
            BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_T=block_t, BLOCK_N=block_n, IEEE=ieee,
            num_warps=warps)
    return out
