"""A code-predictor decode step's attention and o_proj in one kernel: q/k RMSNorm + RoPE of the new token, the
append of its key/value to the static cache, single-query attention over the cache, o_proj and the residual add.

Before, this was two launches per layer step (dense_decode_norm_rope.py's kernel, one program per KV head, then the
skinny o_proj: 8.5 us together on an H200 at batch 1). Attention at this size is tiny (<= 16 cached keys, 16 query
heads of 128), and o_proj is a sum over heads: y[n] = sum_h W_o[n, h-th D columns] . att_h. So a tile is (a block
of BLOCK_H query heads, a block of BLOCK_N output columns): it computes its heads' attention itself (re-reading the
q|k|v row and those heads' cached keys/values from L2; the other column blocks' tiles of the same heads do the same
work, a small redundancy) and multiplies it into its [BLOCK_N, BLOCK_H * D] slice of W_o (streamed from HBM once in
all). The fp32 partial sums go to a workspace; the last tile of a column block to arrive (an atomic counter per
column block) adds the head blocks' partials in a fixed order (deterministic), rounds, adds the residual. One
launch, no intermediate in a second kernel. (A first design had every program do all 16 heads for 8 columns: the
long dependent chain made it 14.9 us.)

Per tile and row b (rows loop: the code predictor's decode rows are batch rows): load the raw q heads, per query
head the raw k / v of its KV head (GQA by index: query head h reads KV head h // (Hq / Hkv), so a group's key is
normed and rotated once per query head of the block), the cached keys / values [BLOCK_H, BLOCK_T, D] (positions < T,
masked), norm + rotate q and k (exactly qk_norm_rope.py's rounding points, on half rows: rotate-half needs no
permutation that way, and a q.k dot is the sum of two half dots), scores against the cache and the new key, one
fp32 softmax, the weighted sum rounded once to the dtype (as the dense kernels store it), then the W_o slice.
Epilogue as skinny_linear: y rounded to the dtype, residual + y rounded. The tiles of column block 0 alone write
the new normed, rotated keys and raw values into cache position T (each KV head from the first query head of its
group); every tile attends to the new token from registers and reads only positions < T, so nothing reads what is
being written. The counters (`tile_counters`, int32 per column block) are reset by the tile that consumed them.

The body is `_attention_o_proj_tile` (one tile a program).

Registers per thread (sm_90, bf16, M = 1, aligned as the JIT specializes; `python -m voxflow.kernels.compile_check`
prints them): ~168 at the default (4 heads x 32 columns, 4 warps), ~96 at 2 x 64, ~55 at 1 x 32, 255 at 16 x 8
(spilling); 4 heads x 128 columns spills at 4 warps.

Numerics: q/k norms and RoPE are qk_norm_rope's (fma contraction off for the whole kernel, as there); attention is
the dense kernels' fp32 math (the softmax computed directly over the one key tile instead of online: the same up
to fp32 rounding); o_proj sums in fp32. So against dense_decode_norm_rope + skinny o_proj: fp32 within ~1e-6
relative, bf16 mostly bit-equal (an fp32 summation-order difference can flip a bf16 rounding).

The joint form (JOINT, `attention_o_proj(..., joint=True)`): the two rows are consecutive tokens of cache row 0,
the code predictor's 2-token first step at one row (CP_JOINT_PREFILL). Each tile runs the first token, keeps its
normed key and value in registers, then runs the second with that key as one more score beside the cached ones
(column block 0 may be writing it to the cache meanwhile, so no tile reads it there); both are appended, at T and
T + 1. Against two one-token calls: the same cache bits, the output up to the softmax's fp32 summation order.

Sizes (`supported`): head_dim a power of two >= 16, query heads a multiple of the KV heads, the cache at most 64
positions (one key tile), 1..MAX_M rows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from voxflow.kernels import use_pdl
from voxflow.kernels.pdl import launch_kwargs, trigger_mode, wait_for_previous_kernel
from voxflow.kernels.rms_norm import round_to

MAX_M = 8
MAX_CACHE = 64
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_CONFIG_KEYS = ("BLOCK_N", "BLOCK_H", "num_warps")


@triton.jit
def _norm_rope_halves(x1, x2, w1, w2, c1, c2, s1, s2, inv_d, eps, DTYPE: tl.constexpr):
    """Per-head RMSNorm (both halves of each row), the weight, rotate-half RoPE: qk_norm_rope's rounding.
    x1 / x2: fp32 [heads, D/2]; w / c / s: fp32 [1, D/2]."""
    rstd = tl.math.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) * inv_d + eps)[:, None]
    n1 = round_to(round_to(x1 * rstd, DTYPE) * w1, DTYPE)
    n2 = round_to(round_to(x2 * rstd, DTYPE) * w2, DTYPE)
    o1 = round_to(round_to(n1 * c1, DTYPE) + round_to(-n2 * s1, DTYPE), DTYPE)
    o2 = round_to(round_to(n2 * c2, DTYPE) + round_to(n1 * s2, DTYPE), DTYPE)
    return o1, o2


@triton.jit
def _heads_o_proj(h0, nt, b, row, kc_ptr, vc_ptr, w_rows, n_mask, T, T_write, scale, inv_d, q_eps, k_eps,
                  qw1, qw2, kw1, kw2, c1, c2, s1, s2, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, e1, e2, ev,
                  HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_T: tl.constexpr, EXTRA: tl.constexpr):
    """Query heads [h0, h0 + BLOCK_H) of the token at `row` (cache row b, cached positions [0, T)): their attention
    output, times this tile's rows of W_o over those heads' columns -> (the fp32 partial o_proj sums [BLOCK_N], the
    token's normed, rotated key halves and value per query head, for a later token of the same row). Column block
    nt == 0 also writes the new key / value at cache position T_write. EXTRA: the token also attends to an earlier
    new token of its row held in registers (e1, e2, ev: that call's returned key halves and value), which sits
    between the cached positions and its own."""
    dtype = kc_ptr.dtype.element_ty
    GROUPS = HQ // HKV
    HQD = HQ * D
    dh = tl.arange(0, HALF)
    d = tl.arange(0, D)
    t = tl.arange(0, BLOCK_T)
    t_mask = t < T
    heads = h0 + tl.arange(0, BLOCK_H)                                  # [BLOCK_H] query heads
    kvh = heads // GROUPS                                               # their KV heads
    # the new token: the query heads, and per query head its group's key (normed and rotated once per query head:
    # a few redundant FMAs instead of a broadcast across a head axis) and value
    qp = row + heads[:, None] * D + dh[None, :]
    q1, q2 = _norm_rope_halves(tl.load(qp).to(tl.float32), tl.load(qp + HALF).to(tl.float32), qw1, qw2,
                               c1, c2, s1, s2, inv_d, q_eps, dtype)
    kp = row + HQD + kvh[:, None] * D + dh[None, :]
    k1, k2 = _norm_rope_halves(tl.load(kp).to(tl.float32), tl.load(kp + HALF).to(tl.float32), kw1, kw2,
                               c1, c2, s1, s2, inv_d, k_eps, dtype)
    vn = tl.load(row + HQD + HKV * D + kvh[:, None] * D + d[None, :])    # [BLOCK_H, D]
    if nt == 0:
        first = (heads % GROUPS == 0)[:, None]                          # each KV head written once
        kn = kc_ptr + b * sk_b + kvh[:, None] * sk_h + T_write * sk_t + dh[None, :]
        tl.store(kn, k1.to(dtype), mask=first)
        tl.store(kn + HALF, k2.to(dtype), mask=first)
        tl.store(vc_ptr + b * sv_b + kvh[:, None] * sv_h + T_write * sv_t + d[None, :], vn, mask=first)
    # the cached positions [0, T) of each query head's KV head: [BLOCK_H, BLOCK_T, HALF or D]
    c_mask = t_mask[None, :, None]
    kc = kc_ptr + b * sk_b + kvh[:, None, None] * sk_h + t[None, :, None] * sk_t + dh[None, None, :]
    ck1 = tl.load(kc, mask=c_mask, other=0.0).to(tl.float32)
    ck2 = tl.load(kc + HALF, mask=c_mask, other=0.0).to(tl.float32)
    vc = vc_ptr + b * sv_b + kvh[:, None, None] * sv_h + t[None, :, None] * sv_t + d[None, None, :]
    cv = tl.load(vc, mask=c_mask, other=0.0).to(tl.float32)
    # scores [BLOCK_H, BLOCK_T] and the new key's [BLOCK_H]; one fp32 softmax over both
    s = (tl.sum(q1[:, None, :] * ck1, axis=2) + tl.sum(q2[:, None, :] * ck2, axis=2)) * scale
    s = tl.where(t_mask[None, :], s, float("-inf"))
    s_new = (tl.sum(q1 * k1, axis=1) + tl.sum(q2 * k2, axis=1)) * scale
    mx = tl.maximum(tl.max(s, axis=1), s_new)
    if EXTRA:
        s_extra = (tl.sum(q1 * e1, axis=1) + tl.sum(q2 * e2, axis=1)) * scale
        mx = tl.maximum(mx, s_extra)
    p = tl.exp(s - mx[:, None])
    p_new = tl.exp(s_new - mx)
    l = tl.sum(p, axis=1) + p_new
    o = tl.sum(p[:, :, None] * cv, axis=1) + p_new[:, None] * vn.to(tl.float32)
    if EXTRA:
        p_extra = tl.exp(s_extra - mx)
        l += p_extra
        o += p_extra[:, None] * ev.to(tl.float32)
    att = round_to(o / l[:, None], dtype)               # [BLOCK_H, D], rounded as the dense kernels store it
    # o_proj: this program's rows of W_o over these heads' columns, [BLOCK_N, BLOCK_H, D]
    w = tl.load(w_rows + heads[None, :, None] * D + d[None, None, :], mask=n_mask[:, None, None], other=0.0)
    return tl.sum(tl.sum(w.to(tl.float32) * att[None, :, :], axis=2), axis=1), k1, k2, vn


@triton.jit
def _residual_epilogue(acc, res_ptr, out_ptr, offs_n, n_mask):
    """fp32 o_proj sums -> round, residual + y rounded (skinny_linear's epilogue), store."""
    dtype = out_ptr.dtype.element_ty
    r = tl.load(res_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, round_to(r + round_to(acc, dtype), dtype).to(dtype), mask=n_mask)


@triton.jit
def _rope_row(cos_ptr, sin_ptr, b, cos_sb, sin_sb, dh, HALF: tl.constexpr):
    """Row b's RoPE halves as fp32 [1, HALF]: cos[:half], cos[half:], sin[:half], sin[half:]."""
    c1 = tl.load(cos_ptr + b * cos_sb + dh).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + b * cos_sb + HALF + dh).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + b * sin_sb + dh).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + b * sin_sb + HALF + dh).to(tl.float32)[None, :]
    return c1, c2, s1, s2


