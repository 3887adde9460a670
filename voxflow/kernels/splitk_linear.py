"""out = residual + x @ W^T for a decode batch (M = 1..128 rows) in ONE launch: split-K, reduced by the last program.

Why: at 64 rows the decode layers' N = 1024 GEMMs with a residual add (o_proj, K 2048; down_proj, K 3072: the 0.6B
talker's 28 layers and the code predictor's 75 layer passes a frame) read their weights at 0.75-0.86 TB/s through
cuBLAS (H100, session 43: 5.63 and 7.28 us for 4.2 and 6.3 MB; down as a split-K GEMM plus a reduce kernel). So few
output tiles (N / BLOCK_N) leave most SMs idle unless K is split, and a split needs its partial sums added somewhere.
Here the grid is (N tiles, SPLIT, M tiles): each program streams W[BLOCK_N, K / SPLIT] once for all its rows and
writes an fp32 partial tile to a workspace; the last program of a tile to finish (an acq_rel counter per tile) sums
the SPLIT partials in split order, adds the residual and stores. No second launch; the counter is reset by that
program, so the next call (or CUDA-graph replay) finds it at zero.

Numerics: fp32 accumulation, residual added in fp32, one rounding to x's dtype: what cuBLAS's addmm with beta = 1
does; the order of the fp32 sums differs (fp32 results agree to ~1e-6 relative, bf16 within an ulp). The sum over
splits runs in a fixed order, so a call is deterministic.

Off by default until measured (`VOXFLOW_SPLITK_RESIDUAL`, qwen3_layer.SPLITK_RESIDUAL); tuned and timed
against cuBLAS by benchmarks/scripts/tune_splitk_linear.py. The tile counters are shared per device and size
(attention_o_proj.tile_counters): calls must not run concurrently on two streams of a device (the decode step runs
on one).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels import use_pdl
from voxflow.kernels.attention_o_proj import tile_counters
from voxflow.kernels.pdl import launch_kwargs, trigger_mode, wait_for_previous_kernel

MAX_M = 128
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _finish_tile(acc, res_ptr, out_ptr, rm, rn, m_mask, n_mask, sr_m, so_m, HAS_RESIDUAL: tl.constexpr):
    """acc (+ the residual tile, added in fp32), rounded once to out's dtype and stored."""
    mask = m_mask[:, None] & n_mask[None, :]
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rm[:, None].to(tl.int64) * sr_m + rn[None, :], mask=mask, other=0.0)
        acc = acc + r.to(tl.float32)
    tl.store(out_ptr + rm[:, None].to(tl.int64) * so_m + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _splitk_residual_kernel(x_ptr, w_ptr, res_ptr, out_ptr, part_ptr, count_ptr, M, N, K, k_per_split,
                            sx_m, sw_n, sr_m, so_m,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            SPLIT: tl.constexpr, USE_PDL: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                            HAS_RESIDUAL: tl.constexpr):
    if USE_PDL:                 # pdl.py: nothing read before the previous kernel's results are visible
        wait_for_previous_kernel(USE_PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_mask, n_mask = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    for k0 in range(0, k_per_split, BLOCK_K):
        k = k_start + k0 + rk
        k_mask = k < K
        a = tl.load(x_ptr + rm[:, None].to(tl.int64) * sx_m + k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)
        b = tl.load(w_ptr + rn[:, None].to(tl.int64) * sw_n + k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0)
        if DOT_IN_FP32:
            # fp32 operands: full-precision products (no TF32). Also taken under the interpreter for 16-bit inputs,
            # whose dot multiplies bf16 operands as their raw bit patterns (their fp32 values: the same products).
            acc += tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(a, tl.trans(b))
    if SPLIT == 1:              # no split: the one program of the tile finishes it
        _finish_tile(acc, res_ptr, out_ptr, rm, rn, m_mask, n_mask, sr_m, so_m, HAS_RESIDUAL)
    else:
        # this split's partial tile: workspace [SPLIT, M tiles * BLOCK_M, N], rows and columns past M / N never read
        rows_total = tl.num_programs(2) * BLOCK_M
        part = part_ptr + (pid_k * rows_total + rm[:, None]).to(tl.int64) * N + rn[None, :]
        tl.store(part, acc, mask=m_mask[:, None] & n_mask[None, :])
        tile = pid_m * tl.num_programs(0) + pid_n
        # every thread's partial stores before the one counting thread's release (Triton puts this barrier before a
        # scalar atomic itself; stated here so the order does not rest on that)
        tl.debug_barrier()
        # acq_rel: this program's partial is visible before its count, and the last program sees every partial
        done = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        if done == SPLIT - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            # split order: the same sums whichever program finishes last (a loop, not unrolled: unrolled, the
            # compiler holds every split's tile at once and spills)
            for s in range(SPLIT):
                p = part_ptr + (s * rows_total + rm[:, None]).to(tl.int64) * N + rn[None, :]
                total += tl.load(p, mask=m_mask[:, None] & n_mask[None, :], other=0.0, cache_modifier=".cg")
            _finish_tile(total, res_ptr, out_ptr, rm, rn, m_mask, n_mask, sr_m, so_m, HAS_RESIDUAL)
            tl.atomic_xchg(count_ptr + tile, 0)        # ready for the next call / graph replay


def launch_config(m: int, n: int, k: int) -> dict:
    """BLOCK_M / BLOCK_N / BLOCK_K / SPLIT / num_warps for an [m, k] x [n, k]^T problem. Aimed at ~128 programs
    (an H100 / H200 has 132 SMs): 64-column tiles, K split into slices of >= 256. A starting point for the tune
    script, not a measured table."""
    block_m = 16 if m <= 16 else 64 if m <= 64 else 128
    block_n = 64
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split = 1
    while tiles * split * 2 <= 128 and k // (split * 2) >= 256:
        split *= 2
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=64, SPLIT=split, num_warps=8 if block_m > 64 else 4)


def supported(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None) -> bool:
    """x [M, K] (rows contiguous), W [N, K] contiguous, residual None or [M, N] (rows contiguous, not overlapping:
    it may be written in place), one dtype on one device, 1 <= M <= MAX_M, K % 16 == 0."""
    if not (x.dim() == 2 and w.dim() == 2 and x.dtype in _DTYPES and x.dtype == w.dtype and x.device == w.device
            and 1 <= x.shape[0] <= MAX_M and x.shape[1] == w.shape[1] and x.shape[1] % 16 == 0
            and x.stride(1) == 1 and w.is_contiguous()):
        return False
    return residual is None or _fits_output(residual, x, w)


def _fits_output(t: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> bool:
    """t can be read / written as the [M, N] result of x @ w^T: its shape, dtype and device, unit column stride,
    rows that do not overlap."""
    return (t.dim() == 2 and t.shape == (x.shape[0], w.shape[0]) and t.dtype == x.dtype and t.device == x.device
            and t.stride(1) == 1 and (t.stride(0) >= t.shape[1] or t.shape[0] == 1))


def splitk_linear(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """(residual +) x @ w^T, rounded once to x's dtype, into `out` (a new tensor if None; may be `residual` itself:
    each output tile is read and written by the one program that finishes it). `config`: launch_config's keys."""
    if not supported(x, w, residual):
        raise ValueError("splitk_linear: unsupported shapes / dtypes / layouts (see supported())")
    m, k = x.shape
    n = w.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif not _fits_output(out, x, w):
        raise ValueError(f"splitk_linear: out {tuple(out.shape)} {out.dtype} cannot hold the [{m}, {n}] result")
    cfg = dict(launch_config(m, n, k), **(config or {}))
    bm, bn, bk, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT"]
    k_per_split = triton.cdiv(triton.cdiv(k, split), bk) * bk
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, bm))
    if split > 1:
        # the partials from torch's caching allocator (capture-safe: inside a capture the graph's pool keeps them);
        # the counters are attention_o_proj's per-device zeros, which every launch leaves at zero again
        part = torch.empty(split * grid[2] * bm * n, dtype=torch.float32, device=x.device)
        count = tile_counters(x.device, grid[0] * grid[2])
    else:
        part = count = out                          # unused: one split writes its tile straight out
    res = out if residual is None else residual     # (unused without a residual: HAS_RESIDUAL is compiled out)
    pdl = use_pdl(x)
    _splitk_residual_kernel[grid](
        x, w, res, out, part, count, m, n, k, k_per_split, x.stride(0), w.stride(0), res.stride(0),
        out.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split,
        USE_PDL=trigger_mode(pdl, "splitk_linear"), DOT_IN_FP32=x.dtype == torch.float32 or not x.is_cuda,
        HAS_RESIDUAL=residual is not None,
        num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3), **launch_kwargs(pdl))
    return out
