"""RMSNorm folded into a skinny decode GEMM in one pass: y = rms_norm(x, g) @ W^T for a few rows (M = 1..8),
optionally with the SwiGLU product as the epilogue (act = silu(gate) * up of a fused gate|up weight).

Why one pass: each program streams its W[BLOCK_N rows, K] along K and re-reads the tiny x row (L2) anyway, so the
norm costs nothing extra if it rides along: per K step the program accumulates sum(x^2) and multiplies x by the
norm weight g as it is loaded, and the GEMM sums x_k g_k W_nk; at the end

    y_n = rstd * sum_k x_k g_k W_nk,    rstd = rsqrt(sum_k x_k^2 / K + eps).

(skinny_linear.py's norm prologue instead runs a separate sum-of-squares pass over x in every program before the
GEMM loop, a dependent round trip at the start of each program, which is why it lost to norm + cuBLAS on the wide
q|k|v / gate|up GEMMs.) With `swiglu`, W is [2N, K] = gate | up (MLP.fused_gate_up's layout) and each program
streams the matching BLOCK_N rows of both halves; the epilogue rounds gate and up to the activation dtype and
writes silu(gate) * up with silu_mul.py's rounding (voxflow/kernels/skinny_linear.py's `_silu_mul`).

Numerics. NOT the reference's rounding points in 16-bit dtypes: the reference rounds the normed row twice
(x * rstd to dtype, then * g to dtype) before its GEMM; here x_k * g_k is formed in fp32 (exact for bf16 inputs)
and rstd is applied to the fp32 sums, so the GEMM input is never rounded. The result is the fp32 value of the
same math rounded once to the dtype (plus fp32 summation-order error): within one bf16 rounding (2^-8 relative)
of the fp32 reference computed from unrounded normed inputs, and within ~2^-8 of |a| @ |W|^T of the bf16
reference (its two input roundings). fp32: the reference's math up to summation order (~1e-6 relative).
The sum of squares is divided by K with an IEEE division (torch's mean, for power-of-two K).

Tiles. One K step loads a [BLOCK_N, BLOCK_K] tile of W (two with swiglu), converts it to fp32 and reduces it
against the row right away (no deferred 3-D accumulator: the registers go to loads in flight instead). For the
code predictor's K = 1024 the plain default takes the whole K in one step, so a program issues all its W loads at
once (4 x 1024 bf16 = 8 KB a program, 1024 programs at N = 4096). `launch_config` is deterministic
(CUDA-graph capturable); benchmarks/scripts/tune_cp_layer.py times alternatives on the GPU.

Also, without a norm weight, a plain skinny GEMM with an optional residual epilogue (residual + round(y), rounded:
skinny_linear.py's rounding points). The body is `_norm_linear_tile` (one BLOCK_N tile of output columns).

Registers per thread (sm_90, bf16, M = 1, as the JIT specializes aligned pointers / strides; `python -m
voxflow.kernels.compile_check` prints them): ~44 at the code predictor's q|k|v default (4 x 1024), ~56 at its
gate|up's (2 x 4 x 512), ~99 at the talker's q|k|v (16 x 1024, 8 warps), no spills.

Sizes (`supported`): x [M, K] with 1 <= M <= MAX_M and a unit last stride, W [N or 2N, K] contiguous, one dtype,
K % 16 == 0.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels import use_pdl
from voxflow.kernels.pdl import launch_kwargs, trigger_mode, wait_for_previous_kernel, weight_preload
from voxflow.kernels.rms_norm import round_to
from voxflow.kernels.skinny_linear import _silu_mul

MAX_M = 8
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_CONFIG_KEYS = ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages")


@triton.jit
def _row_k_step(w, wu, x_ptr, g_ptr, kk, K, sq, acc, acc_u, NORM: tl.constexpr, SWIGLU: tl.constexpr):
    """One K step at one row: the loaded W tile(s) [BLOCK_N, BLOCK_K] against x[kk] (normed as it is read)."""
    a = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    if NORM:
        sq += a * a
        a = a * tl.load(g_ptr + kk).to(tl.float32)          # exact in fp32 for 16-bit x and g
    acc += tl.sum(w * a[None, :], axis=1)
    if SWIGLU:
        acc_u += tl.sum(wu * a[None, :], axis=1)
    return sq, acc, acc_u


@triton.jit
def _norm_linear_tile(tile, x_ptr, g_ptr, w_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_rm, stride_om,
                      k_float, eps, NORM: tl.constexpr, SWIGLU: tl.constexpr, HAS_RES: tl.constexpr,
                      PRECISE_EXP: tl.constexpr, USE_PDL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PRELOAD: tl.constexpr = False):
    """Output columns [tile * BLOCK_N, + BLOCK_N) of all M rows (the kernel below runs one tile a program).
    PRELOAD (one row, PDL): the first K step's W tiles are loaded before the wait (pdl.py, weight preload)."""
    dtype = x_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K              # [BLOCK_N, 1]: gate (or only) rows
    u_rows = w_rows + N * K                                         # up rows (swiglu): W is [2N, K]
    if PRELOAD:                 # weights only: no kernel of the step writes them
        w0 = tl.load(w_rows + offs_k[None, :], mask=n_mask[:, None], other=0.0)
        wu0 = w0
        if SWIGLU:
            wu0 = tl.load(u_rows + offs_k[None, :], mask=n_mask[:, None], other=0.0)
    if USE_PDL:                 # pdl.py: no activation read before the previous kernel's results are visible
        wait_for_previous_kernel(USE_PDL)
    if BLOCK_M == 1:
        sq = tl.zeros((BLOCK_K,), tl.float32)
        acc = tl.zeros((BLOCK_N,), tl.float32)
        acc_u = tl.zeros((BLOCK_N,), tl.float32)
    else:
        sq = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    k_first = 0
    if PRELOAD:
        tl.static_assert(BLOCK_M == 1, "the weight preload is for one row")
        sq, acc, acc_u = _row_k_step(w0.to(tl.float32), wu0.to(tl.float32), x_ptr, g_ptr, offs_k, K, sq, acc,
                                     acc_u, NORM, SWIGLU)
        k_first = BLOCK_K
    for k0 in range(k_first, K, BLOCK_K):
        kk = k0 + offs_k
        w = tl.load(w_rows + kk[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
        wu = w
        if SWIGLU:
            wu = tl.load(u_rows + kk[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
        if BLOCK_M == 1:
            sq, acc, acc_u = _row_k_step(w, wu, x_ptr, g_ptr, kk, K, sq, acc, acc_u, NORM, SWIGLU)
        else:
            a = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :], mask=m_mask[:, None],
                        other=0.0).to(tl.float32)
            if NORM:
                sq += a * a
                a = a * tl.load(g_ptr + kk).to(tl.float32)[None, :]
            acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
            if SWIGLU:
                acc_u += tl.sum(a[:, None, :] * wu[None, :, :], axis=2)
    if BLOCK_M == 1:
        rows = offs_n
        mask = n_mask
    else:
        rows = offs_m[:, None] * stride_om + offs_n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
    if NORM:
        # The element-wise squares reduced once, at the end; rstd [BLOCK_M, 1] (or a scalar at one row).
        if BLOCK_M == 1:
            rstd = tl.math.rsqrt(tl.div_rn(tl.sum(sq, axis=0), k_float) + eps)
        else:
            rstd = tl.math.rsqrt(tl.div_rn(tl.sum(sq, axis=1), k_float) + eps)[:, None]
        acc = acc * rstd
        acc_u = acc_u * rstd
    if SWIGLU:
        y = _silu_mul(round_to(acc, dtype), round_to(acc_u, dtype), dtype, PRECISE_EXP)
    else:
        y = round_to(acc, dtype)
    if HAS_RES:
        # Read and written by this tile only, element for element: `out` may alias the residual.
        if BLOCK_M == 1:
            r = tl.load(res_ptr + offs_n, mask=n_mask, other=0.0)
        else:
            r = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0)
        y = round_to(r.to(tl.float32) + y, dtype)
    tl.store(out_ptr + rows, y.to(dtype), mask=mask)


@triton.jit
def _norm_linear_kernel(x_ptr, g_ptr, w_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_rm, stride_om, k_float,
                        eps, NORM: tl.constexpr, SWIGLU: tl.constexpr, HAS_RES: tl.constexpr,
                        PRECISE_EXP: tl.constexpr, USE_PDL: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PRELOAD: tl.constexpr = False):
    _norm_linear_tile(tl.program_id(0), x_ptr, g_ptr, w_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_rm,
                      stride_om, k_float, eps, NORM, SWIGLU, HAS_RES, PRECISE_EXP, USE_PDL, BLOCK_M, BLOCK_N,
                      BLOCK_K, PRELOAD)


def _pow2_floor(v: int) -> int:
    return 1 << (max(v, 1).bit_length() - 1)


def launch_config(m: int, n: int, k: int, swiglu: bool = False) -> dict:
    """The config for M rows, N outputs (activation columns with swiglu), depth K: deterministic, no timing.

    One row at K >= 2048 (the talker's one-row layers, qwen3_layer.ONE_ROW_NORM_LINEAR), H200, bf16: plain GEMMs
    (q|k|v) 16 output rows a program from N = 4096 on (else 8), K steps of 1024, 8 warps (6.32 us vs 7.22 at 4 rows
    / 4 warps, isolated); swiglu (gate|up) 4 rows, K steps of 256 (14.03 vs 15.31 at 512). In a graph: a talker
    layer step 44.8 -> 42.3 us (benchmarks/results/h200/2026-12-02-session11, calls 1-3).
    Otherwise (the code predictor's K = 1024, more rows): 4 output rows a program where W has >= 4096 rows in all
    (q|k|v, gate|up), else 8 (4 below N = 2048), and K steps of at most 8K W elements a program at 8 rows (the whole
    K = 1024 plain, 512 with the two swiglu tiles), 4 warps: few registers (module docstring), the whole grid
    resident at once. (The 8-warp plain config is faster per isolated call at K = 1024 too, 4.46 vs 4.57 us, but a
    frame of the code predictor's fused layers in a graph with programmatic dependent launch went 1939 -> 2379 us
    with it: session 11 call 3.) H200, bf16, M = 1 (benchmarks/results/h200/2026-12-01-session4/tune_cp_layer.txt):
    q|k|v 4.57 us at 4 rows (5.26 at 8; rms_norm + cuBLAS 6.82), gate|up + silu * up 5.78 (6.29; rms_norm + cuBLAS
    7.69), lm_head best at 8 rows (4.92).
    """
    tiles = 2 if swiglu else 1
    block_m = triton.next_power_of_2(m)
    k_pow2 = k & -k
    if m == 1 and k >= 2048:
        if swiglu:
            return dict(BLOCK_N=4, BLOCK_K=min(k_pow2, 256), num_warps=4, num_stages=2)
        return dict(BLOCK_N=16 if n >= 4096 else 8, BLOCK_K=min(k_pow2, 1024), num_warps=8, num_stages=2)
    block_n = 8 if 2048 <= n * tiles < 4096 else 4
    block_k = min(k_pow2, max(16, 8192 // (tiles * 8 * block_m)))
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=2)


def _problem(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor | None, swiglu: bool) -> str | None:
    tensors = (x, w) if g is None else (x, w, g)
    if x.dim() != 2 or w.dim() != 2 or (g is not None and g.dim() != 1):
        return "x and w must be 2-D, the norm weight 1-D"
    if x.dtype not in _DTYPES or any(t.dtype != x.dtype for t in tensors):
        return f"x, w and the norm weight must share a dtype in {_DTYPES}"
    if any(t.device != x.device for t in tensors) or x.device.type not in ("cuda", "cpu"):
        return "x, w and the norm weight must be on one CUDA (or, interpreted, CPU) device"
    m, k = x.shape
    if not 1 <= m <= MAX_M:
        return f"x must have 1..{MAX_M} rows (got {m})"
    if x.stride(1) != 1 or not w.is_contiguous() or (g is not None and not g.is_contiguous()):
        return "x needs a unit last stride, w and the norm weight must be contiguous"
    if (w.shape[1] != k or (g is not None and g.shape[0] != k) or k % 16 or (swiglu and w.shape[0] % 2)
            or w.numel() >= 2 ** 31):
        return f"sizes: x [M, {k}], w {tuple(w.shape)} (K % 16 == 0, N * K < 2^31), norm weight [K]"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "no backward here"
    return None


def supported(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None, *, swiglu: bool = False) -> bool:
    return _problem(x, w, norm_weight, swiglu) is None


def norm_linear(x: torch.Tensor, w: torch.Tensor, norm_weight: torch.Tensor | None, eps: float, *,
                swiglu: bool = False, residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                config: dict | None = None, preload: bool | None = None) -> torch.Tensor:
    """rms_norm(x, norm_weight, eps) @ w^T -> [M, N]; with swiglu (w = gate | up, [2N, K]) silu(gate) * up
    -> [M, N]; norm_weight None: x @ w^T (no norm). + residual [M, N] (rounded as torch's add) when given.
    `out` may be `residual`, must not overlap x; `config` overrides `launch_config` (keys as it returns).
    `preload`: the first K step's weights loaded before the PDL wait (one row only; None: pdl.weight_preload; the
    interpreter tests force it to hold the peeled step to the loop)."""
    problem = _problem(x, w, norm_weight, swiglu)
    if problem is not None:
        raise ValueError(f"norm_linear: {problem}")
    m, k = x.shape
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    cfg = launch_config(m, n, k, swiglu)
    if config:
        unknown = set(config) - set(_CONFIG_KEYS)
        if unknown:
            raise ValueError(f"norm_linear: unknown config keys {sorted(unknown)}")
        cfg.update(config)
    if k % cfg["BLOCK_K"]:
        raise ValueError(f"norm_linear: BLOCK_K = {cfg['BLOCK_K']} does not divide K = {k}")
    for name, t in (("residual", residual), ("out", out)):
        if t is not None and (t.shape != (m, n) or t.dtype != x.dtype or t.device != x.device or t.stride(1) != 1):
            raise ValueError(f"norm_linear: {name} must be [{m}, {n}] {x.dtype} on {x.device} with a unit last stride")
    pdl = use_pdl(x)
    preload = weight_preload(pdl, n, k, m) if preload is None else bool(preload)
    if preload and m != 1:
        raise ValueError(f"norm_linear: the weight preload is for one row, not {m}")
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    res = residual if residual is not None else out
    _norm_linear_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x, norm_weight if norm_weight is not None else x, w, res, out, m, n, k, x.stride(0), res.stride(0),
        out.stride(0), float(k), float(eps),
        NORM=norm_weight is not None, SWIGLU=swiglu, HAS_RES=residual is not None, PRECISE_EXP=x.is_cuda,
        USE_PDL=trigger_mode(pdl, "norm_linear", preload), BLOCK_M=triton.next_power_of_2(m),
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], PRELOAD=preload, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **launch_kwargs(pdl))
    return out