@triton.jit
def _row_result(part, b, hb, res_ptr, out_ptr, ws_ptr, s_res, s_out, N, offs_n, n_mask, NHB: tl.constexpr):
    """Row b's partial o_proj sums: finished here with one head block, else stored for the column block's last
    tile."""
    if NHB == 1:
        _residual_epilogue(part, res_ptr + b * s_res, out_ptr + b * s_out, offs_n, n_mask)
    else:
        tl.store(ws_ptr + (b * NHB + hb) * N + offs_n, part, mask=n_mask)


@triton.jit
def _attention_o_proj_tile(tile, qkv_ptr, res_ptr, wo_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, out_ptr,
                           ws_ptr, cnt_ptr, M, N, T, scale, inv_d, q_eps, k_eps,
                           s_qkv, s_res, s_out, cos_sb, sin_sb, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                           HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                           BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                           USE_PDL: tl.constexpr, JOINT: tl.constexpr = False):
    """Tile = (head block hb, column block nt), hb fastest: the attention of query heads [hb * BLOCK_H, + BLOCK_H)
    and their share of o_proj for columns [nt * BLOCK_N, + BLOCK_N), all M rows. With one head block the tile
    finishes its columns itself; else it stores fp32 partial sums to ws [M, HQ / BLOCK_H, N] and the last of the
    column block's head-block tiles to arrive (a counter per column block, reset by that tile) adds the partials in
    head-block order (deterministic), then the residual. Tiles with nt == 0 append the new keys / values. The kernel
    below runs one tile a program."""
    NHB: tl.constexpr = HQ // BLOCK_H
    hb = tile % NHB
    nt = tile // NHB
    offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    if USE_PDL:         # pdl.py: nothing read before the previous kernel's results are visible
        wait_for_previous_kernel(USE_PDL)
    dh = tl.arange(0, HALF)
    qw1 = tl.load(qw_ptr + dh).to(tl.float32)[None, :]
    qw2 = tl.load(qw_ptr + HALF + dh).to(tl.float32)[None, :]
    kw1 = tl.load(kw_ptr + dh).to(tl.float32)[None, :]
    kw2 = tl.load(kw_ptr + HALF + dh).to(tl.float32)[None, :]
    w_rows = wo_ptr + offs_n[:, None, None].to(tl.int64) * (HQ * D)            # [BLOCK_N, 1, 1]
    if JOINT:
        # two tokens of cache row 0 (rows 0 and 1 of qkv / residual / out) at positions T and T + 1: the second
        # attends to the first through registers (column block 0 may be writing it to the cache meanwhile)
        c1, c2, s1, s2 = _rope_row(cos_ptr, sin_ptr, 0, cos_sb, sin_sb, dh, HALF)
        part, e1, e2, ev = _heads_o_proj(hb * BLOCK_H, nt, 0, qkv_ptr, kc_ptr, vc_ptr, w_rows, n_mask, T, T, scale,
                                         inv_d, q_eps, k_eps, qw1, qw2, kw1, kw2, c1, c2, s1, s2, sk_b, sk_h, sk_t,
                                         sv_b, sv_h, sv_t, qw1, qw2, qw1, HQ, HKV, D, HALF, BLOCK_H, BLOCK_T, False)
        # (qw1, qw2, qw1: placeholders for the extra key / value, unread with EXTRA off)
        _row_result(part, 0, hb, res_ptr, out_ptr, ws_ptr, s_res, s_out, N, offs_n, n_mask, NHB)
        c1, c2, s1, s2 = _rope_row(cos_ptr, sin_ptr, 1, cos_sb, sin_sb, dh, HALF)
        part, e1, e2, ev = _heads_o_proj(hb * BLOCK_H, nt, 0, qkv_ptr + s_qkv, kc_ptr, vc_ptr, w_rows, n_mask, T,
                                         T + 1, scale, inv_d, q_eps, k_eps, qw1, qw2, kw1, kw2, c1, c2, s1, s2,
                                         sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, e1, e2, ev, HQ, HKV, D, HALF, BLOCK_H,
                                         BLOCK_T, True)
        _row_result(part, 1, hb, res_ptr, out_ptr, ws_ptr, s_res, s_out, N, offs_n, n_mask, NHB)
    else:
        for b in range(0, M):
            c1, c2, s1, s2 = _rope_row(cos_ptr, sin_ptr, b, cos_sb, sin_sb, dh, HALF)
            part, e1, e2, ev = _heads_o_proj(hb * BLOCK_H, nt, b, qkv_ptr + b * s_qkv, kc_ptr, vc_ptr, w_rows,
                                             n_mask, T, T, scale, inv_d, q_eps, k_eps, qw1, qw2, kw1, kw2, c1, c2,
                                             s1, s2, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, qw1, qw2, qw1, HQ, HKV, D,
                                             HALF, BLOCK_H, BLOCK_T, False)
            _row_result(part, b, hb, res_ptr, out_ptr, ws_ptr, s_res, s_out, N, offs_n, n_mask, NHB)
    if NHB > 1:
        tl.debug_barrier()                                              # this tile's partials are all stored
        arrived = tl.atomic_add(cnt_ptr + nt, 1, sem="acq_rel", scope="gpu")
        if arrived == NHB - 1:
            for b in range(0, M):
                acc = tl.zeros((BLOCK_N,), tl.float32)
                for j in tl.static_range(NHB):
                    acc += tl.load(ws_ptr + (b * NHB + j) * N + offs_n, mask=n_mask, other=0.0, cache_modifier=".cg")
                _residual_epilogue(acc, res_ptr + b * s_res, out_ptr + b * s_out, offs_n, n_mask)
            tl.atomic_xchg(cnt_ptr + nt, 0, sem="relaxed", scope="gpu")   # ready for the next launch


