"""The codec's residual dequantisation, sum_k table_k[codes[:, k]], in one Triton pass.

Why: `ResidualDequantizer` looks each of its K codebooks up with F.embedding and adds them one by one: 2K launches
a codec call (the 12 Hz codec's K = 1 + 15). For a one-frame call's 16 rows PyTorch's index_select took 15.9 us a
lookup on the H200's 64-SM codec partition (0.26 ms of a 2.58 ms call, benchmarks/results/h200/2026-12-04-session28
call 2). Here one program per (row, block of the dimension) reads its K codes and entries and sums them.

Numerics: the reference's order and rounding, i.e. each partial sum rounded to the table dtype as torch stores it
(((e_0 + e_1) + e_2) + ...), fp32 arithmetic in between: the same bits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels.rms_norm import round_to

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _rvq_lookup_kernel(codes_ptr, table_ptr, out_ptr, T, K, SIZE, DIM, codes_sb, codes_sk, codes_st,
                       BLOCK_D: tl.constexpr):
    row = tl.program_id(0)                      # b * T + t
    b = (row // T).to(tl.int64)
    t = (row % T).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = d < DIM
    dtype = out_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for k in range(0, K):                       # in codebook order: each partial sum rounded as torch stores it
        code = tl.load(codes_ptr + b * codes_sb + k * codes_sk + t * codes_st).to(tl.int64)
        entry = tl.load(table_ptr + (k * SIZE + code) * DIM + d, mask=mask, other=0.0).to(tl.float32)
        acc = round_to(acc + entry, dtype)
    tl.store(out_ptr + row.to(tl.int64) * DIM + d, acc.to(dtype), mask=mask)


def supported(codes: torch.Tensor, table: torch.Tensor) -> bool:
    """codes [B, K, T] int64 / int32 and a contiguous table [K, size, dim] of a float dtype, on one device."""
    return (codes.dim() == 3 and table.dim() == 3 and codes.shape[1] == table.shape[0]
            and codes.dtype in (torch.int32, torch.int64) and table.dtype in _DTYPES and table.is_contiguous()
            and codes.device == table.device)


def rvq_lookup(codes: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """codes [B, K, T] (values in [0, size): not checked on the device), table [K, size, dim] ->
    sum_k table[k, codes[:, k]] as [B, T, dim] in the table's dtype, summed in codebook order."""
    if not supported(codes, table):
        raise ValueError(f"codes [B, {table.shape[0]}, T] (int) and a contiguous [K, size, dim] float table on one "
                         f"device needed, got {tuple(codes.shape)} {codes.dtype}, {tuple(table.shape)} {table.dtype}")
    bsz, k, t = codes.shape
    size, dim = table.shape[1:]
    out = torch.empty((bsz, t, dim), dtype=table.dtype, device=table.device)
    if out.numel():
        block_d = min(1024, triton.next_power_of_2(dim))
        _rvq_lookup_kernel[(bsz * t, triton.cdiv(dim, block_d))](
            codes, table, out, t, k, size, dim, codes.stride(0), codes.stride(1), codes.stride(2),
            BLOCK_D=block_d, num_warps=4 if block_d >= 512 else 2, enable_fp_fusion=False)
    return out
