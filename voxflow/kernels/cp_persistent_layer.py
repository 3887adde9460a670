"""A code-predictor decoder layer step (one new token per row, 1..MAX_M rows) in ONE persistent launch.

Why: at these sizes every kernel costs ~5-10 us of launch, ramp-up and tail whatever its work (session 13 found
that swapping cuBLAS for fused Triton GEMMs bought nothing for that reason), and a 64-row layer step was ~10
launches, ~40 us for ~9 us of weight reads. Here one grid of (at most) one program per SM runs the layer's five
phases back to back, separated by grid-wide barriers (a counter in global memory) instead of kernel boundaries:

    P1  qkv = rms_norm(x, input_layernorm) @ W_qkv^T                            tiles of BN_QKV output columns
    P2  att = attention(q/k norm + RoPE, cache[:T] + new k/v); cache[T] = k, v   items (row, KV head)
    P3  h   = x + att @ W_o^T                                                   tiles of BN_O columns
    P4  act = silu(gate) * up of rms_norm(h, post_attention_layernorm) @ W_gate|up^T    tiles of BN_GU columns
    P5  out = h + act @ W_down^T                                                tiles of BN_DOWN columns

Each program strides over a phase's tiles (tile = pid, pid + grid, ...). The GEMM tiles are [BM rows (M padded to
a power of two >= 16), BN columns] on tensor cores, streaming their W rows along K once; the normed phases first
take each row's sum of squares over x (an L2-resident re-read), then normalise each x chunk as it is loaded.

Numerics: the torch layer's rounding points (voxflow/layers/qwen3_layer.py with rms_norm.py): the normed GEMM inputs
are rounded as the RMSNorm module rounds them (x * rstd to the dtype, then * g to the dtype), each GEMM's fp32 sum
rounded once, the residual adds rounded, silu * up as silu_mul.py, the q/k norms, RoPE and attention as
attention_o_proj.py (its `_norm_rope_halves`; fma contraction off). Against the torch layer only the fp32
summation order differs (fp32: ~1e-6 relative; bf16: a rounding flips here and there).

The barrier: each program, after a CTA-wide barrier, adds 1 to a global counter with release semantics and spins
(acquire) until it reaches (barrier number) x (grid size); the last program to leave the kernel puts the counters
back to 0 for the next launch. This needs every program resident at once: the grid is at most the SM count, one
program an SM (a program's shared memory and registers fit one SM many times over; a program that waits for an SM
held by another stream's kernel only delays, since that kernel does not wait for this one). Launches that share
the counters must not run concurrently (the code predictor's steps run in order on one stream). Data written in
one phase is read in the next with `.cg` loads (L2, never a stale L1 line).

Under Triton's interpreter (CPU tests) programs run one after another, so a barrier would wait forever: `PHASE`
(a constexpr) then runs one phase a launch, five launches, the same tiles and arithmetic; the GPU runs PHASE = 0
(all five, with barriers); tests/gpu holds the two equal.
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
def _row_rstd(a_ptr, s_a, rows, r_mask, K, k_float, eps, BM: tl.constexpr, BK: tl.constexpr):
    """rsqrt(mean(a^2) + eps) of each row [BM] (fp32, the mean an IEEE division as torch's)."""
    kk = tl.arange(0, BK)
    ssq = tl.zeros((BM,), tl.float32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rows[:, None] * s_a + k0 + kk[None, :], mask=r_mask[:, None], other=0.0,
                    cache_modifier=".cg").to(tl.float32)
        ssq += tl.sum(a * a, axis=1)
    return tl.math.rsqrt(tl.div_rn(ssq, k_float) + eps)


@triton.jit
def _a_chunk(a_ptr, s_a, rows, r_mask, k0, g_ptr, rstd, NORM: tl.constexpr, BK: tl.constexpr):
    """Rows' K chunk [BM, BK] as the GEMM input: raw, or normed with the RMSNorm module's two roundings."""
    dtype = a_ptr.dtype.element_ty
    kk = k0 + tl.arange(0, BK)
    a = tl.load(a_ptr + rows[:, None] * s_a + kk[None, :], mask=r_mask[:, None], other=0.0, cache_modifier=".cg")
    if NORM:
        g = tl.load(g_ptr + kk).to(tl.float32)
        a = round_to(round_to(a.to(tl.float32) * rstd[:, None], dtype) * g[None, :], dtype).to(dtype)
    return a


@triton.jit
def _dot(a, w_ptr, cols, k0, K, acc, BK: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """acc + a [BM, BK] @ W[cols, k0:k0 + BK]^T (W [N, K] row-major: each column's K run is contiguous)."""
    kk = k0 + tl.arange(0, BK)
    w = tl.load(w_ptr + cols[None, :].to(tl.int64) * K + kk[:, None])         # [BK, BN]
    if DOT_IN_FP32:
        # fp32: ieee keeps fp32 (no TF32); the interpreter multiplies 16-bit operands as raw bits, fp32 is exact
        return tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, w, acc)


@triton.jit
def _gemm_tile(a_ptr, s_a, w_ptr, g_ptr, rows, r_mask, cols, K, k_float, eps, NORM: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """[BM, BN] fp32 sums of (normed) a @ W[cols]^T."""
    rstd = tl.zeros((BM,), tl.float32)
    if NORM:
        rstd = _row_rstd(a_ptr, s_a, rows, r_mask, K, k_float, eps, BM, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        a = _a_chunk(a_ptr, s_a, rows, r_mask, k0, g_ptr, rstd, NORM, BK)
        acc = _dot(a, w_ptr, cols, k0, K, acc, BK, DOT_IN_FP32)
    return acc


@triton.jit
def _store_rows(ptr, s, rows, r_mask, cols, val):
    tl.store(ptr + rows[:, None] * s + cols[None, :], val.to(ptr.dtype.element_ty), mask=r_mask[:, None])


@triton.jit
def _residual_out(acc, res_ptr, s_res, out_ptr, s_out, rows, r_mask, cols):
    """out = residual + round(acc), rounded (the torch layer's `x + y`)."""
    dtype = out_ptr.dtype.element_ty
    r = tl.load(res_ptr + rows[:, None] * s_res + cols[None, :], mask=r_mask[:, None], other=0.0,
                cache_modifier=".cg").to(tl.float32)
    _store_rows(out_ptr, s_out, rows, r_mask, cols, round_to(r + round_to(acc, dtype), dtype))


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
def _cp_layer_kernel(x_ptr, qkv_ptr, att_ptr, h_ptr, act_ptr, out_ptr,
                     in_norm_ptr, w_qkv_ptr, qw_ptr, kw_ptr, w_o_ptr, post_norm_ptr, w_gu_ptr, w_down_ptr,
                     cos_ptr, sin_ptr, kc_ptr, vc_ptr, bar_ptr,
                     M, T, in_eps, post_eps, q_eps, k_eps, scale, h_float, inv_d,
                     s_x, s_qkv, s_att, s_h, s_act, s_out, cos_sb, sin_sb, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                     H: tl.constexpr, INTER: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                     BM: tl.constexpr, BK: tl.constexpr, BN_QKV: tl.constexpr, BN_O: tl.constexpr,
                     BN_GU: tl.constexpr, BN_DOWN: tl.constexpr, BLOCK_T: tl.constexpr, PHASE: tl.constexpr,
                     PRECISE_EXP: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    dtype = x_ptr.dtype.element_ty
    rows = tl.arange(0, BM)
    r_mask = rows < M
    NQKV: tl.constexpr = (HQ + 2 * HKV) * D
    if PHASE == 0 or PHASE == 1:
        for tile in range(pid, NQKV // BN_QKV, grid):
            cols = tile * BN_QKV + tl.arange(0, BN_QKV)
            acc = _gemm_tile(x_ptr, s_x, w_qkv_ptr, in_norm_ptr, rows, r_mask, cols, H, h_float, in_eps, True,
                             BM, BN_QKV, BK, DOT_IN_FP32)
            _store_rows(qkv_ptr, s_qkv, rows, r_mask, cols, round_to(acc, dtype))
    if PHASE == 0:
        _grid_barrier(bar_ptr, grid)
    if PHASE == 0 or PHASE == 2:
        for item in range(pid, M * HKV, grid):
            _attention_item(item, qkv_ptr, att_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, T, scale,
                            inv_d, q_eps, k_eps, s_qkv, s_att, cos_sb, sin_sb, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                            HQ, HKV, D, BLOCK_T)
    if PHASE == 0:
        _grid_barrier(bar_ptr, 2 * grid)
    if PHASE == 0 or PHASE == 3:
        for tile in range(pid, H // BN_O, grid):
            cols = tile * BN_O + tl.arange(0, BN_O)
            acc = _gemm_tile(att_ptr, s_att, w_o_ptr, w_o_ptr, rows, r_mask, cols, HQ * D, h_float, 0.0, False,
                             BM, BN_O, BK, DOT_IN_FP32)
            _residual_out(acc, x_ptr, s_x, h_ptr, s_h, rows, r_mask, cols)
    if PHASE == 0:
        _grid_barrier(bar_ptr, 3 * grid)
    if PHASE == 0 or PHASE == 4:
        for tile in range(pid, INTER // BN_GU, grid):
            cols = tile * BN_GU + tl.arange(0, BN_GU)
            rstd = _row_rstd(h_ptr, s_h, rows, r_mask, H, h_float, post_eps, BM, BK)
            gate = tl.zeros((BM, BN_GU), tl.float32)
            up = tl.zeros((BM, BN_GU), tl.float32)
            for k0 in range(0, H, BK):
                a = _a_chunk(h_ptr, s_h, rows, r_mask, k0, post_norm_ptr, rstd, True, BK)
                gate = _dot(a, w_gu_ptr, cols, k0, H, gate, BK, DOT_IN_FP32)
                up = _dot(a, w_gu_ptr, cols + INTER, k0, H, up, BK, DOT_IN_FP32)
            act = _silu_mul(round_to(gate, dtype), round_to(up, dtype), dtype, PRECISE_EXP)
            _store_rows(act_ptr, s_act, rows, r_mask, cols, act)
    if PHASE == 0:
        _grid_barrier(bar_ptr, 4 * grid)
    if PHASE == 0 or PHASE == 5:
        for tile in range(pid, H // BN_DOWN, grid):
            cols = tile * BN_DOWN + tl.arange(0, BN_DOWN)
            acc = _gemm_tile(act_ptr, s_act, w_down_ptr, w_down_ptr, rows, r_mask, cols, INTER, h_float, 0.0,
                             False, BM, BN_DOWN, BK, DOT_IN_FP32)
            _residual_out(acc, h_ptr, s_h, out_ptr, s_out, rows, r_mask, cols)
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


@functools.lru_cache(maxsize=None)
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _largest_pow2_dividing(v: int, cap: int) -> int:
    return min(v & -v, cap)


def launch_config(w: LayerWeights, m: int, device: torch.device) -> dict:
    """Column tiles so that each GEMM phase has ~64-128 tiles at the 1.7B code predictor's widths (q|k|v 4096 / 32,
    o_proj 1024 / 16, gate|up 3072 / 32, down 1024 / 16), K in chunks of 128, one program per SM; 8 warps from 33
    rows on (sm_90, bf16, 64 rows: 237 registers a thread at 8 warps, 255 and a 40-byte spill at 4)."""
    hidden = w.o.shape[0]
    inter = w.down.shape[1]
    nqkv = w.qkv.shape[0]
    grid = _sm_count(device.index) if device.type == "cuda" else 4
    return dict(BN_QKV=_largest_pow2_dividing(nqkv, 32), BN_O=_largest_pow2_dividing(hidden, 16),
                BN_GU=_largest_pow2_dividing(inter, 32), BN_DOWN=_largest_pow2_dividing(hidden, 16),
                BK=_largest_pow2_dividing(math.gcd(hidden, inter, w.o.shape[1]), 128), grid=grid,
                num_warps=8 if m > 32 else 4, num_stages=3)


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
            or hidden % 16):
        return f"head_dim {d} (a power of two >= 16), {hq} / {hkv} heads (a power-of-two ratio), cache {max_len}"
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
    return None


def supported(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor) -> bool:
    return _problem(x, w, cos, sin, k_cache, v_cache) is None


def layer_step(x: torch.Tensor, w: LayerWeights, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, length: int, *, config: dict | None = None, phased: bool | None = None
               ) -> torch.Tensor:
    """The layer on rows x [M, H] (one new token each at cache position `length`; row b's cache is k_cache[b] /
    v_cache[b], written at `length`) -> new rows [M, H] (x unchanged). phased: one launch per phase (default: on
    a CPU, i.e. under the interpreter); else one launch with grid barriers."""
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
    if phased is None:
        phased = not x.is_cuda
    new = functools.partial(torch.empty, dtype=x.dtype, device=x.device)
    qkv, att, h, act, out = new(m, w.qkv.shape[0]), new(m, hqd), new(m, hidden), new(m, inter), new(m, hidden)
    cos2, sin2 = cos.reshape(-1, d), sin.reshape(-1, d)
    bars = _barrier_counters(x.device) if not phased else out
    args = (x, qkv, att, h, act, out, w.input_norm, w.qkv, w.q_norm, w.k_norm, w.o, w.post_norm, w.gate_up, w.down,
            cos2, sin2, k_cache, v_cache, bars,
            m, length, float(w.input_eps), float(w.post_eps), float(w.q_eps), float(w.k_eps), float(w.scale),
            float(hidden), 1.0 / d,
            x.stride(0), qkv.stride(0), att.stride(0), h.stride(0), act.stride(0), out.stride(0),
            cos2.stride(0) if cos2.shape[0] > 1 else 0, sin2.stride(0) if sin2.shape[0] > 1 else 0,
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2))
    consts = dict(H=hidden, INTER=inter, HQ=w.num_heads, HKV=hkv, D=d, BM=max(16, triton.next_power_of_2(m)),
                  BK=cfg["BK"], BN_QKV=cfg["BN_QKV"], BN_O=cfg["BN_O"], BN_GU=cfg["BN_GU"],
                  BN_DOWN=cfg["BN_DOWN"], BLOCK_T=max(16, triton.next_power_of_2(max_len)),
                  PRECISE_EXP=x.is_cuda, DOT_IN_FP32=x.dtype == torch.float32 or not x.is_cuda,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                  enable_fp_fusion=False)     # the norms' and RoPE's rounding: no fma contraction (as qk_norm_rope)
    grid = (max(1, int(cfg["grid"])),)
    for phase in ((1, 2, 3, 4, 5) if phased else (0,)):
        _cp_layer_kernel[grid](*args, PHASE=phase, **consts)
    return out
