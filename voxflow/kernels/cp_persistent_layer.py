"""A code-predictor decoder layer step (one new token per row, 1..MAX_M rows) in ONE persistent launch.

Why: at these sizes every kernel costs ~5-10 us of launch, ramp-up and tail whatever its work (session 13 found
that swapping cuBLAS for fused Triton GEMMs bought nothing for that reason), and a 64-row layer step was ~10
launches, ~37 us for ~9 us of weight reads. Here one grid of (at most) one program per SM runs the layer's phases
back to back, separated by grid-wide barriers (a counter in global memory) instead of kernel boundaries:

    P1  (first layer only) each row's sum of squares of x                        items: rows
    P2  qkv = rstd(x) * (x @ (W_qkv * g_in)^T)                                  tiles of BN_QKV output columns
    P3  att = attention(q/k norm + RoPE, cache[:T] + new k/v); cache[T] = k, v   items (row, KV head)
    P4  h   = x + att @ W_o^T, and per tile the rows' partial sums of squares of h    tiles of BN_O columns
    P5  act = silu(gate) * up of rstd(h) * (h @ (W_gate|up * g_post)^T)          tiles of BN_GU columns
    P6  out = h + act @ W_down^T, and the partial sums of squares of out (the next layer's P2 reads them)

Each program strides over a phase's tiles (tile = pid, pid + grid, ...). The GEMM tiles are [BM rows (M padded to
a power of two >= 16), BN columns] on tensor cores, streaming their W rows along K once. The RMSNorms are folded:
the norm weight into W once (`folded_weights`, W * g in the weight dtype, kept until the weights change) and each
row's rsqrt(mean square + eps) into the GEMM's epilogue, from the sums of squares the phase that wrote the rows left
per column tile (added in a fixed order: deterministic). So every GEMM operand is a plain load with one user, which
Triton's pipeliner streams through shared memory (session 16's first version normed the rows in registers inside
the K loop and took each row's sum of squares in a separate pass: both latency chains; it ran 46 us a layer step
at one row and 102 at 64).

Numerics: q/k norms, RoPE, attention, the residual adds and silu * up have the torch layer's rounding points
(voxflow/layers/qwen3_layer.py; attention_o_proj.py's `_norm_rope_halves`; fma contraction off). The two RMSNorms
in front of GEMMs do not: the reference rounds x * rstd and then * g to the dtype before its GEMM; here x enters
the GEMM unrounded, g is rounded into W * g once, and rstd scales the fp32 sums (as norm_linear.py, plus the
folded weight's rounding). fp32: the reference up to summation order.

The barrier: each program, after a CTA-wide barrier, adds 1 to a global counter with release semantics and spins
(acquire) until it reaches (barrier number) x (grid size); the last program to leave the kernel puts the counters
back to 0 for the next launch. This needs every program resident at once: the grid is at most the SM count, one
program an SM (a program's shared memory and registers fit one SM; a program that waits for an SM held by another
stream's kernel only delays, since that kernel does not wait for this one). Launches that share the counters must
not run concurrently (the code predictor's steps run in order on one stream). Data written in one phase is read in
the next with `.cg` loads (L2, never a stale L1 line).

Under Triton's interpreter (CPU tests) programs run one after another, so a barrier would wait forever: `PHASE`
(a constexpr) then runs one phase a launch, the same tiles and arithmetic; the GPU runs PHASE = 0 (all phases,
with barriers); tests/gpu holds the two equal.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from voxflow.kernels.attention_o_proj import _norm_rope_halves
from voxflow.kernels.cp_layer import LayerWeights
from voxflow.kernels.rms_norm import round_to
from voxflow.kernels.skinny_linear import _silu_mul

MAX_M = 64
MAX_CACHE = 64
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_CONFIG_KEYS = ("BN_QKV", "BN_O", "BN_GU", "BN_DOWN", "BK", "grid", "num_warps", "num_stages")


@triton.jit
def _grid_barrier(bar_ptr, target):
    """Wait until `target` arrivals have been counted (all programs at this barrier), after adding this one."""
    tl.debug_barrier()                      # every thread's stores of this program issued before the release
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    while arrived < target:
        arrived = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _row_rstd(ssq_ptr, rows, r_mask, M, k_float, eps, NT: tl.constexpr, BM: tl.constexpr):
    """rsqrt(mean square + eps) per row [BM] from NT partial sums of squares ssq[NT, M] (added in tile order)."""
    t = tl.arange(0, NT)
    part = tl.load(ssq_ptr + t[None, :] * M + rows[:, None], mask=r_mask[:, None], other=0.0, cache_modifier=".cg")
    return tl.math.rsqrt(tl.div_rn(tl.sum(part, axis=1), k_float) + eps)


@triton.jit
def _gemm_tile(a_ptr, s_a, w_ptr, rows, r_mask, cols, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               DOT_IN_FP32: tl.constexpr):
    """[BM, BN] fp32 sums of a[rows] @ W[cols]^T (W [N, K] row-major: each column's K run is contiguous). Both
    operands are plain loads with one user each: the pipeliner streams them through shared memory."""
    kk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rows[:, None] * s_a + k0 + kk[None, :], mask=r_mask[:, None], other=0.0,
                    cache_modifier=".cg")
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * K + k0 + kk[:, None])            # [BK, BN]
        if DOT_IN_FP32:
            # fp32: ieee keeps fp32 (no TF32); the interpreter multiplies 16-bit operands as raw bits, fp32 is exact
            acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
    return acc


@triton.jit
def _store_rows(ptr, s, rows, r_mask, cols, val):
    tl.store(ptr + rows[:, None] * s + cols[None, :], val.to(ptr.dtype.element_ty), mask=r_mask[:, None])


@triton.jit
def _residual_out(acc, res_ptr, s_res, out_ptr, s_out, ssq_ptr, tile, M, rows, r_mask, cols):
    """out = residual + round(acc), rounded (the torch layer's `x + y`); this tile's per-row sum of squares of out
    -> ssq[tile, rows] (what the next normed GEMM's rstd adds up)."""
    dtype = out_ptr.dtype.element_ty
    r = tl.load(res_ptr + rows[:, None] * s_res + cols[None, :], mask=r_mask[:, None], other=0.0,
                cache_modifier=".cg").to(tl.float32)
    y = round_to(r + round_to(acc, dtype), dtype)
    _store_rows(out_ptr, s_out, rows, r_mask, cols, y)
    tl.store(ssq_ptr + tile * M + rows, tl.sum(y * y, axis=1), mask=r_mask)


@triton.jit
def _attention_item(item, qkv_ptr, att_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, T, scale, inv_d,
                    q_eps, k_eps, s_qkv, s_att, cos_sb, sin_sb, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr):
    """Row b = item // HKV, KV head g = item % HKV: its query heads' attention over cache[:T] and the new token
    -> att[b, those heads]; the new normed, rotated key and the raw value -> cache position T."""
    dtype = kc_ptr.dtype.element_ty
    GROUPS: tl.constexpr = HQ // HKV
    HALF: tl.constexpr = D // 2
    b = item // HKV
    g = item % HKV
    dh = tl.arange(0, HALF)
    d = tl.arange(0, D)
    t = tl.arange(0, BLOCK_T)
    t_mask = t < T
    heads = g * GROUPS + tl.arange(0, GROUPS)
    row = qkv_ptr + b * s_qkv
    qw1 = tl.load(qw_ptr + dh).to(tl.float32)[None, :]
    qw2 = tl.load(qw_ptr + HALF + dh).to(tl.float32)[None, :]
    kw1 = tl.load(kw_ptr + dh).to(tl.float32)[None, :]
    kw2 = tl.load(kw_ptr + HALF + dh).to(tl.float32)[None, :]
    c1 = tl.load(cos_ptr + b * cos_sb + dh).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + b * cos_sb + HALF + dh).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + b * sin_sb + dh).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + b * sin_sb + HALF + dh).to(tl.float32)[None, :]
    qp = row + heads[:, None] * D + dh[None, :]
    q1, q2 = _norm_rope_halves(tl.load(qp, cache_modifier=".cg").to(tl.float32),
                               tl.load(qp + HALF, cache_modifier=".cg").to(tl.float32),
                               qw1, qw2, c1, c2, s1, s2, inv_d, q_eps, dtype)           # [GROUPS, HALF]
    kp = row + HQ * D + g * D + dh[None, :]
    k1, k2 = _norm_rope_halves(tl.load(kp, cache_modifier=".cg").to(tl.float32),
                               tl.load(kp + HALF, cache_modifier=".cg").to(tl.float32),
                               kw1, kw2, c1, c2, s1, s2, inv_d, k_eps, dtype)           # [1, HALF]
    vn = tl.load(row + (HQ + HKV) * D + g * D + d, cache_modifier=".cg")                 # [D]
    kn = kc_ptr + b * sk_b + g * sk_h + T * sk_t + dh[None, :]
    tl.store(kn, k1.to(dtype))
    tl.store(kn + HALF, k2.to(dtype))
    tl.store(vc_ptr + b * sv_b + g * sv_h + T * sv_t + d, vn)
    kc = kc_ptr + b * sk_b + g * sk_h + t[:, None] * sk_t + dh[None, :]                  # [BLOCK_T, HALF]
    ck1 = tl.load(kc, mask=t_mask[:, None], other=0.0).to(tl.float32)
    ck2 = tl.load(kc + HALF, mask=t_mask[:, None], other=0.0).to(tl.float32)
    cv = tl.load(vc_ptr + b * sv_b + g * sv_h + t[:, None] * sv_t + d[None, :], mask=t_mask[:, None],
                 other=0.0).to(tl.float32)                                              # [BLOCK_T, D]
    s = (tl.sum(q1[:, None, :] * ck1[None, :, :], axis=2) + tl.sum(q2[:, None, :] * ck2[None, :, :], axis=2)) * scale
    s = tl.where(t_mask[None, :], s, float("-inf"))                                     # [GROUPS, BLOCK_T]
    s_new = (tl.sum(q1 * k1, axis=1) + tl.sum(q2 * k2, axis=1)) * scale                 # [GROUPS]
    mx = tl.maximum(tl.max(s, axis=1), s_new)
    p = tl.exp(s - mx[:, None])
    p_new = tl.exp(s_new - mx)
    l = tl.sum(p, axis=1) + p_new
    o = tl.sum(p[:, :, None] * cv[None, :, :], axis=1) + p_new[:, None] * vn.to(tl.float32)[None, :]
    att = round_to(o / l[:, None], dtype)                                               # [GROUPS, D]
    tl.store(att_ptr + b * s_att + heads[:, None] * D + d[None, :], att.to(att_ptr.dtype.element_ty))


