"""Decode GEMMs for batches of rows on tensor cores, with the RMSNorm in front folded into the weight:

    normed:    y = rms_norm(x, g) @ W^T  =  rstd(x) * (x @ (W * g)^T)       (W * g made once: `fold_norm`)
    + swiglu:  act = silu(gate) * up of y over a fused gate|up weight
    plain:     y = x @ W^T, optionally + residual (written over it)

Why: above a few rows the code predictor's layer steps ran ~10 launches each (RMSNorm, cuBLAS q|k|v, attention,
cuBLAS o_proj + split-K reduce, add + RMSNorm, cuBLAS gate|up, silu * up, cuBLAS down + reduce): at 64 rows on the
H200 ~40 us a layer step for ~9 us of weight reads, 70 layer steps a frame (benchmarks/results/h200/
2026-12-02-session12, call 1). This module gives the layer five launches, all with PDL.

Why the weight is folded: session 12 (call 2, commit 17b0d0b) folded the norm into the K loop as x * g in
registers, rounded, before each tl.dot; that operand could not flow from shared memory into wgmma and the loop
stopped pipelining (talker q|k|v at 64 rows 25 us vs cuBLAS's 9). Here x enters tl.dot raw, as loaded; each row's
sum of squares is taken from the same tile and rstd scales the fp32 sums at the end.

Numerics (16-bit dtypes): the tensor cores take the raw x (exact) and W * g rounded once to the dtype (`fold_norm`:
2^-9 relative per weight in bf16); the reference instead rounds the normed row twice (x * rstd, then * g). Both
are one-rounding-of-an-input away from the fp32 math; the result is rounded once. fp32: "ieee" products (no TF32),
the fp32 math up to summation order and the fold's one fp32 rounding. The epilogues round as norm_linear.py's
(silu(gate) * up with silu_mul.py's rounding points; residual + round(y), rounded).

Sizes (`supported`): x [M, K] with a unit last stride, W [N or 2N, K] contiguous, one dtype, K % 16 == 0, M >= 1.
`launch_config` is deterministic (CUDA-graph capturable); benchmarks/scripts/tune_batch_linear.py times
alternatives on the GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels import use_pdl
from voxflow.kernels.pdl import launch_kwargs, wait_for_previous_kernel
from voxflow.kernels.rms_norm import round_to
from voxflow.kernels.skinny_linear import _silu_mul

CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _batch_linear_kernel(x_ptr, w_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_rm, stride_om, k_float, eps,
                         NORM: tl.constexpr, SWIGLU: tl.constexpr, HAS_RES: tl.constexpr,
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
        if NORM:                # the raw tile feeds the dot as loaded; its squares only feed rstd
            af = a.to(tl.float32)
            sq += tl.sum(af * af, axis=1)
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


def fold_norm(w: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """W * g (the RMSNorm weight g along W's input dimension), formed in fp32 and rounded once to W's dtype: the
    weight `batch_linear(..., norm_eps=...)` takes in place of rms_norm(x, g) @ W^T."""
    return (w.float() * norm_weight.float()[None, :]).to(w.dtype)


def launch_config(m: int, n: int, k: int, swiglu: bool = False, fp32: bool = False) -> dict:
    """The config for M rows, N outputs (activation columns with swiglu), depth K: deterministic, no timing.
    Rows in tiles of up to 64 (wgmma's natural M); output columns 16 to a program (session 12's tune: 64 x 16
    tiles won for the plain GEMMs at 16-64 rows: more programs stream W at once), K steps of 128, 4 warps,
    4 stages. A starting point: the GPU tune decides."""
    block_m = max(16, min(64, triton.next_power_of_2(m)))
    block_k = 128 if k % 128 == 0 else (64 if k % 64 == 0 else (32 if k % 32 == 0 else 16))
    # (fp32 tiles at 4 stages can need more than the H200's 227 KB of shared memory: 2 stages there)
    return dict(BLOCK_M=block_m, BLOCK_N=16, BLOCK_K=block_k, num_warps=4, num_stages=2 if fp32 else 4)


def supported(x: torch.Tensor, w: torch.Tensor, swiglu: bool = False, residual: torch.Tensor | None = None) -> bool:
    """Whether `batch_linear` takes these operands (checked before any launch)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[0] < 1 or x.dtype not in _DTYPES:
        return False
    m, k = x.shape
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    if (w.shape[1] != k or k % 16 or w.dtype != x.dtype or w.device != x.device or not w.is_contiguous()
            or x.stride(1) != 1 or (swiglu and w.shape[0] % 2) or w.numel() >= 2 ** 31):
        return False
    if residual is not None and (residual.shape != (m, n) or residual.dtype != x.dtype or residual.stride(1) != 1):
        return False
    return True


def batch_linear(x: torch.Tensor, w: torch.Tensor, norm_eps: float | None = None, swiglu: bool = False,
                 residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 config: dict | None = None) -> torch.Tensor:
    """x [M, K] -> [M, N]: rstd(x) * (x @ W^T) with norm_eps (W = fold_norm(W_orig, g)), plain x @ W^T without;
    with swiglu W is [2N, K] = gate | up and the result silu(gate) * up; with residual, residual + y (out may be the
    residual itself: each element is read before it is written, by the same program)."""
    if not supported(x, w, swiglu, residual):
        raise ValueError(f"batch_linear: unsupported operands x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} "
                         f"{w.dtype}, swiglu={swiglu}")
    m, k = x.shape
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    cfg = launch_config(m, n, k, swiglu, x.dtype == torch.float32)
    if config:
        unknown = set(config) - set(CONFIG_KEYS)
        if unknown:
            raise ValueError(f"batch_linear: unknown config keys {sorted(unknown)}")
        cfg.update(config)
    if k % cfg["BLOCK_K"] or min(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]) < 16:
        raise ValueError(f"batch_linear: config {cfg} needs BLOCK_M / BLOCK_N / BLOCK_K >= 16 and BLOCK_K | K = {k}")
    res = residual if residual is not None else out
    pdl = use_pdl(x)
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, cfg["BLOCK_M"]))
    _batch_linear_kernel[grid](
        x, w, res, out, m, n, k, x.stride(0), res.stride(0), out.stride(0), float(k),
        float(norm_eps if norm_eps is not None else 0.0),
        NORM=norm_eps is not None, SWIGLU=swiglu, HAS_RES=residual is not None, PRECISE_EXP=x.is_cuda,
        USE_PDL=pdl, DOT_IN_FP32=x.dtype == torch.float32 or not x.is_cuda,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **launch_kwargs(pdl))
    return out
