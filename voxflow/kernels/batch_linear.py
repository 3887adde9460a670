"""Decode GEMMs for batches of rows on tensor cores with the element-wise work after them in the epilogue:

    + residual:  out = residual + x @ W^T          (o_proj / down_proj with the residual add; out may be the residual)
    swiglu:      act = silu(gate) * up of x @ W_gate|up^T      (gate|up with silu * up; W is [2N, K] = gate | up)

Why: above the skinny sizes (qwen3_layer.SKINNY_MAX_ROWS) a decoder layer ran cuBLAS's o_proj / down_proj (split-K
kernels + a reduce launch at these shapes) and cuBLAS's gate|up + a silu_mul launch; none of them take part in PDL.
Here each is one kernel, launched with PDL (qwen3_layer.BATCH_GEMMS says where it runs).

No norm is folded in here. Session 13 tried it (commit 193330c: the RMSNorm folded into W, each row's sum of
squares taken from the x tile that also feeds wgmma) and found a Triton pipeliner race: a loaded tile with a
register user besides the async wgmma gets one shared-memory buffer fewer (3 at num_stages=4), so the copy for
step i + 3 overwrites the buffer wgmma i may still be reading (wrong results on the H200 at 200+ rows and in graph
replays; the TTGIR shows it). It was also slower in the served step (benchmarks/results/h200/2026-12-02-session13).

Numerics: the epilogues round as skinny_linear.py's / norm_linear.py's (round(y), then residual + it, rounded;
silu(gate) * up from the rounded gate and up with silu_mul.py's rounding points). fp32: "ieee" products (no TF32).

Sizes (`supported`): x [M, K] with a unit last stride, W [N or 2N, K] contiguous, one dtype, K % 16 == 0, M >= 1.
`launch_config` is deterministic (CUDA-graph capturable).
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
def _batch_linear_kernel(x_ptr, w_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_rm, stride_om,
                         SWIGLU: tl.constexpr, HAS_RES: tl.constexpr,
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
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        a = tl.load(x_rows + kk[None, :], mask=m_mask[:, None], other=0.0)
        # (only tl.dot may use `a`: a second, register user gets the tile one pipeline buffer too few, see above)
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
    Rows in tiles of up to 64 (wgmma's natural M), K steps of 128. Output columns from session 13's H200 tune at
    the code predictor's widths (benchmarks/results/h200/2026-12-02-session13, call 1): up to 64 rows, 16 a program
    with 5 stages for the plain GEMMs (o_proj 5.4 us vs cuBLAS + add 7.3; down 7.0 vs 8.2) and 32 with 8 warps
    for gate|up; above, 32 a program, 4 stages. fp32 (tests): 2 stages (shared memory)."""
    block_m = max(16, min(64, triton.next_power_of_2(m)))
    block_k = 128 if k % 128 == 0 else (64 if k % 64 == 0 else (32 if k % 32 == 0 else 16))
    if m > 64:
        cfg = dict(BLOCK_N=32, num_warps=4, num_stages=4)
    elif swiglu:
        cfg = dict(BLOCK_N=32, num_warps=8, num_stages=4)
    else:
        cfg = dict(BLOCK_N=16, num_warps=4, num_stages=5)
    if fp32:
        cfg["num_stages"] = 2
    return dict(BLOCK_M=block_m, BLOCK_K=block_k, **cfg)


def weight_supported(w: torch.Tensor, k: int, dtype: torch.dtype, device: torch.device, swiglu: bool = False) -> bool:
    """Whether W can be the weight of a `batch_linear` over inputs [M, k] of this dtype and device."""
    return (w.dim() == 2 and w.shape[1] == k and k % 16 == 0 and w.dtype == dtype and dtype in _DTYPES
            and w.device == device and w.is_contiguous() and w.numel() < 2 ** 31 and not (swiglu and w.shape[0] % 2))


def supported(x: torch.Tensor, w: torch.Tensor, swiglu: bool = False, residual: torch.Tensor | None = None) -> bool:
    """Whether `batch_linear` takes these operands (checked before any launch)."""
    if x.dim() != 2 or x.shape[0] < 1 or x.stride(1) != 1 or not weight_supported(w, x.shape[1], x.dtype, x.device,
                                                                                   swiglu):
        return False
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    return residual is None or (residual.shape == (x.shape[0], n) and residual.dtype == x.dtype
                                and residual.stride(1) == 1)


def batch_linear(x: torch.Tensor, w: torch.Tensor, swiglu: bool = False, residual: torch.Tensor | None = None,
                 out: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """x [M, K] -> [M, N]: x @ W^T; with swiglu W is [2N, K] = gate | up and the result silu(gate) * up; with
    residual, residual + y (out may be the residual itself: each element is read before it is written, by the
    same program)."""
    if not supported(x, w, swiglu, residual):
        raise ValueError(f"batch_linear: unsupported operands x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} "
                         f"{w.dtype}, swiglu={swiglu}")
    m, k = x.shape
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"batch_linear: out {tuple(out.shape)} {out.dtype} is not [{m}, {n}] {x.dtype}")
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
        x, w, res, out, m, n, k, x.stride(0), res.stride(0), out.stride(0), SWIGLU=swiglu, HAS_RES=residual is not None, PRECISE_EXP=x.is_cuda,
        USE_PDL=pdl, DOT_IN_FP32=x.dtype == torch.float32 or not x.is_cuda,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **launch_kwargs(pdl))
    return out
