"""y = x @ W^T for a decode step's few rows (M = 1..64), with the element-wise work around the GEMM fused in.

At decode batch sizes a linear layer is bound by reading W [N, K] once from HBM, yet each decoder layer also
launched separate small kernels around its GEMMs (RMSNorm before q|k|v and gate|up, silu * up before down_proj,
a residual add after o_proj and down_proj, cuBLAS's split-K reduce). Here one launch does it all:

- prologue on x (optional, exclusive): `norm_weight` -> the GEMM input is rms_norm(x, norm_weight, eps);
  `gated` -> x is [M, 2K] = gate | up (a fused gate|up output) and the GEMM input is silu(gate) * up;
- the GEMM: each program owns BLOCK_N output columns and streams W[BLOCK_N rows, K] once for all M rows, along
  K (coalesced); the tiny x is re-read from L2 by every program. Tiny M: broadcast-multiply into a 3-D fp32
  register accumulator (no tensor cores, no per-step reduction: one sum at the end). M > 4: tl.dot;
- epilogue on y: + bias, + residual, store to `out` (which may alias `residual`: an in-place residual stream).

Numerics: the rounding points of the unfused torch code, in x's dtype. Norm: voxflow/layers/rms_norm.py
(fp32 statistics, x * rsqrt(mean(x^2) + eps) rounded to dtype, times the weight, rounded). Gated:
voxflow/kernels/silu_mul.py (fp32 g / (1 + exp(-g)) with expf and an IEEE division, rounded, times up, rounded).
GEMM: fp32 accumulation (+ bias, as F.linear's cuBLAS epilogue), rounded to dtype; residual + y rounded. What is
NOT the reference's:
the order of the fp32 sums (the GEMM's and the norm's sum of squares), so fp32 results agree to ~1e-6 relative
and bf16 results can differ by an ulp where the fp32 value sits near a rounding boundary (tests say how much).

Launch config: `launch_config(m, n, k, dtype, sms)`, a small deterministic function (no autotuner: CUDA-graph
capturable, same kernel every call); `skinny_linear(..., config=...)` overrides it (benchmarks/scripts/
tune_skinny_linear.py times candidates). SPLIT_K > 1 (the heuristic picks it under split_k_below) writes
fp32 partials to a workspace, and the last program of each column block to finish (an arrival count, FIXUP, the
default) or a second kernel (FIXUP=False) sums them in a fixed order and runs the epilogue: deterministic either
way; one allocation a call (from torch's caching allocator, which is capture-safe).

Cost to keep in mind: the prologue is recomputed by every program (N / BLOCK_N times per x element). That is
free at M <= 8 but at M = 16..64 the gated prologue (exp + IEEE division per element) can cost more than it
saves; the tuning script compares against the unfused sequence so the caller's threshold can be set from data.

Sizes handled (`supported`): K % 16 == 0 (mask-free K loop with BLOCK_K dividing K; tl.dot's minimum K;
16-byte-aligned W rows), any N >= 1 (columns are masked), 1 <= M <= MAX_M, W with fewer than 2^31 elements.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from voxflow.kernels import sm_count, use_pdl
from voxflow.kernels.pdl import launch_kwargs, trigger_mode, wait_for_previous_kernel, weight_preload
from voxflow.kernels.rms_norm import round_to

MAX_M = 64
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The Qwen3-TTS 1.7B decode GEMMs this kernel was tuned and is tested on (GPU test, benchmarks/scripts/
# tune_skinny_linear.py): (name, K, N, the prologue/epilogue the layer could fuse into it).
QWEN3_TTS_SHAPES = (
    ("cp.qkv", 1024, 4096, "norm"),
    ("cp.o", 2048, 1024, "residual"),
    ("cp.gate_up", 1024, 6144, "norm"),
    ("cp.down", 3072, 1024, "gated+residual"),
    ("cp.lm_head", 1024, 2048, "norm"),
    ("talker.qkv", 2048, 4096, "norm"),
    ("talker.o", 2048, 2048, "residual"),
    ("talker.gate_up", 2048, 12288, "norm"),
    ("talker.down", 6144, 2048, "gated+residual"),
    ("talker.codec_head", 2048, 3072, "norm"),
    ("projection", 2048, 1024, "bias"),
)
_CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "USE_DOT", "SPLIT_K", "FIXUP", "num_warps", "num_stages")


@triton.jit
def _silu_mul(g, u, DTYPE: tl.constexpr, PRECISE_EXP: tl.constexpr):
    """silu(g) * u on fp32 values with silu_mul.py's rounding (expf on GPU; the interpreter has no libdevice)."""
    if PRECISE_EXP:
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    silu = round_to(tl.div_rn(g, 1.0 + e), DTYPE)
    return round_to(silu * u, DTYPE)


