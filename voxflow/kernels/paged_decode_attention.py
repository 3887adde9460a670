"""Decode attention (one new query per row) straight from the paged KV pool, and its plain torch reference.

    paged_decode_attention(q, k_pool, v_pool, block_tables, context_lens, scale) -> out
        q            [B, Hq, D]   the new token's queries (already normed and rotated)
        k/v_pool     [num_blocks, block_size, Hkv, D]   one layer's pages (the new token already written)
        block_tables [B, W]       row b's pages in order (-1 = unused; never read past the context)
        context_lens [B]          row b's tokens, the new one included
        out          [B, Hq, D]   in q's dtype; query head h reads KV head h // (Hq // Hkv)

Why a kernel: the reference path (`voxflow.layers.paged_attention`) gathers each row's whole context into a
dense [B, Hkv, W * block_size, D] copy every layer and step, then runs masked eager attention over the full
table width. The kernel reads each row's pages in place and stops at the row's own length (on an H200 at the
talker's head shapes, bf16, in CUDA graphs: 6-9x faster than that path, e.g. 0.52 ms instead of 4.1 ms for
64 rows x 4096 tokens, about 2 TB/s of K/V read).

How: one program per (row, KV head, split). It loads the GROUP = Hq // Hkv query heads that share the KV head
once, walks the row's tokens BLOCK_N at a time (looking each token's page up in the block table, so a tile may
span pages and any block size works), and keeps an fp32 online softmax (running max, running sum, rescaled
accumulator; exp2 with log2(e) folded into the scale). The loop bound is `context_lens[b]` loaded on the
device: no host read, so a call with a fixed table width is CUDA-graph capturable whatever the lengths.
Scores are broadcast-multiply-sums on CUDA cores rather than tl.dot: with GROUP = 2 the "matrix" has 2 rows,
decode is bound by reading K/V, and fp32 inputs then stay true fp32 (no TF32). That keeps tiles small (16 tokens)
and programs many. The tensor-core variant (`tensor_cores`, TENSOR_CORES) is for batches that fill the GPU on their
own (bf16 / fp16 pools): 32-token tiles whose K and V are requested together, the group's query heads padded to 16
rows so that the scores and the weighted sum are MMAs (the scores exact in the fp32 accumulator; the softmax weights
rounded to TF32 for the weighted sum, the same rounded weights normalising it). Forced on an fp32 pool (tests) it
computes IEEE fp32 dots, on CUDA cores.

Split-K ("flash-decoding"): one program per (row, KV head) is too few to keep the GPU's memory system busy
(B * Hkv = 512 programs at B = 64 is under 8 warps per SM), so the token range [0, W * block_size) is cut into
`num_splits` chunks, each program writes its chunk's unnormalised (max, sum, accumulator), and a second
small kernel merges them. The split count depends only on host-known numbers (B, Hkv, W, the GPU's SM count),
never on the lengths, so graph capture still works; each row's own length is cut into the chunks on the device
(a 200-token context at B = 1 runs as ~13 one-tile programs per KV head, not one 13-tile program), and chunks
past it run zero iterations.

An fp8 pool (EngineConfig.kv_cache_dtype = "fp8": e4m3, unscaled) halves what the kernel reads; its tiles widen to
the queries' dtype (exactly) as they load, so the math is the same as over a pool holding those rounded values in
bf16, and the new token is rounded to the pool's dtype in the kernel before it is stored and attended to.

A row with context_lens 0 (e.g. batch padding) yields zeros, never NaN, and never touches its table.
"""
from __future__ import annotations

import math
import os

import torch

from voxflow.kernels import FP8_KV, as_stored, env_int, sm_count, use_pdl

try:
    import triton
    import triton.language as tl

    from voxflow.kernels.pdl import launch_kwargs, trigger_mode, wait_for_previous_kernel
except ImportError:  # the reference below still works; callers check voxflow.kernels.use_kernels first
    triton = None


