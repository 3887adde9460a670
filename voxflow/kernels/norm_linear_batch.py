"""norm_linear.py's GEMMs for decode batches of 9..MAX_M rows, on tensor cores: y = rms_norm(x, g) @ W^T, optionally
with the SwiGLU product as the epilogue, or x @ W^T + residual without a norm.

Why: above a few rows a decoder layer ran RMSNorm, cuBLAS's q|k|v, ..., RMSNorm, gate|up, silu * up, down as
separate launches (at 64 rows on the H200 the norms, silu * up and cuBLAS's split-K reduces were ~0.9 ms of a
6.9 ms talker + code-predictor step: benchmarks/results/h200/2026-12-02-session12). norm_linear.py's one-row trick
works at any row count: the sum of squares of each row rides along the GEMM's K loop (the program loads the x tile
anyway), so the norm costs no pass of its own, and rstd scales the fp32 sums at the end. Here the K loop feeds
tl.dot (wgmma on Hopper) instead of norm_linear.py's CUDA-core reduction, which only pays at M <= 8; each program
owns a BLOCK_M x BLOCK_N output tile and streams W[BLOCK_N rows, K] once for its BLOCK_M rows.

Numerics (16-bit dtypes): the tensor cores take 16-bit operands, so the normed input x_k * g_k (formed in fp32,
exact for bf16 x and g) is rounded ONCE to the dtype before the product; the reference rounds the normed row twice
(x * rstd, then * g). rstd multiplies the fp32 sums. So the result is within one rounding of the inputs (2^-9
relative, bf16) and one of the output of the fp32 math. fp32 inputs: the products in fp32 ("ieee", no TF32): the
reference's math up to summation order. The epilogues round as norm_linear.py's (silu(gate) * up with silu_mul.py's
rounding points; residual + round(y), rounded).

Sizes (`norm_linear._problem`): as norm_linear.py, rows 9..MAX_M. `launch_config` is deterministic (CUDA-graph
capturable); benchmarks/scripts/tune_norm_linear_batch.py times alternatives on the GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels import use_pdl
from voxflow.kernels.pdl import launch_kwargs, wait_for_previous_kernel
from voxflow.kernels.rms_norm import round_to
from voxflow.kernels.skinny_linear import _silu_mul

MAX_M = 256
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")


@triton.jit
def _norm_linear_batch_kernel(x_ptr, g_ptr, w_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_rm, stride_om,
                              k_float, eps, NORM: tl.constexpr, SWIGLU: tl.constexpr, HAS_RES: tl.constexpr,
                              PRECISE_EXP: tl.constexpr, USE_PDL: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K              # [BLOCK_N, 1]: gate (or only) rows
    u_rows = w_rows + N * K                                         # up rows (swiglu): W is [2N, K]
    if USE_PDL:                 # pdl.py: nothing read before the previous kernel's results are visible
        wait_for_previous_kernel()
    sq = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        a = tl.load(x_rows + kk[None, :], mask=m_mask[:, None], other=0.0)
        if NORM:
            af = a.to(tl.float32)
            sq += tl.sum(af * af, axis=1)
            a = (af * tl.load(g_ptr + kk).to(tl.float32)[None, :]).to(dtype)   # the one rounding of the input
        w = tl.load(w_rows + kk[None, :], mask=n_mask[:, None], other=0.0)
        if DOT_IN_FP32:
            # fp32 inputs: "ieee" keeps them fp32 (no TF32). Also taken under the interpreter for 16-bit inputs (its
            # dot does not take bf16 operands): their fp32 values give the same exact products.
            acc = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(w), acc)
        if SWIGLU:
            wu = tl.load(u_rows + kk[None, :], mask=n_mask[:, None], other=0.0)
            if DOT_IN_FP32:
                acc_u = tl.dot(a.to(tl.float32), tl.trans(wu.to(tl.float32)), acc_u, input_precision="ieee")
            else:
                acc_u = tl.dot(a, tl.trans(wu), acc_u)
    if NORM:
        rstd = tl.math.rsqrt(tl.div_rn(sq, k_float) + eps)[:, None]
        acc = acc * rstd
        acc_u = acc_u * rstd
    if SWIGLU:
        y = _silu_mul(round_to(acc, dtype), round_to(acc_u, dtype), dtype, PRECISE_EXP)
    else:
        y = round_to(acc, dtype)
    mask = m_mask[:, None] & n_mask[None, :]
    if HAS_RES:
        # Read and written by this tile only, element for element: `out` may alias the residual.
        r = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0)
        y = round_to(r.to(tl.float32) + y, dtype)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], y.to(dtype), mask=mask)


def launch_config(m: int, n: int, k: int, swiglu: bool = False, fp32: bool = False) -> dict:
    """The config for M rows, N outputs (activation columns with swiglu), depth K: deterministic, no timing.
    Rows in tiles of up to 64 (wgmma's natural M); output columns in the widest tile of 128 / 64 / 32 / 16 that
    still gives >= 128 programs (an H200 has 132 SMs: a decode GEMM is bound by reading W, and a program pulls only
    its share), K steps of 64 (128-byte bf16 rows), 4 warps, 4 stages. A starting point: the GPU tune decides."""
    block_m = max(16, min(64, triton.next_power_of_2(m)))
    m_tiles = triton.cdiv(m, block_m)
    block_n = 16
    for cand in (128, 64, 32):
        if triton.cdiv(n, cand) * m_tiles >= 128:
            block_n = cand
            break
    block_k = 64 if k % 64 == 0 else (32 if k % 32 == 0 else 16)
    # (fp32 swiglu tiles at 4 stages need more than the H200's 227 KB of shared memory: 2 stages there)
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=2 if fp32 else 4)


def launch(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None, eps: float, swiglu: bool,
           residual: torch.Tensor | None, out: torch.Tensor, config: dict | None) -> torch.Tensor:
    """The kernel on checked inputs (norm_linear.norm_linear checks them and picks this above its MAX_M rows)."""
    m, k = x.shape
    n = out.shape[1]
    cfg = launch_config(m, n, k, swiglu, x.dtype == torch.float32)
    if config:
        unknown = set(config) - set(CONFIG_KEYS)
        if unknown:
            raise ValueError(f"norm_linear: unknown config keys {sorted(unknown)} for {m} rows")
        cfg.update(config)
    if k % cfg["BLOCK_K"] or cfg["BLOCK_M"] < 16 or cfg["BLOCK_N"] < 16 or cfg["BLOCK_K"] < 16:
        raise ValueError(f"norm_linear: config {cfg} needs BLOCK_M / BLOCK_N / BLOCK_K >= 16 and BLOCK_K | K = {k}")
    res = residual if residual is not None else out
    pdl = use_pdl(x)
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, cfg["BLOCK_M"]))
    _norm_linear_batch_kernel[grid](
        x, norm_weight if norm_weight is not None else x, w, res, out, m, n, k, x.stride(0), res.stride(0),
        out.stride(0), float(k), float(eps),
        NORM=norm_weight is not None, SWIGLU=swiglu, HAS_RES=residual is not None, PRECISE_EXP=x.is_cuda,
        USE_PDL=pdl, DOT_IN_FP32=x.dtype == torch.float32 or not x.is_cuda,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **launch_kwargs(pdl))
    return out
