"""The codec attention's key / value window for one streaming call, in one Triton pass.

A streamed call attends over the carried window of L cached keys and values followed by its T new ones, and carries
the last L of those on: in PyTorch two concatenations and two clones a layer (`torch.cat` of these strided [B, H, S,
D] tensors takes its slow, element-at-a-time kernel: 8.1 us for a 16-stream window on the H200's codec partition,
32 such launches a call, benchmarks/results/h200/2026-12-04-session28 call 2). Here one launch a layer writes both
windows of K and V: the whole [B, H, L + T, D], contiguous, and the carried [B, H, L, D], contiguous or into given
tensors (the codec pool's write-back rows: codec_decoder_blocks.StateWriter). A copy: the same bits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _window_rows(cache_ptr, new_ptr, all_ptr, keep_ptr, b, h, H, L, T, D, c_sb, c_sh, c_ss, n_sb, n_sh, n_ss,
                 k_sb, k_sh, k_ss, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, WRITE_ALL: tl.constexpr):
    """Rows s < L + T of (b, h): cache[s] for s < L, else new[s - L]; into all[s] (WRITE_ALL), and into keep[s - T]
    for s >= T."""
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    bh = b * H + h
    first = 0 if WRITE_ALL else (T // BLOCK_S) * BLOCK_S      # only the carried rows: from the block holding row T
    for s0 in range(first, L + T, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        from_cache = s < L
        in_window = s < L + T
        c_rows = b * c_sb + h * c_sh + s.to(tl.int64) * c_ss
        n_rows = b * n_sb + h * n_sh + (s - L).to(tl.int64) * n_ss
        x = tl.load(cache_ptr + c_rows[:, None] + d[None, :], mask=(from_cache & in_window)[:, None] & d_ok[None, :],
                    other=0.0)
        y = tl.load(new_ptr + n_rows[:, None] + d[None, :],
                    mask=(~from_cache & in_window)[:, None] & d_ok[None, :], other=0.0)
        row = tl.where(from_cache[:, None], x, y)
        mask = in_window[:, None] & d_ok[None, :]
        if WRITE_ALL:
            tl.store(all_ptr + (bh * (L + T) + s.to(tl.int64))[:, None] * D + d[None, :], row, mask=mask)
        k_rows = b * k_sb + h * k_sh + (s - T).to(tl.int64) * k_ss
        tl.store(keep_ptr + k_rows[:, None] + d[None, :], row, mask=mask & (s >= T)[:, None])


@triton.jit
def _kv_window_kernel(kc_ptr, kn_ptr, ka_ptr, kk_ptr, vc_ptr, vn_ptr, va_ptr, vk_ptr, H, L, T, D,
                      kc_sb, kc_sh, kc_ss, kn_sb, kn_sh, kn_ss, vc_sb, vc_sh, vc_ss, vn_sb, vn_sh, vn_ss,
                      kk_sb, kk_sh, kk_ss, vk_sb, vk_sh, vk_ss, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
                      WRITE_ALL: tl.constexpr):
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    if tl.program_id(1) == 0:
        _window_rows(kc_ptr, kn_ptr, ka_ptr, kk_ptr, b, h, H, L, T, D, kc_sb, kc_sh, kc_ss, kn_sb, kn_sh, kn_ss,
                     kk_sb, kk_sh, kk_ss, BLOCK_S, BLOCK_D, WRITE_ALL)
    else:
        _window_rows(vc_ptr, vn_ptr, va_ptr, vk_ptr, b, h, H, L, T, D, vc_sb, vc_sh, vc_ss, vn_sb, vn_sh, vn_ss,
                     vk_sb, vk_sh, vk_ss, BLOCK_S, BLOCK_D, WRITE_ALL)


def supported(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> bool:
    """Caches [B, H, L, D] and new rows [B, H, T, D] of one dtype and device, unit stride along D."""
    shapes_fit = (k_cache.dim() == 4 and k_cache.shape == v_cache.shape and k_new.shape == v_new.shape
                  and k_new.dim() == 4 and k_new.shape[:2] == k_cache.shape[:2] and k_new.shape[3] == k_cache.shape[3])
    tensors = (k_cache, v_cache, k_new, v_new)
    return (shapes_fit and all(t.dtype == k_cache.dtype and t.device == k_cache.device and t.stride(3) == 1
                               for t in tensors)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)))


def kv_window(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
              keep_out: tuple[torch.Tensor, torch.Tensor] | None = None, write_all: bool = True
              ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """-> (cat(k_cache, k_new) and the same for v along the rows, [B, H, L + T, D], new contiguous tensors - None,
    None with write_all False (an attention that reads the two parts where they lie: window_attention.py); their
    last L rows, [B, H, L, D]: new contiguous tensors, or written into keep_out's (k, v) - any strides with unit
    stride along D, sharing no memory with the inputs - and returned."""
    if not supported(k_cache, v_cache, k_new, v_new):
        raise ValueError(f"caches [B, H, L, D] and new rows [B, H, T, D] alike (unit stride along D) needed, got "
                         f"{tuple(k_cache.shape)} / {tuple(k_new.shape)}")
    b, h, cached, d = k_cache.shape
    t = k_new.shape[2]
    full = (b, h, cached + t, d)
    k_all, v_all = (k_cache.new_empty(full), k_cache.new_empty(full)) if write_all else (None, None)
    if keep_out is None:
        k_keep, v_keep = k_cache.new_empty(k_cache.shape), k_cache.new_empty(k_cache.shape)
    else:
        k_keep, v_keep = keep_out
        if any(o.shape != k_cache.shape or o.dtype != k_cache.dtype or o.device != k_cache.device or o.stride(3) != 1
               for o in keep_out):
            raise ValueError(f"keep_out must be two {tuple(k_cache.shape)} {k_cache.dtype} tensors on "
                             f"{k_cache.device} with unit stride along D")
        inputs = {t.untyped_storage().data_ptr() for t in (k_cache, v_cache, k_new, v_new)}
        if any(o.untyped_storage().data_ptr() in inputs for o in keep_out):      # programs would race
            raise ValueError("keep_out must not share memory with the caches or the new rows")
    if b * h and (cached + t) and d:
        block_d = triton.next_power_of_2(d)
        _kv_window_kernel[(b * h, 2)](
            k_cache, k_new, k_all if write_all else k_keep, k_keep, v_cache, v_new, v_all if write_all else v_keep,
            v_keep, h, cached, t, d,
            *k_cache.stride()[:3], *k_new.stride()[:3], *v_cache.stride()[:3], *v_new.stride()[:3],
            *k_keep.stride()[:3], *v_keep.stride()[:3],
            BLOCK_S=max(1, min(32, 2048 // block_d)), BLOCK_D=block_d, WRITE_ALL=write_all, num_warps=4)
    return k_all, v_all, k_keep, v_keep
