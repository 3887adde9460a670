"""The counter-based uniform noise of batched sampling (`models/qwen3_tts/batch_sampling.uniform_noise`) in one
Triton kernel, bit for bit.

The reference hashes (seed key, frame, codebook, vocabulary index) with 32-bit integer mixing written as int64
torch ops (a 32x32-bit multiply is split in two so nothing overflows): ~40 element-wise kernels per [B, V] draw,
and a frame makes 16 draws. Here unsigned 32-bit arithmetic wraps natively, so one program per (row, vocabulary
tile) does the whole chain in registers. Integer math is exact, so the output equals the reference exactly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _lowbias32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


# No specialisation of `codebook`: Triton turns an int argument equal to 1 into a compile-time constant (a Python
# int, which has no `.to`), and one compiled kernel for all 16 codebooks is what we want anyway.
@triton.jit(do_not_specialize=["codebook"])
def _uniform_noise_kernel(keys_ptr, frame_ptr, out_ptr, codebook, vocab, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    key = tl.load(keys_ptr + row).to(tl.uint32)
    frame = tl.load(frame_ptr + row).to(tl.uint32)
    stream = _lowbias32(key ^ _lowbias32(frame * 16 + codebook.to(tl.uint32)))
    v = cols.to(tl.uint32)
    vhash = _lowbias32(v * 0x9E3779B9 + 0x632BE5AB)
    bits = _lowbias32(stream ^ vhash)
    u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    tl.store(out_ptr + row * stride_out + cols, u, mask=mask)


def uniform_noise(keys: torch.Tensor, frame: torch.Tensor, codebook: int, vocab: int) -> torch.Tensor:
    """[B, vocab] float32 in (0, 1), equal to batch_sampling.uniform_noise (keys [B] < 2^32, frame [B] int64)."""
    b = keys.shape[0]
    out = torch.empty(b, vocab, dtype=torch.float32, device=keys.device)
    block = 1024
    _uniform_noise_kernel[(b, triton.cdiv(vocab, block))](keys.contiguous(), frame.contiguous(), out, int(codebook),
                                                          vocab, out.stride(0), BLOCK=block)
    return out