@triton.jit
def _cp_layer_kernel(x_ptr, qkv_ptr, att_ptr, h_ptr, act_ptr, out_ptr, ssq_x_ptr, ssq_h_ptr, ssq_out_ptr,
                     w_qkv_ptr, qw_ptr, kw_ptr, w_o_ptr, w_gu_ptr, w_down_ptr,
                     cos_ptr, sin_ptr, kc_ptr, vc_ptr, bar_ptr,
                     M, T, in_eps, post_eps, q_eps, k_eps, scale, h_float, inv_d,
                     s_x, s_qkv, s_att, s_h, s_act, s_out, cos_sb, sin_sb, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                     H: tl.constexpr, INTER: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                     BM: tl.constexpr, BK: tl.constexpr, BN_QKV: tl.constexpr, BN_O: tl.constexpr,
                     BN_GU: tl.constexpr, BN_DOWN: tl.constexpr, BLOCK_T: tl.constexpr, SSQ_X_TILES: tl.constexpr,
                     BLOCK_H: tl.constexpr, PHASE: tl.constexpr, PRECISE_EXP: tl.constexpr,
                     DOT_IN_FP32: tl.constexpr):
    """SSQ_X_TILES: how many partial sums of squares of x ssq_x holds (the previous layer's down_proj tiles); 0:
    none, P1 takes them itself (one per row). PHASE 0: all phases with barriers; k = 1..6: phase k alone."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    dtype = x_ptr.dtype.element_ty
    rows = tl.arange(0, BM)
    r_mask = rows < M
    NQKV: tl.constexpr = (HQ + 2 * HKV) * D
    NX: tl.constexpr = 1 if SSQ_X_TILES == 0 else SSQ_X_TILES
    n_barriers = 0
    if SSQ_X_TILES == 0:
        if PHASE == 0 or PHASE == 1:
            hh = tl.arange(0, BLOCK_H)
            for m in range(pid, M, grid):
                v = tl.load(x_ptr + m * s_x + hh, mask=hh < H, other=0.0).to(tl.float32)
                tl.store(ssq_x_ptr + m, tl.sum(v * v, axis=0))
        if PHASE == 0:
            n_barriers += 1
            _grid_barrier(bar_ptr, n_barriers * grid)
    if PHASE == 0 or PHASE == 2:
        for tile in range(pid, NQKV // BN_QKV, grid):
            cols = tile * BN_QKV + tl.arange(0, BN_QKV)
            acc = _gemm_tile(x_ptr, s_x, w_qkv_ptr, rows, r_mask, cols, H, BM, BN_QKV, BK, DOT_IN_FP32)
            rstd = _row_rstd(ssq_x_ptr, rows, r_mask, M, h_float, in_eps, NX, BM)
            _store_rows(qkv_ptr, s_qkv, rows, r_mask, cols, round_to(acc * rstd[:, None], dtype))
    if PHASE == 0:
        n_barriers += 1
        _grid_barrier(bar_ptr, n_barriers * grid)
    if PHASE == 0 or PHASE == 3:
        for item in range(pid, M * HKV, grid):
            _attention_item(item, qkv_ptr, att_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, T, scale,
                            inv_d, q_eps, k_eps, s_qkv, s_att, cos_sb, sin_sb, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                            HQ, HKV, D, BLOCK_T)
    if PHASE == 0:
        n_barriers += 1
        _grid_barrier(bar_ptr, n_barriers * grid)
    if PHASE == 0 or PHASE == 4:
        for tile in range(pid, H // BN_O, grid):
            cols = tile * BN_O + tl.arange(0, BN_O)
            acc = _gemm_tile(att_ptr, s_att, w_o_ptr, rows, r_mask, cols, HQ * D, BM, BN_O, BK, DOT_IN_FP32)
            _residual_out(acc, x_ptr, s_x, h_ptr, s_h, ssq_h_ptr, tile, M, rows, r_mask, cols)
    if PHASE == 0:
        n_barriers += 1
        _grid_barrier(bar_ptr, n_barriers * grid)
    if PHASE == 0 or PHASE == 5:
        for tile in range(pid, INTER // BN_GU, grid):
            cols = tile * BN_GU + tl.arange(0, BN_GU)
            gate = _gemm_tile(h_ptr, s_h, w_gu_ptr, rows, r_mask, cols, H, BM, BN_GU, BK, DOT_IN_FP32)
            up = _gemm_tile(h_ptr, s_h, w_gu_ptr, rows, r_mask, cols + INTER, H, BM, BN_GU, BK, DOT_IN_FP32)
            rstd = _row_rstd(ssq_h_ptr, rows, r_mask, M, h_float, post_eps, H // BN_O, BM)[:, None]
            act = _silu_mul(round_to(gate * rstd, dtype), round_to(up * rstd, dtype), dtype, PRECISE_EXP)
            _store_rows(act_ptr, s_act, rows, r_mask, cols, act)
    if PHASE == 0:
        n_barriers += 1
        _grid_barrier(bar_ptr, n_barriers * grid)
    if PHASE == 0 or PHASE == 6:
        for tile in range(pid, H // BN_DOWN, grid):
            cols = tile * BN_DOWN + tl.arange(0, BN_DOWN)
            acc = _gemm_tile(act_ptr, s_act, w_down_ptr, rows, r_mask, cols, INTER, BM, BN_DOWN, BK, DOT_IN_FP32)
            _residual_out(acc, h_ptr, s_h, out_ptr, s_out, ssq_out_ptr, tile, M, rows, r_mask, cols)
    if PHASE == 0:
        # the last program out resets the counters: every other one has left its last wait by then
        left = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if left == grid - 1:
            tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(bar_ptr + 1, 0, sem="relaxed", scope="gpu")


_COUNTERS: dict = {}


def _barrier_counters(device: torch.device) -> torch.Tensor:
    """int32 [2] zeros per device (arrivals, departures), left at zero by every launch; made on first use (the
    warm-up call before a CUDA-graph capture)."""
    key = str(device)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return _COUNTERS[key]


def _fold(w: torch.Tensor, g: torch.Tensor, make: bool = True) -> torch.Tensor | None:
    """W * g (each input column scaled by its norm weight) in W's dtype, made once per (W, g): kept as an attribute
    of W (so it lives and dies with W) while neither tensor is modified in place (version counters) or g replaced,
    remade otherwise; None when it would have to be made and `make` is off."""
    hit = getattr(w, "_voxflow_norm_folded", None)
    stamp = (w._version, g._version)
    if hit is None or hit[0] is not g or hit[1] != stamp:
        if not make:
            return None
        hit = (g, stamp, (w.float() * g.float()[None, :]).to(w.dtype))
        w._voxflow_norm_folded = hit
    return hit[2]


def folded_weights(w: LayerWeights, make: bool = True) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(W_qkv * g_in, W_gate|up * g_post): the GEMM weights with the RMSNorm weights folded in (None: not made
    yet and `make` off)."""
    qkv, gate_up = _fold(w.qkv, w.input_norm, make), _fold(w.gate_up, w.post_norm, make)
    return None if qkv is None or gate_up is None else (qkv, gate_up)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _largest_pow2_dividing(v: int, cap: int) -> int:
    return min(v & -v, cap)