@triton.jit
def _attention_o_proj_kernel(qkv_ptr, res_ptr, wo_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, out_ptr,
                             ws_ptr, cnt_ptr, M, N, T, scale, inv_d, q_eps, k_eps,
                             s_qkv, s_res, s_out, cos_sb, sin_sb, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                             HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                             BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                             USE_PDL: tl.constexpr, JOINT: tl.constexpr = False):
    _attention_o_proj_tile(tl.program_id(0), qkv_ptr, res_ptr, wo_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, kc_ptr,
                           vc_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, T, scale, inv_d, q_eps, k_eps, s_qkv, s_res, s_out,
                           cos_sb, sin_sb, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, HQ, HKV, D, HALF, BLOCK_H, BLOCK_T,
                           BLOCK_N, USE_PDL, JOINT)


_COUNTERS: dict = {}


def tile_counters(device: torch.device, n: int) -> torch.Tensor:
    """int32 [n] zeros, one per column block, kept per device and size (each launch leaves them at 0 again), made
    on first use (the warm-up call before a CUDA-graph capture, normally)."""
    key = (str(device), n)
    counters = _COUNTERS.get(key)
    if counters is None:
        counters = _COUNTERS[key] = torch.zeros(n, dtype=torch.int32, device=device)
    return counters


def _pow2_floor(v: int) -> int:
    return 1 << (max(v, 1).bit_length() - 1)