# ------------------------------------------------------------------------------------------ reference
def gather_slots(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """pool [blocks, block_size, Hkv, D] at flat slots [...] -> [..., Hkv, D] in the pool's dtype (bytes moved)."""
    return as_stored(pool).reshape(-1, *pool.shape[2:])[slots].view(pool.dtype)


def paged_decode_attention_ref(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """The kernel's contract in plain torch: gather each row's context from its pages, attend in fp32."""
    batch, width = block_tables.shape
    block_size, hkv, d = k_pool.shape[1:]
    groups = q.shape[1] // hkv
    t = torch.arange(width * block_size, device=q.device)                              # token index in the row
    valid = t[None, :] < context_lens.to(q.device, torch.long)[:, None]                # [B, T]
    pages = block_tables.to(torch.long).gather(1, (t // block_size).expand(batch, -1))  # [B, T]
    slots = torch.where(valid, pages * block_size + t % block_size, 0)                  # invalid: any real slot
    k = gather_slots(k_pool, slots).float()                                            # [B, T, Hkv, D]
    v = gather_slots(v_pool, slots).float()
    # Zero what lies past the context: unwritten pages may hold NaN, and 0 * NaN would poison the sum.
    k = torch.where(valid[:, :, None, None], k, 0.0).repeat_interleave(groups, dim=2)  # [B, T, Hq, D]
    v = torch.where(valid[:, :, None, None], v, 0.0).repeat_interleave(groups, dim=2)
    scores = torch.einsum("bhd,bthd->bht", q.float(), k) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)                            # empty rows -> zeros
    return torch.einsum("bht,bthd->bhd", weights, v).to(q.dtype)


# ------------------------------------------------------------------------------------------- kernels
if triton is not None:
    @triton.jit
    def page_slots(table_row, tok, ok, stride_tw, PAGE: tl.constexpr):
        """Page (int64, so page * stride cannot overflow on big pools) and in-page position of each token of a
        sequence whose block-table row is `table_row`; masked lanes read nothing (page 0)."""
        page = tl.load(table_row + (tok // PAGE) * stride_tw, mask=ok, other=0).to(tl.int64)
        return page, tok % PAGE

    @triton.jit
    def kv_tile_offsets(page, pos, kv_head, d, stride_blk, stride_pos, stride_h, stride_d):
        """[N, D] element offsets of one KV head's tile at those pages / positions (in page's integer type)."""
        return (page * stride_blk + pos * stride_pos + kv_head * stride_h)[:, None] + d[None, :] * stride_d

    @triton.jit
    def load_kv_tile(ptr, page, pos, kv_head, d, mask, stride_blk, stride_pos, stride_h, stride_d):
        """[N, D] keys or values of one KV head at those pages / positions, in the pool's dtype (masked: 0)."""
        return tl.load(ptr + kv_tile_offsets(page, pos, kv_head, d, stride_blk, stride_pos, stride_h, stride_d),
                       mask=mask, other=0.0)

    @triton.jit
    def round_to_tf32(x):
        """Non-negative fp32 values rounded to TF32's 10-bit mantissa (to nearest; the carry may move the exponent).
        A TF32 MMA would otherwise drop the low 13 bits, a bias toward zero of up to 2^-10."""
        bits = x.to(tl.int32, bitcast=True)
        return ((bits + 0x1000) & -0x2000).to(tl.float32, bitcast=True)

    @triton.jit
    def _paged_decode_kernel(
            q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
            kn_ptr, vn_ptr, slot_ptr,
            scale_log2,
            stride_qb, stride_qh, stride_qd,
            stride_knb, stride_knh, stride_vnb, stride_vnh,
            stride_kblk, stride_kpos, stride_kh, stride_kd,
            stride_vblk, stride_vpos, stride_vh, stride_vd,
            stride_tb, stride_tw,
            stride_ob, stride_oh, stride_od,
            GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
            PAGE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, APPEND: tl.constexpr,
            TENSOR_CORES: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
            SMALL_POOL: tl.constexpr, USE_PDL: tl.constexpr, LOOP_STAGES: tl.constexpr):
        if USE_PDL:             # pdl.py: nothing read before the previous kernel's results are visible
            wait_for_previous_kernel(USE_PDL)
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        n = tl.arange(0, BLOCK_N)
        g_ok = g < GROUP
        d_ok = d < HEAD_DIM
        heads = kv_head * GROUP + g
        q_mask = g_ok[:, None] & d_ok[None, :]
        q_in = tl.load(q_ptr + row * stride_qb + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                       mask=q_mask, other=0.0)                                               # [G, D]
        q = q_in.to(tl.float32)
        q_dot = q_in.to(DOT_DTYPE)                         # TENSOR_CORES: the scores' MMA operand (padded rows: 0)

        ctx = tl.load(lens_ptr + row).to(tl.int32)
        if APPEND:
            # The new token (the context's last) comes in kn/vn: the pages hold the ctx - 1 before it.
            ctx = tl.maximum(ctx - 1, 0)
        # Each row's OWN context is cut into NUM_SPLITS chunks of whole tiles (bounds read on the device): a short
        # context then spreads over the splits too, instead of sitting in the first chunk of the table's width.
        tokens_per_split = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = split * tokens_per_split
        hi = tl.minimum(lo + tokens_per_split, ctx)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max of the log2-scaled scores
        s_sum = tl.zeros([BLOCK_G], tl.float32)            # running sum of exp2(score - m)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)     # running sum of exp2(score - m) * v
        table_row = table_ptr + row * stride_tb
        # LOOP_STAGES > 1: Triton's software pipeline over the tiles (cp.async, K/V of later tiles in flight while
        # this one computes); 1: none, each tile's loads wait in turn (the plain loop's code; a launch's num_stages
        # does not pipeline this loop: no cp.async in its PTX).
        for start in tl.range(lo, hi, BLOCK_N, num_stages=LOOP_STAGES):
            tok = start + n
            ok = tok < hi
            page, pos = page_slots(table_row, tok, ok, stride_tw, PAGE)
            kv_mask = ok[:, None] & d_ok[None, :]
            if TENSOR_CORES:
                # Both tiles requested before any arithmetic (one memory round trip a tile), scores on the tensor
                # cores: products of the pool's dtype are exact in the fp32 accumulator.
                # One offset tensor for both pools (the wrapper checks that their strides are equal), in int32 when
                # every offset of the pools fits: 64-bit offsets for [N, D] tiles cost registers (sm_90, 32-token
                # tiles, 4 warps: 192 a thread against 158; 64-token tiles, 8 warps: 196 against 128).
                first = page.to(tl.int32) if SMALL_POOL else page
                offs = kv_tile_offsets(first, pos, kv_head, d, stride_kblk, stride_kpos, stride_kh, stride_kd)
                k = tl.load(k_ptr + offs, mask=kv_mask, other=0.0)                              # [N, D]
                v = tl.load(v_ptr + offs, mask=kv_mask, other=0.0)
                scores = tl.dot(q_dot, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * scale_log2
            else:
                k = load_kv_tile(k_ptr, page, pos, kv_head, d, kv_mask, stride_kblk, stride_kpos, stride_kh,
                                 stride_kd).to(tl.float32)                                     # [N, D]
                scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale_log2        # [G, N]
            scores = tl.where(ok[None, :], scores, float("-inf"))
            # The first token of every tile is inside the context, so m_new is finite from the first tile on.
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            alpha = tl.exp2(m - m_new)                     # exp2(-inf) = 0 on the first tile
            p = tl.exp2(scores - m_new[:, None])
            if TENSOR_CORES and DOT_PRECISION == "tf32":
                # The weights the MMA below will use, rounded once, and the same ones normalise: the output is a
                # weighted mean whose weights are off by <= 2^-11 (relative), unbiased.
                p = round_to_tf32(p)
            s_sum = s_sum * alpha + tl.sum(p, axis=1)
            if TENSOR_CORES:
                # p is exact in TF32 now (rounded above: ~2^-11, against 2^-8 were it cast to bf16); the values are
                # exact in TF32 when the pool is bf16 / fp16.
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision=DOT_PRECISION)
            else:
                v = load_kv_tile(v_ptr, page, pos, kv_head, d, kv_mask, stride_vblk, stride_vpos, stride_vh,
                                 stride_vd).to(tl.float32)                                     # [N, D]
                acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m = m_new

        if APPEND:
            # Split 0 writes the new token's key/value into its page slot (the KV write that was two scatter
            # kernels per layer) and attends to it from registers; no program reads that slot in this call.
            if split == 0:
                # Rounded to the pools' dtype first (a no-op when it is theirs already; to fp8 saturating on the
                # GPU), so the token attended to here is the one stored, as later steps will read it.
                kn = tl.load(kn_ptr + row * stride_knb + kv_head * stride_knh + d, mask=d_ok,
                             other=0.0).to(k_ptr.dtype.element_ty)
                vn = tl.load(vn_ptr + row * stride_vnb + kv_head * stride_vnh + d, mask=d_ok,
                             other=0.0).to(v_ptr.dtype.element_ty)
                slot = tl.load(slot_ptr + row).to(tl.int64)
                page, pos = slot // PAGE, slot % PAGE
                tl.store(k_ptr + page * stride_kblk + pos * stride_kpos + kv_head * stride_kh + d * stride_kd,
                         kn.to(k_ptr.dtype.element_ty), mask=d_ok)
                tl.store(v_ptr + page * stride_vblk + pos * stride_vpos + kv_head * stride_vh + d * stride_vd,
                         vn.to(v_ptr.dtype.element_ty), mask=d_ok)
                if tl.load(lens_ptr + row) > 0:
                    score = tl.sum(q * kn.to(tl.float32)[None, :], axis=1) * scale_log2                 # [G]
                    m_new = tl.maximum(m, score)
                    alpha = tl.exp2(m - m_new)
                    p_new = tl.exp2(score - m_new)
                    s_sum = s_sum * alpha + p_new
                    acc = acc * alpha[:, None] + p_new[:, None] * vn.to(tl.float32)[None, :]
                    m = m_new

        if NUM_SPLITS == 1:
            # No token (empty row): s_sum == 0 and acc == 0, so the output is 0 instead of 0 / 0.
            out = acc / tl.where(s_sum > 0, s_sum, 1.0)[:, None]
            tl.store(out_ptr + row * stride_ob + heads[:, None] * stride_oh + d[None, :] * stride_od,
                     out.to(out_ptr.dtype.element_ty), mask=q_mask)
        else:
            # Partials laid out [B, Hq, NUM_SPLITS] and [B, Hq, NUM_SPLITS, HEAD_DIM], contiguous.
            part = (row * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split                  # [G]
            tl.store(part_m_ptr + part, m, mask=g_ok)
            tl.store(part_l_ptr + part, s_sum, mask=g_ok)
            tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=q_mask)

    @triton.jit
    def _combine_splits_kernel(part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, stride_ob, stride_oh, stride_od,
                               NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                               NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            wait_for_previous_kernel(USE_PDL)
        row = tl.program_id(0)
        head = tl.program_id(1)
        s = tl.arange(0, BLOCK_S)
        d = tl.arange(0, BLOCK_D)
        s_ok = s < NUM_SPLITS
        d_ok = d < HEAD_DIM
        base = (row * NUM_HEADS + head) * NUM_SPLITS
        m = tl.load(part_m_ptr + base + s, mask=s_ok, other=float("-inf"))
        part_sum = tl.load(part_l_ptr + base + s, mask=s_ok, other=0.0)
        acc = tl.load(part_acc_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :],
                      mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        m_all = tl.max(m, axis=0)
        m_all = tl.where(m_all == float("-inf"), 0.0, m_all)   # every split empty: keep exp2 finite (weights 0)
        w = tl.exp2(m - m_all)                                 # empty splits (m = -inf) weigh 0
        total = tl.sum(w * part_sum, axis=0)
        out = tl.sum(w[:, None] * acc, axis=0) / tl.where(total > 0, total, 1.0)
        tl.store(out_ptr + row * stride_ob + head * stride_oh + d * stride_od, out.to(out_ptr.dtype.element_ty),
                 mask=d_ok)


# ------------------------------------------------------------------------------------------- wrapper
# Measured on an H200 (bf16, 16 query / 8 KV heads, head_dim 128, contexts 1024-4096, B 1-64): 2-warp programs
# of 16-token tiles with 16-32 splits ran 1.3-1.8x faster than one 4-warp program per (row, KV head) with 32-token
# tiles (B = 64, 4096 tokens: 514 us, about 2.1 TB/s of K/V; unsplit 4-warp: 930 us). Triton's num_stages made
# no difference.
PROGRAMS_PER_SM = 64
MIN_TOKENS_PER_SPLIT = 64    # shorter chunks: the partial write + merge outweighs the parallelism they add
MAX_SPLITS = 32
# The tensor-core variant (TENSOR_CORES): wide tiles whose K and V are requested together, scores and the weighted
# sum as MMAs with the group's query heads padded to 16 rows. Fewer, fatter programs, so it takes over once the
# batch alone gives every SM a program (B * Hkv >= SMs), with enough splits for TC_PROGRAMS_PER_SM programs an SM.
# H200, 64 / 256 rows, contexts 64-1024, the new token appended (benchmarks/results/h200/2026-12-03-session18,
# call 3): 32-token tiles, 4 warps, one split were the fastest everywhere, 1.9-2.4x / 1.8x faster than the CUDA-core
# variant (64 rows x 128 tokens: 14.3 us against 29.8); 64-token tiles (8 warps) and 2-4 splits were slower. Not
# measured between 17 and 63 rows, which get 2-3 splits by TC_PROGRAMS_PER_SM.
TC_TILE = 32
TC_WARPS = 4
TC_STAGES = 2
TC_PROGRAMS_PER_SM = 3       # 64 rows x 8 KV heads: one split; 17 rows: three
# Pools the variant takes by default: half-precision ones, and fp8 (EngineConfig.kv_cache_dtype), whose tiles widen
# to the queries' dtype in registers.
TC_POOL_DTYPES = (torch.bfloat16, torch.float16, FP8_KV)
_TC_OVERRIDE = os.environ.get("VOXFLOW_PAGED_DECODE_TC")     # "1" / "0": always / never (A/B runs); unset: by batch
# A register cap a thread for the tensor-core variant (maxnreg), for A/B runs: unset = none. The plain loop took 158
# registers at bf16 (three programs an SM), capped at 128 four; the pipelined loop (the default) takes 128 uncapped.
# Session 50-51's probe_kv_fp8.py --regs.
_TC_MAXNREG = env_int("VOXFLOW_PAGED_DECODE_MAXNREG", None)
# The tensor-core variant's tile loop software-pipelined over this many stages (the kernel's LOOP_STAGES: the next
# tiles' loads in flight as cp.async while this one's MMAs run). Unpipelined (1), each tile's loads waited in turn and
# the variant read 2.0 TB/s. Session 51 call 1 (H100, a 0.6B c=64 step's 28 layers, contexts 173-321): 0.929 -> 0.809
# ms at 2 stages (128 registers, no spill), 0.814 at 3; 0.6B c=64 offline 705.8 / 711.8 -> 754.3 / 751.8 audio-s/s
# (alternating; full steps 6.67 -> 6.22 ms). VOXFLOW_PAGED_DECODE_STAGES overrides it (1: the old loop).
TC_LOOP_STAGES = 2
_TC_LOOP_STAGES = env_int("VOXFLOW_PAGED_DECODE_STAGES", TC_LOOP_STAGES)
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"      # read once, as Triton does when it is imported


def default_num_splits(batch: int, num_kv_heads: int, max_tokens: int, device: torch.device) -> int:
    """Enough splits for ~PROGRAMS_PER_SM programs per SM, none shorter than MIN_TOKENS_PER_SPLIT tokens.
    Host-known inputs only (the table width, not the lengths), so the choice is fixed for a captured graph."""
    if device.type != "cuda":
        return 1
    programs = max(1, batch * num_kv_heads)
    want = math.ceil(PROGRAMS_PER_SM * sm_count(device) / programs)
    return max(1, min(want, MAX_SPLITS, math.ceil(max_tokens / MIN_TOKENS_PER_SPLIT)))


def _dot_dtype(q_dtype: torch.dtype):
    """The scores' MMA operands: the queries' dtype (the pool's, or what an fp8 pool's keys widen to, exactly); fp32
    under Triton's interpreter (CPU tests), whose bf16 tl.dot is wrong (a 16 x 16 bf16 product off by 1e10 in
    triton 3.9). A bf16 / fp16 value is exact in TF32, so the fp32 operands give the same products."""
    if _INTERPRETED:
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(q_dtype, tl.float32)


def tensor_core_shapes_ok(group: int, head_dim: int) -> bool:
    """An MMA needs >= 16 along every dimension: the group padded to 16 rows (so at most 16), head_dim >= 16."""
    return group <= 16 and head_dim >= 16


def default_tensor_cores(batch: int, num_kv_heads: int, group: int, head_dim: int, device: torch.device,
                         pool_dtype: torch.dtype = torch.bfloat16) -> bool:
    """The tensor-core variant for bf16 / fp16 / fp8 pools and batches that fill the SMs on their own (see TC_TILE).
    VOXFLOW_PAGED_DECODE_TC=0 / 1 forces it off / on wherever its shapes allow, fp32 pools included (IEEE dots on
    CUDA cores there: for tests such as the fp32 engine against the CPU reference)."""
    if device.type != "cuda" or not tensor_core_shapes_ok(group, head_dim):
        return False
    if _TC_OVERRIDE is not None:
        return _TC_OVERRIDE == "1"
    return pool_dtype in TC_POOL_DTYPES and batch * num_kv_heads >= sm_count(device)


def default_tc_splits(batch: int, num_kv_heads: int, max_tokens: int, device: torch.device) -> int:
    """Split count of the tensor-core variant: ~TC_PROGRAMS_PER_SM programs an SM, chunks of >= two tiles (measured
    at 64 and 256 rows only, where one split was fastest)."""
    if device.type != "cuda":
        return 1
    want = math.ceil(TC_PROGRAMS_PER_SM * sm_count(device) / max(1, batch * num_kv_heads))
    return max(1, min(want, MAX_SPLITS, max_tokens // (2 * TC_TILE)))


def _offsets_fit_int32(*pools: torch.Tensor) -> bool:
    """Every element offset of these (possibly strided) tensors is < 2^31."""
    return all(sum((n - 1) * st for n, st in zip(t.shape, t.stride())) < 2 ** 31 for t in pools)


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, scale: float, *, num_splits: int | None = None,
                           block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                           tensor_cores: bool | None = None, k_new: torch.Tensor | None = None,
                           v_new: torch.Tensor | None = None, slots: torch.Tensor | None = None,
                           maxnreg: int | None = None, loop_stages: int | None = None) -> torch.Tensor:
    """q [B, Hq, D] over the paged pools -> [B, Hq, D] in q's dtype (see the module docstring).

    k_new / v_new [B, Hkv, D] and slots [B] (flat pool slots): the step's new token, not yet in the pools, in the
    pools' dtype or the queries' (an fp8 pool's token is then rounded in the kernel: no cast launch a layer). The
    kernel writes it at its slot and attends to it, as stored, as the context's last token (context_lens counts
    it): the same result as writing it first and calling without them.

    tensor_cores: the MMA variant (None: `default_tensor_cores`). num_splits: split-K chunks (None:
    `default_num_splits`, `default_tc_splits`). block_n: tokens per tile (None: by head_dim and group; TC_TILE).
    num_warps / num_stages: Triton's launch options (None: 2 / Triton's; TC_WARPS / TC_STAGES). maxnreg: a cap on
    registers a thread (None: VOXFLOW_PAGED_DECODE_MAXNREG for the tensor-core variant, else the compiler's choice).
    The variant's 158 at bf16 leave room for three programs an SM, 128 for four, so 64 rows x 8 KV heads would run
    as one wave on 132 SMs (probe_kv_fp8.py --regs measures it). loop_stages: the tile loop's software pipeline
    depth (None: TC_LOOP_STAGES, or VOXFLOW_PAGED_DECODE_STAGES, for the tensor-core variant, else 1 = not
    pipelined).
    """
    if triton is None:
        raise RuntimeError("paged_decode_attention needs Triton; use paged_decode_attention_ref")
    batch, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, pool_dim = k_pool.shape
    if v_pool.shape != k_pool.shape or pool_dim != head_dim:
        raise ValueError(f"pools {tuple(k_pool.shape)} / {tuple(v_pool.shape)} do not fit q {tuple(q.shape)}")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if block_tables.shape[0] != batch or context_lens.shape != (batch,):
        raise ValueError(f"block_tables {tuple(block_tables.shape)} / context_lens {tuple(context_lens.shape)} "
                         f"do not match batch {batch}")
    group = num_heads // num_kv_heads
    width = block_tables.shape[1]
    max_tokens = width * block_size
    block_d = triton.next_power_of_2(head_dim)
    tc_inputs_ok = k_pool.stride() == v_pool.stride() and (q.dtype == k_pool.dtype or k_pool.dtype == FP8_KV)
    if tensor_cores is None:
        tensor_cores = tc_inputs_ok and default_tensor_cores(batch, num_kv_heads, group, head_dim, q.device,
                                                             k_pool.dtype)
    if tensor_cores:
        if not tc_inputs_ok:
            raise ValueError("tensor_cores: q and the pools must share a dtype (or the pools be fp8), and the K and "
                             "V pools their strides (one offset tensor)")
        if not tensor_core_shapes_ok(group, head_dim) or (block_n is not None and block_n < 16):
            raise ValueError(f"tensor_cores: needs <= 16 query heads a KV head (got {group}), head_dim >= 16 (got "
                             f"{head_dim}) and tiles of >= 16 tokens (got {block_n})")
        block_g = max(16, triton.next_power_of_2(group))           # an MMA takes >= 16 rows: the group, padded
        block_n = block_n or TC_TILE
        launch = dict(num_warps=num_warps or TC_WARPS, num_stages=num_stages or TC_STAGES)
        if num_splits is None:
            num_splits = default_tc_splits(batch, num_kv_heads, max_tokens, q.device)
    else:
        block_g = triton.next_power_of_2(group)
        if block_n is None:
            # Keep the [G, N, D] broadcast tile around 4K fp32 values (64 registers a thread at 2 warps), >= 16
            # tokens.
            block_n = max(16, min(64, 4096 // (block_g * block_d)))
        launch = dict(num_warps=num_warps or 2, **({"num_stages": num_stages} if num_stages else {}))
        if num_splits is None:
            num_splits = default_num_splits(batch, num_kv_heads, max_tokens, q.device)
    num_splits = max(1, min(int(num_splits), math.ceil(max(max_tokens, 1) / block_n)))
    if maxnreg is None and tensor_cores:
        maxnreg = _TC_MAXNREG
    if loop_stages is None:
        loop_stages = _TC_LOOP_STAGES if tensor_cores else 1
    if maxnreg is not None:
        launch["maxnreg"] = int(maxnreg)

    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    append = k_new is not None
    if append:
        if v_new is None or slots is None or k_new.shape != (batch, num_kv_heads, head_dim) \
                or v_new.shape != k_new.shape or slots.shape != (batch,):
            raise ValueError("k_new / v_new [B, Hkv, D] and slots [B] go together")
        k_new, v_new = (x if x.stride(-1) == 1 else x.contiguous() for x in (k_new, v_new))
    else:
        k_new = v_new = q                  # unused (APPEND is compiled out)
        slots = context_lens
    if num_splits > 1:
        part_m = torch.empty(batch, num_heads, num_splits, device=q.device, dtype=torch.float32)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(batch, num_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
    else:
        part_m = part_l = part_acc = out   # unused (NUM_SPLITS == 1 branch is compiled out)
    pdl = use_pdl(q)
    _paged_decode_kernel[(batch, num_kv_heads, num_splits)](
        q, k_pool, v_pool, block_tables, context_lens, out, part_m, part_l, part_acc, k_new, v_new, slots,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1), q.stride(2),
        k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        *k_pool.stride(), *v_pool.stride(),
        block_tables.stride(0), block_tables.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim, BLOCK_D=block_d, PAGE=block_size, BLOCK_N=block_n,
        NUM_SPLITS=num_splits, APPEND=append, TENSOR_CORES=bool(tensor_cores), DOT_DTYPE=_dot_dtype(q.dtype),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        SMALL_POOL=bool(tensor_cores) and _offsets_fit_int32(k_pool, v_pool),     # (only the variant reads it)
        USE_PDL=trigger_mode(pdl, "paged_decode"), LOOP_STAGES=loop_stages, **launch, **launch_kwargs(pdl))
    if num_splits > 1:
        _combine_splits_kernel[(batch, num_heads)](
            part_m, part_l, part_acc, out, out.stride(0), out.stride(1), out.stride(2),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_D=block_d, NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), USE_PDL=trigger_mode(pdl, "combine_splits"),
            **launch_kwargs(pdl))
    return out