def launch_config(w: LayerWeights, m: int, device: torch.device) -> dict:
    """Column tiles so that each GEMM phase has ~64-128 tiles at the 1.7B code predictor's widths (q|k|v 4096 / 32,
    o_proj 1024 / 16, gate|up 3072 / 32, down 1024 / 16), K in chunks of 128, one program per SM, 4 pipeline
    stages (session 16 call 2, the first version: 4 stages beat 3 and 2). 4 warps: sm_90, bf16, 64 rows, 236
    registers a thread and no spill (8 warps: 255 and a 192-byte spill)."""
    hidden = w.o.shape[0]
    inter = w.down.shape[1]
    grid = _sm_count(device.index) if device.type == "cuda" else 4
    return dict(BN_QKV=_largest_pow2_dividing(w.qkv.shape[0], 32), BN_O=_largest_pow2_dividing(hidden, 16),
                BN_GU=_largest_pow2_dividing(inter, 32), BN_DOWN=_largest_pow2_dividing(hidden, 16),
                BK=_largest_pow2_dividing(math.gcd(hidden, inter, w.o.shape[1]), 128), grid=grid,
                num_warps=4, num_stages=4)


def _problem(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> str | None:
    """Why `layer_step` cannot run these, or None."""
    dtype = x.dtype
    tensors = (x, w.input_norm, w.qkv, w.q_norm, w.k_norm, w.o, w.post_norm, w.gate_up, w.down, cos, sin, k_cache,
               v_cache)
    if dtype not in _DTYPES or any(t.dtype != dtype for t in tensors):
        return f"all tensors must share a dtype in {_DTYPES}"
    if any(t.device != x.device for t in tensors) or x.device.type not in ("cuda", "cpu"):
        return "all tensors must be on one CUDA (or, interpreted, CPU) device"
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_M or x.stride(1) != 1:
        return f"x must be [1..{MAX_M}, hidden] with a unit last stride"
    m, hidden = x.shape
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or any(t.stride(-1) != 1 for t in (k_cache, v_cache)):
        return "k / v caches must be [B, Hkv, L, D] with a unit last stride"
    b, hkv, max_len, d = k_cache.shape
    hq = w.num_heads
    groups = hq // hkv if hkv else 0
    if (d < 16 or d & (d - 1) or hq % hkv or groups & (groups - 1) or max_len > MAX_CACHE or b < m
            or hidden < 16 or hidden & (hidden - 1)):
        return (f"head_dim {d} (a power of two >= 16), {hq} / {hkv} heads (a power-of-two ratio), cache {max_len}, "
                f"hidden {hidden} (a power of two >= 16)")
    inter = w.gate_up.shape[0] // 2
    want = {"qkv": (w.qkv, ((hq + 2 * hkv) * d, hidden)), "o": (w.o, (hidden, hq * d)),
            "gate_up": (w.gate_up, (2 * inter, hidden)), "down": (w.down, (hidden, inter))}
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape or not t.is_contiguous() or t.numel() >= 2 ** 31:
            return f"{name} weight must be contiguous {shape} (got {tuple(t.shape)})"
    if inter % 16 or (hq * d) % 16:
        return "widths must be multiples of 16"
    for t, n in ((w.input_norm, hidden), (w.post_norm, hidden), (w.q_norm, d), (w.k_norm, d)):
        if t.shape != (n,) or not t.is_contiguous():
            return "norm weights must be contiguous vectors"
    if cos.shape != sin.shape or cos.numel() not in (d, m * d) or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        return "cos / sin must hold one [head_dim] row, or one per row, with a unit last stride"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "no backward here"
    if x.is_cuda and torch.cuda.is_current_stream_capturing() and folded_weights(w, make=False) is None:
        return "the folded weights are made outside a CUDA-graph capture (the warm-up call)"
    return None


def supported(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor) -> bool:
    return _problem(x, w, cos, sin, k_cache, v_cache) is None


def layer_step(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, length: int, *, config: dict | None = None, phased: bool | None = None,
               ssq_in: torch.Tensor | None = None) -> torch.Tensor:
    """The layer on rows x [M, H] (one new token each at cache position `length`; row b's cache is k_cache[b] /
    v_cache[b], written at `length`) -> new rows [M, H] (x unchanged). ssq_in: x's partial sums of squares as the
    previous step left them (`out.ssq`, [tiles, M] fp32), else taken here. The result carries its own as `.ssq`
    (an attribute of the returned tensor) for the next layer. phased: one launch per phase (default: on a CPU, i.e.
    under the interpreter); else one launch with grid barriers."""
    problem = _problem(x, w, cos, sin, k_cache, v_cache)
    if problem is not None:
        raise ValueError(f"cp_persistent_layer: {problem}")
    m, hidden = x.shape
    _, hkv, max_len, d = k_cache.shape
    if not 0 <= length < max_len:
        raise ValueError(f"cp_persistent_layer: cache of {max_len} positions has no room at position {length}")
    cfg = launch_config(w, m, x.device)
    if config:
        unknown = set(config) - set(_CONFIG_KEYS)
        if unknown:
            raise ValueError(f"cp_persistent_layer: unknown config keys {sorted(unknown)}")
        cfg.update(config)
    inter = w.gate_up.shape[0] // 2
    hqd = w.num_heads * d
    for key, width in (("BN_QKV", w.qkv.shape[0]), ("BN_O", hidden), ("BN_GU", inter), ("BN_DOWN", hidden),
                       ("BK", hidden), ("BK", inter), ("BK", hqd)):
        if width % cfg[key] or cfg[key] < 16:
            raise ValueError(f"cp_persistent_layer: {key} = {cfg[key]} must be >= 16 and divide {width}")
    if ssq_in is not None and (ssq_in.dim() != 2 or ssq_in.shape[1] != m or ssq_in.dtype != torch.float32
                               or not ssq_in.is_contiguous() or ssq_in.shape[0] & (ssq_in.shape[0] - 1)):
        raise ValueError("cp_persistent_layer: ssq_in must be a contiguous fp32 [2^k tiles, M] (a step's .ssq)")
    if phased is None:
        phased = not x.is_cuda
    w_qkv, w_gu = folded_weights(w)
    new = functools.partial(torch.empty, dtype=x.dtype, device=x.device)
    qkv, att, h, act, out = new(m, w.qkv.shape[0]), new(m, hqd), new(m, hidden), new(m, inter), new(m, hidden)
    ssq_x = ssq_in if ssq_in is not None else torch.empty(1, m, dtype=torch.float32, device=x.device)
    ssq_h = torch.empty(hidden // cfg["BN_O"], m, dtype=torch.float32, device=x.device)
    ssq_out = torch.empty(hidden // cfg["BN_DOWN"], m, dtype=torch.float32, device=x.device)
    cos2, sin2 = cos.reshape(-1, d), sin.reshape(-1, d)
    bars = _barrier_counters(x.device) if not phased else out
    args = (x, qkv, att, h, act, out, ssq_x, ssq_h, ssq_out, w_qkv, w.q_norm, w.k_norm, w.o, w_gu, w.down,
            cos2, sin2, k_cache, v_cache, bars,
            m, length, float(w.input_eps), float(w.post_eps), float(w.q_eps), float(w.k_eps), float(w.scale),
            float(hidden), 1.0 / d,
            x.stride(0), qkv.stride(0), att.stride(0), h.stride(0), act.stride(0), out.stride(0),
            cos2.stride(0) if cos2.shape[0] > 1 else 0, sin2.stride(0) if sin2.shape[0] > 1 else 0,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2))
    ssq_tiles = ssq_in.shape[0] if ssq_in is not None else 0
    consts = dict(H=hidden, INTER=inter, HQ=w.num_heads, HKV=hkv, D=d, BM=max(16, triton.next_power_of_2(m)),
                  BK=cfg["BK"], BN_QKV=cfg["BN_QKV"], BN_O=cfg["BN_O"], BN_GU=cfg["BN_GU"],
                  BN_DOWN=cfg["BN_DOWN"], BLOCK_T=max(16, triton.next_power_of_2(max_len)), SSQ_X_TILES=ssq_tiles,
                  BLOCK_H=triton.next_power_of_2(hidden), PRECISE_EXP=x.is_cuda,
                  DOT_IN_FP32=x.dtype == torch.float32 or not x.is_cuda,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                  enable_fp_fusion=False)     # the norms' and RoPE's rounding: no fma contraction (as qk_norm_rope)
    grid = (max(1, int(cfg["grid"])),)
    phases = (0,) if not phased else ((2, 3, 4, 5, 6) if ssq_tiles else (1, 2, 3, 4, 5, 6))
    for phase in phases:
        _cp_layer_kernel[grid](*args, PHASE=phase, **consts)
    out.ssq = ssq_out
    return out