def launch_config(n: int, num_heads: int) -> dict:
    """Four query heads (two KV groups at 16 / 8) by 32 columns a tile: 4 x 32 = 128 programs at the 1.7B shapes,
    each with a W_o tile of 32 x 512 (32 KB) and 1/4 of the attention; 4 warps. H200, bf16, one row
    (benchmarks/scripts/tune_cp_layer.py, session 9 call 2): 6.68 us vs 7.49 at two heads by 64 columns (one
    program doing all 16 heads for 8 columns, the first design, took 14.9 us)."""
    return dict(BLOCK_N=min(32, max(16, triton.next_power_of_2(n) // 16)), BLOCK_H=min(4, num_heads & -num_heads),
                num_warps=4)


def _pow2(v: int) -> bool:
    return v >= 1 and v & (v - 1) == 0


def _problem(residual, w_o, q_weight, k_weight, cos, sin, k_cache, v_cache, num_heads, qkv=None,
             qkv_width=None, joint=False) -> str | None:
    """Why the kernel cannot run, or None. The q|k|v input is checked as the tensor `qkv`, or (before it exists,
    for a caller that checks a whole layer up front) only by its width. joint: two tokens of cache row 0."""
    tensors = (residual, w_o, q_weight, k_weight, cos, sin, k_cache, v_cache) + ((qkv,) if qkv is not None else ())
    dtype = residual.dtype
    if dtype not in _DTYPES or any(t.dtype != dtype for t in tensors):
        return f"all tensors must share a dtype in {_DTYPES}"
    if any(t.device != residual.device for t in tensors) or residual.device.type not in ("cuda", "cpu"):
        return "all tensors must be on one CUDA (or, interpreted, CPU) device"
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or any(t.stride(-1) != 1 for t in (k_cache, v_cache)):
        return "k / v caches must be [B, Hkv, L, D] with a unit last stride"
    b, hkv, max_len, d = k_cache.shape
    if d < 16 or not _pow2(d) or num_heads % hkv or max_len > MAX_CACHE:
        return f"head_dim {d} (a power of two >= 16), {num_heads} / {hkv} heads (a multiple), cache {max_len}"
    if residual.dim() != 2 or w_o.dim() != 2:
        return "residual and w_o must be 2-D"
    m, n = residual.shape
    width = (num_heads + 2 * hkv) * d
    if qkv is not None:
        if qkv.dim() != 2 or qkv.shape[0] != m or qkv.stride(1) != 1:
            return f"qkv must be [{m}, {width}] with a unit last stride (got {tuple(qkv.shape)})"
        qkv_width = qkv.shape[1]
    if joint and m != 2:
        return f"joint: two tokens (rows), got {m}"
    if not 1 <= m <= min(MAX_M, 2 if joint else b) or qkv_width != width or w_o.shape != (n, num_heads * d):
        return (f"shapes: qkv width {qkv_width}, residual {tuple(residual.shape)}, w_o {tuple(w_o.shape)}, "
                f"cache batch {b}")
    if residual.stride(1) != 1 or not w_o.is_contiguous() or w_o.numel() >= 2 ** 31:
        return "residual needs a unit last stride, w_o must be contiguous"
    if any(t.shape != (d,) or not t.is_contiguous() for t in (q_weight, k_weight)):
        return "norm weights must be contiguous [head_dim]"
    if cos.shape != sin.shape or cos.numel() not in (d, m * d) or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        return "cos / sin must hold one [head_dim] row, or one per row, with a unit last stride"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "no backward here"
    return None


def supported(qkv: torch.Tensor | None, residual: torch.Tensor, w_o: torch.Tensor, q_weight: torch.Tensor,
              k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, num_heads: int, *, qkv_width: int | None = None, joint: bool = False) -> bool:
    """Whether `attention_o_proj` takes these (qkv None: judged by `qkv_width` alone)."""
    return _problem(residual, w_o, q_weight, k_weight, cos, sin, k_cache, v_cache, num_heads, qkv, qkv_width,
                    joint) is None


def attention_o_proj(qkv: torch.Tensor, residual: torch.Tensor, w_o: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, q_eps: float, k_eps: float, cos: torch.Tensor, sin: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, length: int, num_heads: int, scale: float, *,
                     out: torch.Tensor | None = None, config: dict | None = None, joint: bool = False
                     ) -> torch.Tensor:
    """residual + o_proj(attention(rope(norm(q)), cache[:length] + [rope(norm(k))], cache[:length] + [v])) -> [M, N].

    qkv [M, (Hq + 2 Hkv) * D]: one token per row, the raw q | k | v projections (row b's cache is k_cache[b]);
    residual [M, N]; w_o [N, Hq * D]; cos / sin: the token's RoPE row(s), [..., D] (one, or one per row); caches
    [B >= M, Hkv, L > length, D], updated at position `length`. `out` may be `residual` (in place).
    joint: the two rows are consecutive tokens of cache row 0 (the code predictor's 2-token first step at one row,
    positions `length` and `length` + 1, cos / sin one row each): the second attends to the first too (causal),
    and both are appended."""
    problem = _problem(residual, w_o, q_weight, k_weight, cos, sin, k_cache, v_cache, num_heads, qkv, joint=joint)
    if problem is not None:
        raise ValueError(f"attention_o_proj: {problem}")
    m, n = residual.shape
    _, hkv, max_len, d = k_cache.shape
    if not 0 <= length <= max_len - (2 if joint else 1):
        raise ValueError(f"attention_o_proj: cache of {max_len} positions has no room for {2 if joint else 1} at "
                         f"position {length}")
    if joint and cos.numel() != 2 * d:
        raise ValueError("attention_o_proj: joint takes one RoPE row per token")
    cfg = launch_config(n, num_heads)
    if config:
        unknown = set(config) - set(_CONFIG_KEYS)
        if unknown:
            raise ValueError(f"attention_o_proj: unknown config keys {sorted(unknown)}")
        cfg.update(config)
    if num_heads % cfg["BLOCK_H"] or not _pow2(cfg["BLOCK_H"]):
        raise ValueError(f"attention_o_proj: BLOCK_H = {cfg['BLOCK_H']} must be a power of two dividing {num_heads}")
    if out is None:
        out = torch.empty(m, n, dtype=qkv.dtype, device=qkv.device)
    elif out.shape != (m, n) or out.dtype != qkv.dtype or out.stride(1) != 1:
        raise ValueError(f"attention_o_proj: out must be [{m}, {n}] {qkv.dtype} with a unit last stride")
    cos2, sin2 = cos.reshape(-1, d), sin.reshape(-1, d)
    n_tiles, nhb = triton.cdiv(n, cfg["BLOCK_N"]), num_heads // cfg["BLOCK_H"]
    ws = torch.empty(m, nhb, n, dtype=torch.float32, device=qkv.device) if nhb > 1 else out
    counters = tile_counters(qkv.device, n_tiles) if nhb > 1 else out
    pdl = use_pdl(qkv)
    _attention_o_proj_kernel[(nhb * n_tiles,)](
        qkv, residual, w_o, q_weight, k_weight, cos2, sin2, k_cache, v_cache, out, ws, counters,
        m, n, length, float(scale), 1.0 / d, float(q_eps), float(k_eps),
        qkv.stride(0), residual.stride(0), out.stride(0),
        cos2.stride(0) if cos2.shape[0] > 1 else 0, sin2.stride(0) if sin2.shape[0] > 1 else 0,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2),
        HQ=num_heads, HKV=hkv, D=d, HALF=d // 2, BLOCK_H=cfg["BLOCK_H"],
        BLOCK_T=max(16, triton.next_power_of_2(max_len)), BLOCK_N=cfg["BLOCK_N"],
        USE_PDL=trigger_mode(pdl, "attention_o_proj"), JOINT=joint,
        num_warps=cfg["num_warps"], **launch_kwargs(pdl),
        enable_fp_fusion=False)   # qk_norm_rope's rounding: no fma contraction in the norms and the rotation
    return out