@triton.jit
def _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
              HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr):
    """[BLOCK_M, BLOCK_N] fp32 sums (+ bias) -> round, residual + y (rounded, as torch would), store."""
    dtype = out_ptr.dtype.element_ty
    n_mask = offs_n < N
    mask = (offs_m[:, None] < M) & n_mask[None, :]
    if HAS_BIAS:
        # Added to the fp32 sums before the one rounding, as cuBLAS's bias epilogue (F.linear(x, w, bias)) does.
        b = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        acc = acc + b[None, :]
    y = round_to(acc, dtype)
    if HAS_RES:
        # Read and written by this program only, element for element: `out` may alias `residual`.
        r = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0)
        y = round_to(r.to(tl.float32) + y, dtype)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], y.to(dtype), mask=mask)


@triton.jit
def _input_tile(x_rows, nw_ptr, kk, m_mask, K, rstd, dtype: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
                PRECISE_EXP: tl.constexpr):
    """The GEMM input tile a [BLOCK_M, BLOCK_K] at columns kk: dtype values (held as fp32 where a prologue made
    them): silu(gate) * up (GATED), the normed row (NORM) or x itself."""
    if GATED:
        g = tl.load(x_rows + kk[None, :], mask=m_mask[:, None], other=0.0).to(tl.float32)
        u = tl.load(x_rows + K + kk[None, :], mask=m_mask[:, None], other=0.0).to(tl.float32)
        a = _silu_mul(g, u, dtype, PRECISE_EXP)
    elif NORM:
        xs = tl.load(x_rows + kk[None, :], mask=m_mask[:, None], other=0.0).to(tl.float32)
        nw = tl.load(nw_ptr + kk).to(tl.float32)
        a = round_to(round_to(xs * rstd[:, None], dtype) * nw[None, :], dtype)
    else:
        a = tl.load(x_rows + kk[None, :], mask=m_mask[:, None], other=0.0)
    return a


