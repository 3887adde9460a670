"""act = silu(r * (h @ Wg^T)) * (r * (h @ Wu^T)) for a decode step's rows in one kernel: gate|up with the
folded post-attention RMSNorm's row factor and silu * up in its epilogue.

Why: above the skinny sizes a folded-norm layer step (voxflow/layers/qwen3_layer.py, `_forward_folded`) runs
gate|up as a cuBLAS GEMM and then silu_mul.py's `silu_mul_folded` over its [rows, 2 I] output: a second launch that
reads the whole output back (2.9 us of a ~40 us code-predictor layer step at 64 rows on an H100, 75 layer steps a
0.6B frame, plus the gap between the two launches; session 41). Here each program owns BLOCK_N columns of gate AND
the same columns of up, so it holds both halves of its outputs at the end and writes only the activation.

The row factor r = rsqrt(mean(h^2) + eps) needs each row's sum of squares: every program streams all of h's K
columns through its tiles anyway (h [rows, K] is the GEMM's A operand), so it sums the squares of what it loaded; no
extra read, no second pass.

Numerics: the rounding points of the two-launch form it replaces (`folded_norms.silu_mul_folded_reference` after
F.linear): the GEMM sums in fp32 rounded to the activation dtype (as cuBLAS's output), times r rounded, silu in
fp32 with expf and an IEEE division rounded, times up rounded. What differs from cuBLAS + silu_mul_folded: the order
of the GEMM's fp32 sums and of the sum of squares, so fp32 agrees to ~1e-6 relative and bf16 can differ by an ulp
where a value sits near a rounding boundary (the tests say how much).

Sizes (`supported`): h [M, K] with 1 <= M <= MAX_M and a unit last stride, W [2 I, K] contiguous (gate | up, the
layout of MLP.fused_gate_up), K a multiple of 64, one dtype (fp32 / bf16 / fp16), on one device.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from voxflow.kernels.rms_norm import round_to

MAX_M = 64
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Tiles for an A/B on the GPU without editing the heuristic: "BLOCK_N,BLOCK_K,num_stages,num_warps" (read at import).
_TILES_ENV = os.environ.get("VOXFLOW_GATE_UP_SILU_TILES", "")


@triton.jit
def _gate_up_silu_kernel(h_ptr, w_ptr, out_ptr, M, I, K, stride_h, stride_o, inv_k, eps,
                         PRECISE_EXP: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    dtype = h_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < I
    h_rows = h_ptr + offs_m[:, None] * stride_h                      # padding rows load zeros, never stored
    g_cols = w_ptr + offs_n[None, :].to(tl.int64) * K                 # W^T tiles [BLOCK_K, BLOCK_N], contiguous in K
    u_cols = g_cols + I.to(tl.int64) * K                              # up: rows I.. of W
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    sq = tl.zeros((BLOCK_M,), tl.float32)    # the rows' sums of squares (a [BLOCK_M, BLOCK_K] buffer: 64 registers)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        a = tl.load(h_rows + kk[None, :], mask=m_mask[:, None], other=0.0)
        a32 = a.to(tl.float32)
        sq += tl.sum(a32 * a32, axis=1)
        wg = tl.load(g_cols + kk[:, None], mask=n_mask[None, :], other=0.0)
        wu = tl.load(u_cols + kk[:, None], mask=n_mask[None, :], other=0.0)
        if DOT_IN_FP32:
            # fp32 inputs: ieee keeps them fp32 (no TF32). Also taken under the interpreter for 16-bit inputs, whose
            # dot multiplies raw bit patterns; their fp32 values give the same products.
            acc_g = tl.dot(a32, wg.to(tl.float32), acc_g, input_precision="ieee")
            acc_u = tl.dot(a32, wu.to(tl.float32), acc_u, input_precision="ieee")
        else:
            acc_g = tl.dot(a, wg, acc_g)
            acc_u = tl.dot(a, wu, acc_u)
    # The row factor: fp32 statistics, the mean as sum * fl(1/K) (rms_norm.row_factor's, torch's CUDA mean).
    r = tl.math.rsqrt(sq * inv_k + eps)[:, None]
    g = round_to(round_to(acc_g, dtype) * r, dtype)                  # the GEMM output, then scale_rows
    u = round_to(round_to(acc_u, dtype) * r, dtype)
    if PRECISE_EXP:
        e = libdevice.exp(-g)     # expf, as torch's silu; the interpreter has no libdevice
    else:
        e = tl.exp(-g)
    silu = round_to(tl.div_rn(g, 1.0 + e), dtype)
    act = round_to(silu * u, dtype)
    tl.store(out_ptr + offs_m[:, None] * stride_o + offs_n[None, :], act.to(dtype),
             mask=m_mask[:, None] & n_mask[None, :])


def _problem(h: torch.Tensor, w: torch.Tensor) -> str | None:
    if h.dim() != 2 or w.dim() != 2:
        return f"h [M, K] and w [2 I, K] must be 2-D (got {tuple(h.shape)}, {tuple(w.shape)})"
    m, k = h.shape
    if not 1 <= m <= MAX_M:
        return f"h must have 1..{MAX_M} rows (got {m})"
    if w.shape[1] != k or w.shape[0] % 2 or k % 64:
        return f"w {tuple(w.shape)} must be [2 I, K] for h {tuple(h.shape)}, K a multiple of 64"
    if h.dtype != w.dtype or h.dtype not in _DTYPES or h.device != w.device:
        return f"h and w must share a dtype of {_DTYPES} and a device (got {h.dtype}, {w.dtype})"
    if h.stride(1) != 1 or not w.is_contiguous():
        return "h needs a unit last stride and w must be contiguous"
    if torch.is_grad_enabled() and (h.requires_grad or w.requires_grad):
        return "no autograd"
    return None


def supported(h: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `gate_up_silu(h, w, eps)` runs (else the caller takes F.linear + silu_mul_folded)."""
    return _problem(h, w) is None


