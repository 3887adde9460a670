"""A streamed convolution's left context in and out of its input buffer, in one Triton pass.

The codec's channels-last stack (models/qwen3_tts/codec_waveform_cl.py) gives each streamed convolution an input
buffer [B, ctx + T, C]: the ctx rows of left context the stream carried ([B, C, ctx] in its state), then the T new
rows. The stream's next context is the buffer's last ctx rows. PyTorch: one transposing copy in, one out, for each
of a call's ~21 such convolutions (42 launches of a 1-frame call's ~200, counted on a CPU in session 39). Here one
launch does both, once the new rows are in the buffer: row r < ctx of the buffer gets old[:, :, r], and new[:, :, r]
gets the buffer's row r + T - which for r + T < ctx is the old context's row r + T, read from `old` itself (the
same program writes the buffer's head). A copy: the same bits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _context_exchange_kernel(buf_ptr, old_ptr, new_ptr, CTX, T, C, b_sb, b_st, o_sb, o_sc, o_sr, n_sb, n_sc, n_sr,
                             BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    for r0 in range(0, CTX, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        ok = (r < CTX)[:, None] & c_ok[None, :]
        old = tl.load(old_ptr + b * o_sb + c[None, :] * o_sc + r.to(tl.int64)[:, None] * o_sr, mask=ok)
        tl.store(buf_ptr + b * b_sb + r.to(tl.int64)[:, None] * b_st + c[None, :], old, mask=ok)
        shifted = r + T                                    # the next context's row r: the buffer's row r + T
        in_old = shifted < CTX
        from_old = tl.load(old_ptr + b * o_sb + c[None, :] * o_sc + shifted.to(tl.int64)[:, None] * o_sr,
                           mask=ok & in_old[:, None])
        from_buf = tl.load(buf_ptr + b * b_sb + shifted.to(tl.int64)[:, None] * b_st + c[None, :],
                           mask=ok & ~in_old[:, None])
        tl.store(new_ptr + b * n_sb + c[None, :] * n_sc + r.to(tl.int64)[:, None] * n_sr,
                 tl.where(in_old[:, None], from_old, from_buf), mask=ok)


def supported(buf: torch.Tensor, old: torch.Tensor) -> bool:
    """buf [B, ctx + T, C] with unit stride along C; old [B, C, ctx] of its dtype and device."""
    return (buf.dim() == 3 and old.dim() == 3 and buf.stride(2) == 1 and old.dtype == buf.dtype
            and old.device == buf.device and old.shape[0] == buf.shape[0] and old.shape[1] == buf.shape[2]
            and old.shape[2] <= buf.shape[1]
            and not (torch.is_grad_enabled() and (buf.requires_grad or old.requires_grad)))


def exchange_context(buf: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> None:
    """buf [B, ctx + T, C] whose last T rows are written: its first ctx rows <- old [B, C, ctx] (transposed), and
    new [B, C, ctx] (any strides, sharing no memory with buf or old) <- the buffer's last ctx rows, transposed."""
    if not supported(buf, old) or new.shape != old.shape or new.dtype != old.dtype or new.device != old.device:
        raise ValueError(f"buf [B, ctx + T, C] (unit stride along C), old / new [B, C, ctx] alike needed, got "
                         f"{tuple(buf.shape)} / {tuple(old.shape)} / {tuple(new.shape)}")
    if new.untyped_storage().data_ptr() in {buf.untyped_storage().data_ptr(), old.untyped_storage().data_ptr()}:
        raise ValueError("new must not share memory with buf or old")
    b, ctx, c = old.shape[0], old.shape[2], old.shape[1]
    if b and ctx and c:
        block_c = min(128, triton.next_power_of_2(c))
        _context_exchange_kernel[(b, triton.cdiv(c, block_c))](
            buf, old, new, ctx, buf.shape[1] - ctx, c, buf.stride(0), buf.stride(1), *old.stride(), *new.stride(),
            BLOCK_R=16, BLOCK_C=block_c, num_warps=4)