@triton.jit
def _skinny_linear_kernel(x_ptr, w_ptr, nw_ptr, bias_ptr, res_ptr, out_ptr, ws_ptr, count_ptr,
                          M, N, K, k_split, stride_xm, stride_rm, stride_om, k_float, eps,
                          NORM: tl.constexpr, GATED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                          PRECISE_EXP: tl.constexpr, DOT_IN_FP32: tl.constexpr, USE_DOT: tl.constexpr,
                          SPLIT_K: tl.constexpr, USE_PDL: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          PRELOAD: tl.constexpr = False, FIXUP: tl.constexpr = False):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    dtype = x_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_rows = x_ptr + offs_m[:, None] * stride_xm        # [BLOCK_M, 1]; padding rows load zeros, never stored
    if PRELOAD:         # pdl.py's weight preload: the first K step's W tile; no kernel of the step writes W
        w0 = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=n_mask[:, None], other=0.0)
    if USE_PDL:         # pdl.py: no activation read before the previous kernel's results are visible
        wait_for_previous_kernel(USE_PDL)
    rstd = tl.zeros((BLOCK_M,), tl.float32)             # (set below with NORM; unused otherwise)

    if NORM:
        # First pass: the whole row's sum of squares (x is a few KB, so this and the re-reads below hit L1/L2).
        # Partial squares kept element-wise and reduced once. The division by K is IEEE: torch's mean (sum / K on
        # CPU, sum * (1/K) on CUDA: the same for power-of-two K, as the hidden sizes are).
        sq = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xs = tl.load(x_rows + (k0 + offs_k)[None, :], mask=m_mask[:, None], other=0.0).to(tl.float32)
            sq += xs * xs
        rstd = tl.math.rsqrt(tl.div_rn(tl.sum(sq, axis=1), k_float) + eps)

    if USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    else:
        acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), tl.float32)
    k_lo = pid_k * k_split
    k_first = k_lo
    if PRELOAD:
        tl.static_assert(not USE_DOT and SPLIT_K == 1, "the weight preload is for the one-split FMA path")
        a = _input_tile(x_rows, nw_ptr, offs_k, m_mask, K, rstd, dtype, NORM, GATED, PRECISE_EXP)
        acc3 += a.to(tl.float32)[:, None, :] * w0.to(tl.float32)[None, :, :]
        k_first = k_lo + BLOCK_K
    for k0 in range(k_first, k_lo + k_split, BLOCK_K):
        kk = k0 + offs_k
        a = _input_tile(x_rows, nw_ptr, kk, m_mask, K, rstd, dtype, NORM, GATED, PRECISE_EXP)
        if USE_DOT:
            # W^T tile [BLOCK_K, BLOCK_N] straight from the [N, K] layout (contiguous along K: coalesced).
            w = tl.load(w_ptr + offs_n[None, :] * K + kk[:, None], mask=n_mask[None, :], other=0.0)
            if DOT_IN_FP32:
                # fp32 inputs: ieee keeps them fp32 (no TF32). Also taken under the interpreter for 16-bit inputs:
                # it multiplies bf16 operands as their raw bit patterns; their fp32 values give the same products.
                acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a.to(dtype), w, acc)
        else:
            w = tl.load(w_ptr + offs_n[:, None] * K + kk[None, :], mask=n_mask[:, None], other=0.0)
            # Pure FMAs per step; the cross-lane reduction over K happens once, after the loop.
            acc3 += a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    if not USE_DOT:
        acc = tl.sum(acc3, axis=2)

    if SPLIT_K == 1:
        _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RES)
    else:
        # fp32 partial sums to ws [SPLIT_K, M, N], added in split order by _split_k_reduce_kernel or (FIXUP) by the
        # last of the column block's programs to get here
        mask = m_mask[:, None] & n_mask[None, :]
        tile = offs_m[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k * M * N + tile, acc, mask=mask)
        if FIXUP:
            # Every thread's partial stored before the count (the barrier), the count released and acquired at GPU
            # scope, the partials read past L1 (.cg: another SM wrote them). The last program resets the count, so
            # the next call on this weight finds it zero (a PDL kernel after this one touches it after its wait).
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
            if arrived == SPLIT_K - 1:
                total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                for s in tl.static_range(SPLIT_K):        # fixed order: deterministic, as the reduce kernel's
                    total += tl.load(ws_ptr + s * M * N + tile, mask=mask, other=0.0, cache_modifier=".cg")
                _epilogue(total, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
                          HAS_BIAS, HAS_RES)
                tl.atomic_xchg(count_ptr + pid_n, 0)


@triton.jit
def _split_k_reduce_kernel(ws_ptr, bias_ptr, res_ptr, out_ptr, M, N, stride_rm, stride_om,
                           HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SPLIT_K: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for s in tl.static_range(SPLIT_K):        # fixed order: deterministic
        acc += tl.load(ws_ptr + s * M * N + offs_m[:, None] * N + offs_n[None, :], mask=mask, other=0.0)
    _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RES)


