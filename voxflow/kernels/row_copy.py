"""Whole rows of a [rows, N] buffer gathered by row number, or written back, in one vectorised Triton pass.

Why: the codec keeps every stream's state as one row of a packed [rows, N] buffer per dtype (~2.6 MB a row in
fp16, codec_pool.py), and each codec call gathers its streams' rows and writes them back. PyTorch's index_select and
index_copy_ over so few, so wide rows copy one element a thread-iteration (2-byte accesses in fp16): on the H200's
64-SM codec partition the gather took 144 us and the write-back 123 us of every codec call, 42 MB each way for 16
streams, ~10% of a one-frame call's kernel time (benchmarks/results/h200/2026-12-04-session28, call 2). Here each
program copies one contiguous block of a row with wide loads and stores.

Same results as the torch ops: a plain copy, any dtype. A row number repeated in a write (the codec pool's scratch
row, which padded batch entries share) gets, block by block, one of its sources: a mix of them, for a row whose
content nobody reads (index_copy_ leaves such a row unspecified too).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 4096


@triton.jit
def _copy_rows_kernel(src_ptr, dst_ptr, rows_ptr, N, src_stride, dst_stride, GATHER: tl.constexpr,
                      BLOCK: tl.constexpr):
    i = tl.program_id(0)                                # the batch entry
    row = tl.load(rows_ptr + i).to(tl.int64)            # its row of the pooled buffer
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    if GATHER:
        src_row, dst_row = row, i.to(tl.int64)
    else:
        src_row, dst_row = i.to(tl.int64), row
    x = tl.load(src_ptr + src_row * src_stride + offs, mask=mask)
    tl.store(dst_ptr + dst_row * dst_stride + offs, x, mask=mask)


def _launch(src: torch.Tensor, dst: torch.Tensor, rows: torch.Tensor, n: int, gather: bool) -> None:
    """Row i of the batch is pooled row rows[i]: a program per (entry, block of <= _BLOCK elements) of a row."""
    block = min(_BLOCK, triton.next_power_of_2(n))
    _copy_rows_kernel[(rows.shape[0], triton.cdiv(n, block))](
        src, dst, rows, n, src.stride(0), dst.stride(0), GATHER=gather, BLOCK=block,
        num_warps=8 if block >= 2048 else 1)


def _check(buf: torch.Tensor, rows: torch.Tensor) -> None:
    if buf.dim() != 2 or buf.stride(1) != 1:
        raise ValueError(f"a [rows, N] buffer with contiguous rows is needed, got {tuple(buf.shape)} "
                         f"strides {buf.stride()}")
    if rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64) or rows.device != buf.device \
            or (rows.stride(0) != 1 and rows.numel() > 1):
        raise ValueError(f"row numbers must be a contiguous 1-D int32 / int64 tensor on {buf.device}")


def gather_rows(buf: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """buf.index_select(0, rows): buf [R, N] (contiguous rows), rows [B] -> a new [B, N] tensor."""
    _check(buf, rows)
    out = torch.empty((rows.shape[0], buf.shape[1]), dtype=buf.dtype, device=buf.device)
    if out.numel():
        _launch(buf, out, rows, buf.shape[1], gather=True)
    return out


def scatter_rows(buf: torch.Tensor, rows: torch.Tensor, src: torch.Tensor) -> None:
    """buf.index_copy_(0, rows, src): src [B, N] (any row stride, 0 for one row written to every given row; rows
    whose elements are strided are copied contiguous first) into rows [B] of buf [R, N]."""
    _check(buf, rows)
    if src.dim() != 2 or src.shape != (rows.shape[0], buf.shape[1]) or src.dtype != buf.dtype \
            or src.device != buf.device:
        raise ValueError(f"src must be [{rows.shape[0]}, {buf.shape[1]}] {buf.dtype} on {buf.device}, got "
                         f"{tuple(src.shape)} {src.dtype}")
    if src.stride(1) != 1 and src.shape[1] > 1:
        src = src.contiguous()
    if src.numel():
        _launch(src, buf, rows, buf.shape[1], gather=False)