def launch_config(m: int, inter: int, k: int) -> dict:
    """Deterministic tiles (no autotuner: graph-capturable, the same kernel every call). BLOCK_N columns of gate and
    of up a program; 16-row padding at most; VOXFLOW_GATE_UP_SILU_TILES overrides (the GPU's tile A/B)."""
    block_m = max(16, triton.next_power_of_2(m))
    if _TILES_ENV:
        bn, bk, stages, warps = (int(v) for v in _TILES_ENV.split(","))
    else:
        bn, bk, stages, warps = 32, 128, 4, 4
    while k % bk:           # the K loop has no mask: BLOCK_K divides K (K % 64 == 0, `supported`)
        bk //= 2
    return dict(BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, num_stages=stages, num_warps=warps)


def gate_up_silu(h: torch.Tensor, w: torch.Tensor, eps: float, *, config: dict | None = None) -> torch.Tensor:
    """silu(g) * u, g | u = (h @ w^T) scaled by h's row factor rsqrt(mean(h^2) + eps): the MLP middle of a
    folded-norm layer step (w = gate|up with the post-attention norm folded in). Returns [M, I], contiguous."""
    problem = _problem(h, w)
    if problem is not None:
        raise ValueError(f"gate_up_silu: {problem}")
    m, k = h.shape
    inter = w.shape[0] // 2
    out = torch.empty(m, inter, dtype=h.dtype, device=h.device)
    cfg = dict(launch_config(m, inter, k), **(config or {}))
    if k % cfg["BLOCK_K"] or cfg["BLOCK_M"] < m:
        raise ValueError(f"gate_up_silu: config {cfg} does not tile h {tuple(h.shape)}")
    on_gpu = h.is_cuda
    meta = {key: cfg[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
    _gate_up_silu_kernel[(triton.cdiv(inter, meta["BLOCK_N"]),)](
        h, w, out, m, inter, k, h.stride(0), out.stride(0), 1.0 / k, float(eps),
        PRECISE_EXP=on_gpu, DOT_IN_FP32=h.dtype == torch.float32 or not on_gpu, **meta,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        enable_fp_fusion=False)     # keep every rounded product a product (round_to's points), never an FMA
    return out