# Tensor-core launches (M > 4) whose column blocks fill at most half the SMs split K in two, the last program of a
# block summing the partials (the fixup: no second launch), so one wave of programs streams the weights: the code
# predictor's N = 1024 GEMMs (o_proj, down_proj) get 128 programs instead of 64 on a 132-SM H100 / H200, each
# streaming half of K. (Session 25, H200, 64 rows: the two-launch split-K 6.68 / 7.40 us against 5.80 / 7.85 unsplit
# for o_proj / down. Session 60, H100, with the fixup: a 64-row layer pass's four GEMMs + silu 27.31 against 28.04 us
# (probe_gemms_beside_codec.py).) ON since session 61: an H100, 0.6B c=64 over HTTP in <= 8 GB, alternating with the
# defaults of the day, 773.5 / 785.0 / 771.1 audio-s/s against 770.4 / 766.4 / 767.7 / 771.8, full steps free of
# codec and prefill work 5.30-5.33 ms (median) against 5.37-5.39; with qwen3_layer.SKINNY_HEADS on a second machine
# 794.4-797.9 against 784.0 / 788.5 without both, and a layer pass's chain beside the codec 37.95 against 39.24 us
# unsplit (benchmarks/results/h100/2026-12-07-session61). VOXFLOW_SKINNY_SPLIT_K_BELOW: "auto" (the default: split
# where 2 x blocks <= the device's SMs; no split where the SM count is unknown, i.e. under the interpreter), or a
# block count N (split where blocks < N: 96 is what session 61 measured on 132 SMs; 0 turns it off).
_SPLIT_K_BELOW = os.environ.get("VOXFLOW_SKINNY_SPLIT_K_BELOW", "auto")
SPLIT_K_BELOW_BLOCKS: int | str = "auto" if _SPLIT_K_BELOW == "auto" else int(_SPLIT_K_BELOW)


def split_k_below(sms: int | None) -> int:
    """The column-block count under which a tensor-core launch splits K in two (SPLIT_K_BELOW_BLOCKS resolved for
    a device of `sms` SMs; None: unknown)."""
    if SPLIT_K_BELOW_BLOCKS == "auto":
        return sms // 2 + 1 if sms else 0
    return SPLIT_K_BELOW_BLOCKS


def _pow2_floor(v: int) -> int:
    return 1 << (max(v, 1).bit_length() - 1)


def launch_config(m: int, n: int, k: int, dtype: torch.dtype, sms: int | None = None) -> dict:
    """The launch config for M rows, N outputs, GEMM depth K (after gating) and dtype on a device of `sms` SMs
    (None: unknown): deterministic, no timing.

    - M <= 4: register FMA path (tensor-core tiles would be >= 75% padding and the op is bound by W anyway).
      M > 4: tl.dot with M padded to a power of two >= 16 (faster from M = 8 on, H200: e.g. o_proj 1024-wide
      6.6 us instead of 12.8; see benchmarks/scripts/tune_skinny_linear.py).
    - BLOCK_N ~ N / 128, so there are >= ~128 programs (the H200 has 132 SMs and each must pull its share of W):
      N = 1024 -> 8 (FMA) / 16 (dot: its minimum, 64 programs), 2048 -> 16, 4096 -> 32, 12288 -> 64; at one row
      ~N / 512 (at least 4): more, smaller programs keep more W loads in flight. Where the dot path's blocks stay
      under split_k_below(sms) (N = 1024 on 132 SMs), K splits in two instead (SPLIT_K 2: 128 programs).
    - FMA BLOCK_K: the 3-D accumulator holds BLOCK_M * BLOCK_N * BLOCK_K <= 16K fp32 (128 registers a thread at 4
      warps), up to 1024 deep (H200, M = 1: 1024-deep steps were 10-25% faster than 512-deep ones, and 4 warps
      beat 8). dot BLOCK_K: 128 (64 for fp32, whose ieee dot runs on FMAs), 4 stages.
    - BLOCK_K always divides K (largest power of two dividing K, at most the target): no K masks.
    """
    use_dot = m > 4
    block_m = max(16 if use_dot else 1, triton.next_power_of_2(m))
    k_pow2 = k & -k                                      # largest power of two dividing K (>= 16 when supported)
    split = 1
    if use_dot:
        block_n = min(128, max(16, _pow2_floor(n // 128)))
        block_k = min(k_pow2, 64 if dtype == torch.float32 else 128)
        num_warps, num_stages = 4, 4
        if triton.cdiv(n, block_n) < split_k_below(sms) and k % (2 * block_k) == 0:
            split = 2
    else:
        # one row: 4x as many programs (H200, bf16: down_proj 6144 -> 2048 8.78 us at 4 columns vs 11.35 at 16,
        # 3072 -> 1024 4.92 vs 5.13 at 8; tune_cp_layer / tune_talker_one_row, session 9 call 2, session 11 call 1)
        block_n = max(4, _pow2_floor(n // 512)) if m == 1 else min(64, max(8, _pow2_floor(n // 128)))
        block_k = min(k_pow2, 1024, max(32, 16384 // (block_m * block_n)))
        num_warps, num_stages = 4, 2
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, USE_DOT=use_dot, SPLIT_K=split,
                num_warps=num_warps, num_stages=num_stages)


def _problem(x: torch.Tensor, w: torch.Tensor, gated: bool) -> str | None:
    """Why the kernel cannot take (x, w), or None when it can."""
    if x.dim() != 2 or w.dim() != 2:
        return f"x and w must be 2-D (got {x.dim()}-D and {w.dim()}-D)"
    if x.dtype not in _DTYPES or w.dtype != x.dtype:
        return f"x and w must share a dtype in {_DTYPES} (got {x.dtype}, {w.dtype})"
    if x.device != w.device or x.device.type not in ("cuda", "cpu"):
        return f"x and w must be on one CUDA (or, interpreted, CPU) device (got {x.device}, {w.device})"
    m, n, k = x.shape[0], w.shape[0], w.shape[1]
    if not 1 <= m <= MAX_M:
        return f"x must have 1..{MAX_M} rows (got {m})"
    if x.stride(1) != 1 or not w.is_contiguous():
        return "x needs a unit last stride and w must be contiguous"
    if x.shape[1] != (2 * k if gated else k):
        return (f"x has {x.shape[1]} columns, w [{n}, {k}] needs {2 * k if gated else k}"
                + (" (gate | up)" if gated else ""))
    if k % 16 or n < 1 or w.numel() >= 2 ** 31:
        return f"unsupported size: K = {k} must be a multiple of 16, N = {n} >= 1, N * K < 2^31"
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return "no backward here: inputs that require grad go through the reference"
    return None


def supported(x: torch.Tensor, w: torch.Tensor, *, gated: bool = False) -> bool:
    """Whether `skinny_linear(x, w, gated=gated)` can run (else: use the torch path). Prologue/epilogue tensors
    are checked by skinny_linear itself."""
    return _problem(x, w, gated) is None


def _check_vec(name: str, t: torch.Tensor, size: int, x: torch.Tensor) -> None:
    if t.shape != (size,) or t.dtype != x.dtype or t.device != x.device or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous [{size}] {x.dtype} tensor on {x.device} "
                         f"(got {tuple(t.shape)} {t.dtype} on {t.device})")


def _check_rows(name: str, t: torch.Tensor, m: int, n: int, x: torch.Tensor) -> None:
    if t.shape != (m, n) or t.dtype != x.dtype or t.device != x.device or t.stride(1) != 1:
        raise ValueError(f"{name} must be [{m}, {n}] {x.dtype} on {x.device} with a unit last stride "
                         f"(got {tuple(t.shape)} {t.dtype} on {t.device}, strides {t.stride()})")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two [rows, cols] views (unit last stride) span overlapping bytes (a conservative test)."""
    def span(t):
        start = t.data_ptr()
        return start, start + ((t.shape[0] - 1) * t.stride(0) + t.shape[1]) * t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


# The split-K fixup's arrival counts: one int32 per column block, zero between calls (the last program of a block
# resets its count), one array per weight and block count. Made outside CUDA-graph capture only (a zeroing
# made inside one would run only when that graph replays); a capture that finds none takes the reduce kernel.
# Per weight: one GEMM's programs never meet another's unless the same weight's GEMMs overlap on two streams, which
# the engine never does (the talker's and the code predictor's work is one stream's).
_ARRIVAL_COUNTS: dict[tuple, torch.Tensor] = {}


def _arrival_counts(w: torch.Tensor, blocks: int) -> torch.Tensor | None:
    key = (w.device, w.data_ptr(), blocks)
    counts = _ARRIVAL_COUNTS.get(key)
    if counts is None and not (w.is_cuda and torch.cuda.is_current_stream_capturing()):
        counts = _ARRIVAL_COUNTS[key] = torch.zeros(blocks, dtype=torch.int32, device=w.device)
    return counts


def skinny_linear(x: torch.Tensor, w: torch.Tensor, *, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                  gated: bool = False, out: torch.Tensor | None = None, config: dict | None = None,
                  preload: bool | None = None) -> torch.Tensor:
    """[M, N] in x's dtype: residual + F.linear(a, w, bias), where a = x, rms_norm(x, norm_weight, eps), or
    silu(gate) * up of x = [gate | up] (gated). `out` (optional) may be `residual` itself; it must not overlap x.
    `config` overrides `launch_config` (keys as it returns; missing keys are taken from it). `preload`: the first
    K step's weight tile loaded before the PDL wait (the one-split FMA path only; None: pdl.weight_preload at one
    row; the interpreter tests force it to hold the peeled step to the loop)."""
    problem = _problem(x, w, gated)
    if problem is not None:
        raise ValueError(f"skinny_linear: {problem}")
    if gated and norm_weight is not None:
        raise ValueError("skinny_linear: norm_weight and gated are mutually exclusive prologues")
    m, (n, k) = x.shape[0], w.shape
    if norm_weight is not None:
        _check_vec("norm_weight", norm_weight, k, x)
    if bias is not None:
        _check_vec("bias", bias, n, x)
    if residual is not None:
        _check_rows("residual", residual, m, n, x)
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    else:
        _check_rows("out", out, m, n, x)
        if _overlaps(out, x):
            raise ValueError("skinny_linear: out must not share memory with x (other programs still read x)")

    cfg = launch_config(m, n, k, x.dtype, sm_count(x.device))
    if config:
        unknown = set(config) - set(_CONFIG_KEYS)
        if unknown:
            raise ValueError(f"skinny_linear: unknown config keys {sorted(unknown)}")
        cfg.update(config)
        if "BLOCK_K" not in config and k % cfg["SPLIT_K"] == 0:
            ks = k // cfg["SPLIT_K"]
            cfg["BLOCK_K"] = min(cfg["BLOCK_K"], ks & -ks)      # a split of K must be a whole number of tiles
    bm, bn, bk, split = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
    min_tile = 16 if cfg["USE_DOT"] else 1
    if bm < max(m, min_tile) or k % (bk * split) or min(bn, bk) < min_tile:
        raise ValueError(f"skinny_linear: config {cfg} does not fit M={m}, N={n}, K={k} "
                         f"(BLOCK_M >= M, K % (BLOCK_K * SPLIT_K) == 0, dot tiles >= 16)")

    pdl = use_pdl(x)
    fma_one_split = not cfg["USE_DOT"] and split == 1
    preload = weight_preload(pdl, n, k, m) and fma_one_split if preload is None else bool(preload)
    if preload and not fma_one_split:
        raise ValueError("skinny_linear: the weight preload is for the one-split FMA path")
    # Unused pointer arguments get x (never dereferenced: their constexpr flags compile the loads out).
    ws = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if split > 1 else x
    counts = _arrival_counts(w, triton.cdiv(n, bn)) if split > 1 and cfg.get("FIXUP", True) else None
    res = residual if residual is not None else x
    _skinny_linear_kernel[(triton.cdiv(n, bn), split)](
        x, w, norm_weight if norm_weight is not None else x, bias if bias is not None else x, res, out, ws,
        counts if counts is not None else x,
        m, n, k, k // split, x.stride(0), res.stride(0), out.stride(0), float(k), float(eps),
        NORM=norm_weight is not None, GATED=gated, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        PRECISE_EXP=x.is_cuda, DOT_IN_FP32=not x.is_cuda or x.dtype == torch.float32, USE_DOT=cfg["USE_DOT"],
        SPLIT_K=split, USE_PDL=trigger_mode(pdl, "skinny_linear", preload), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        PRELOAD=preload, FIXUP=counts is not None, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **launch_kwargs(pdl))
    if split > 1 and counts is None:
        _split_k_reduce_kernel[(triton.cdiv(n, 64),)](
            ws, bias if bias is not None else x, res, out, m, n, res.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, HAS_RES=residual is not None, SPLIT_K=split,
            BLOCK_M=triton.next_power_of_2(m), BLOCK_N=64, num_warps=4)
    return out
