"""One decode-step token draw of batched sampling (`models/qwen3_tts/batch_sampling`) in one Triton kernel.

The torch pipeline for one draw (fp32 cast, greedy argmax, temperature, top-k, optional top-p, the counter-based
noise, Gumbel transform, argmax, where) is ~12 small kernels, and a Qwen3-TTS frame makes 16 draws. Here one
program owns one row, holds it whole in registers (V <= 4096, padded to a power of two with -inf) and does all of
it, writing only the [B] ids. It computes

    greedy  = argmax(fp32(logits))                                       (lowest index wins ties, as torch)
    warped  = warp_logits(fp32(logits))                                  (temperature, top-k, top-p)
    sampled = argmax(warped - log(-log(u)))   u = batch_sampling.uniform_noise bits (same hash, same counters)
    ids     = do_sample ? sampled : greedy

With `talker=` (the c0 draw) the kernel first applies sampling.process_talker_logits -- repetition penalty on the
ids already generated, EOS barred before min_new_tokens, the suppressed ids -- the same fp32 operations (another
~14 small kernels a step before).

With `row_scale=(x, eps)` the logits came from rows x [B, H] whose RMSNorm was left out, its weight folded into
the head (folded_norms.fold_final_norm_in_place): each row is first scaled by x's row factor rsqrt(mean(x^2) + eps)
(fp32 statistics) and rounded to the logits' dtype -- folded_norms.scale_rows up to the factor's summation order
(16-bit logits: the same values but where that last-ulp difference meets a rounding boundary; fp32: within an
ulp), and a 16-bit row keeps its 16 significant key bits -- which saves the norm's launch before the head (15 a
code-predictor frame).

With `embed=` (a table [>= V, D]) the program also copies the drawn id's table row into `embed_out[row]`: what the
next step's embedding lookup reads (the code predictor's next input), without a lookup launch of its own (15 a
frame, each outside the PDL chain). A copy: the same bits as the lookup.

Numerics against the reference:
- temperature: IEEE fp32 division; top-k: the k-th largest value, values >= it survive (boundary ties too, as in
  apply_top_k) -- exact. Without top-p it comes from a radix select (on an H200 the full-row bitonic sort
  cost 14.5 us at V=2048 and 55 us at the talker's 3072, padded to 4096) over the unscaled logits, whose k-th
  largest divided by the temperature is the scaled row's (`key_bits`: half the passes for bf16 logits); with
  top-p from the ascending sort that stage needs anyway. Noise bits: exact. The Gumbel transform uses the precise
  log on CUDA (libdevice logf, as torch's), so without top-p the ids equal the reference's bit for bit.
- top-p (transformers' rule of apply_top_p): the kept set is a suffix of the ascending order, so the kernel keeps
  the values >= the smallest kept one. Two differences, both at the nucleus boundary only: (1) exact value ties
  there (frequent in bf16) all survive, where the reference keeps or drops each tied copy by its (unspecified)
  sort position; (2) softmax and cumulative sum run in another summation order, so a token whose cumulative
  probability is within a few ulp of the cut (1 - top_p) can be kept on one side and dropped on the other.
  Either changes the draw only if the noise then picks that boundary token: measured under the interpreter, 3 of
  ~900 bf16 rows sampling with top-p 0.8 / 0.95 differed (all value ties), 0 of ~900 fp32 ones.
- Under Triton's interpreter (CPU) log and exp are numpy's, not torch's, so a near-tie of two scores can flip.
- NaN logits are not supported (the reference's softmax would be NaN too).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from voxflow.kernels import use_pdl
from voxflow.kernels.pdl import launch_kwargs, trigger_mode, wait_for_previous_kernel
from voxflow.kernels.rms_norm import MAX_ROW_FACTOR_WIDTH, round_to, row_factor
from voxflow.kernels.uniform_noise import _lowbias32

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_VOCAB = 4096
# Bits of the top-k radix select decided per pass (1, 2 or 4); `bench_select_tokens.py` times them. 2: 16 passes
# of 4 counts (H200, 8 warps, one row: 10.1 us at V = 2048 and 15.8 at 3072, against 12.3 / 18.1 deciding one bit
# a pass and 12.7 / 28.5 four: session 11 call 2).
RADIX_BITS = 2
# VOXFLOW_SELECT_FULL_KEYS=1: the radix select decides all 32 key bits for every dtype, as before session 23 (the
# A/B of `key_bits`; the same ids either way).
FULL_KEYS = os.environ.get("VOXFLOW_SELECT_FULL_KEYS", "0") == "1"
# Selects over more than 16 key bits (fp32 logits, the talker's draw) stop after the top 16 when those settle the
# k-th value (_kth_largest); VOXFLOW_SELECT_HALF_EXIT=0 decides every bit of every row (the A/B; the same ids).
HALF_EXIT = os.environ.get("VOXFLOW_SELECT_HALF_EXIT", "1") == "1"
# Warps of the talker's c0 draw (one program a row over its 3072-wide vocabulary, on the c=1 step's critical path):
# 16, measured on the H200 (session 32: 11.5 us at one row against 13.2 at 8 warps and 19.5 at 4; 17.0 / 18.2 / 30.7
# at 16 rows; 1.7B c=1 E2E 480.3 -> 478.1 ms). VOXFLOW_TALKER_SELECT_WARPS=N for an A/B; bench_select_tokens.py
# sweeps them.
TALKER_WARPS = int(os.environ.get("VOXFLOW_TALKER_SELECT_WARPS", "16"))
# The bits an fp32 value converted from a 16-bit dtype can differ in (key_bits); any other dtype: all 32.
_SIGNIFICANT_KEY_BITS = {torch.bfloat16: 16, torch.float16: 19}


@triton.jit
def _radix_passes(keys, result, k, digits, FIRST: tl.constexpr, LAST: tl.constexpr, RADIX_BITS: tl.constexpr):
    """Passes FIRST down to LAST of _kth_largest's select: each decides RADIX_BITS bits of `result`."""
    for p in tl.static_range(FIRST, LAST - 1, -1):
        trials = result | (digits << (p * RADIX_BITS))                                  # [2^RADIX_BITS]
        counts = tl.sum((keys[None, :] >= trials[:, None]).to(tl.int32), 1)           # keys >= each trial
        digit = tl.max(tl.where(counts >= k, digits, 0), 0)     # digit 0 always qualifies (count >= k held)
        result = result | (digit << (p * RADIX_BITS))
    return result


@triton.jit
def _kth_largest(w, k, RADIX_BITS: tl.constexpr, KEY_BITS: tl.constexpr, HALF_EXIT: tl.constexpr):
    """The k-th largest of the fp32 values w (a whole row) by a radix select on their order-preserving uint32 keys:
    the largest key T with at least k keys >= T, decided RADIX_BITS bits at a time from the top, returned as the
    fp32 value it encodes. The value the k-th slot of a descending sort holds, for far fewer barriers than a
    bitonic sort of the row (top-p needs the sorted row anyway and keeps that path).

    Each pass counts the keys >= every candidate digit at once (a [2^RADIX_BITS, BLOCK] comparison summed over
    the row: one reduction instead of one per bit) and keeps the largest digit whose count is still >= k. The count
    falls as the trial key grows, so digit by digit this finds the same T as deciding bit by bit (RADIX_BITS = 1).

    Only the top KEY_BITS are decided (a multiple of RADIX_BITS): for values that came from 16-bit logits the low
    32 - KEY_BITS bits of every value are zero, so of every key they are zero (a positive value) or all ones (a
    negative one); T's are then set from its sign. Exact, and half the passes for bf16 (KEY_BITS 16).

    Past 16 bits (fp32 logits, the talker's processed ones) the passes stop after the top 16 when the keys that
    share T's top 16 bits are all one key: T is that key. (T has at least k keys >= it and fewer than k above its
    prefix, so such a key exists; when they are all equal no lower bit is left to decide.) Values a penalty or a
    temperature made rarely share their top 16 bits with a different value, so most rows take half the passes;
    the others decide every bit as before. (HALF_EXIT False: every row decides every bit.)"""
    bits = w.to(tl.uint32, bitcast=True)
    # Negative: all bits flipped; else the sign bit set. (XOR with all ones rather than `~`: Triton 3.6 lowers `~`
    # on uint32 through a -1 that does not fit.)
    keys = tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    digits = tl.arange(0, 1 << RADIX_BITS).to(tl.uint32)
    result = tl.full([], 0, tl.uint32)
    TOP: tl.constexpr = 32 // RADIX_BITS - 1                  # the first pass (the highest digit)
    LAST: tl.constexpr = (32 - KEY_BITS) // RADIX_BITS        # the last pass
    if KEY_BITS > 16 and HALF_EXIT:
        HALF: tl.constexpr = 16 // RADIX_BITS                 # the last pass of the top 16 bits
        result = _radix_passes(keys, result, k, digits, TOP, HALF, RADIX_BITS)
        ties = (keys >> 16) == (result >> 16)
        lowest = tl.min(tl.where(ties, keys, 0xFFFFFFFF), 0)
        highest = tl.max(tl.where(ties, keys, 0), 0)
        if lowest == highest:
            result = lowest
        else:
            result = _radix_passes(keys, result, k, digits, HALF - 1, LAST, RADIX_BITS)
    else:
        result = _radix_passes(keys, result, k, digits, TOP, LAST, RADIX_BITS)
    if KEY_BITS < 32:
        low: tl.constexpr = (1 << (32 - KEY_BITS)) - 1
        result = tl.where((result >> 31) != 0, result, result | low)          # a negative value's key: ones
    value_bits = tl.where((result >> 31) != 0, result & 0x7FFFFFFF, result ^ 0xFFFFFFFF)
    return value_bits.to(tl.float32, bitcast=True)


# No specialisation of `codebook` (an int argument equal to 1 would become a Python int without `.to`): one
# compiled kernel serves all 16 codebooks.
@triton.jit(do_not_specialize=["codebook", "eos_id"])
def _select_tokens_kernel(logits_ptr, do_sample_ptr, temperature_ptr, top_k_ptr, top_p_ptr, keys_ptr, frame_ptr,
                          out_ptr, codebook, vocab, stride_row,
                          seen_ptr, seen_rows_ptr, penalty_ptr, num_gen_ptr, min_new_ptr, suppress_ptr, eos_id,
                          stride_seen,
                          emb_ptr, emb_out_ptr, emb_dim, stride_emb, stride_emb_out,
                          emb2_ptr, emb2_out_ptr, emb2_dim, stride_emb2, stride_emb2_out,
                          scale_ptr, stride_scale, scale_width, inv_scale_width, scale_eps,
                          USE_TOP_P: tl.constexpr, PRECISE: tl.constexpr, TALKER: tl.constexpr,
                          RADIX_BITS: tl.constexpr, KEY_BITS: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
                          EMBED: tl.constexpr, BLOCK_E: tl.constexpr, EMBED2: tl.constexpr,
                          BLOCK_E2: tl.constexpr, HALF_EXIT: tl.constexpr, SEEN_ROWS: tl.constexpr,
                          ROW_SCALE: tl.constexpr, BLOCK_S: tl.constexpr):
    if USE_PDL:                 # pdl.py: nothing read before the previous kernel's results are visible
        wait_for_previous_kernel(USE_PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offs, mask=offs < vocab,
                other=float("-inf")).to(tl.float32)
    if ROW_SCALE:               # (the head's input norm folded into it: its row factor here, rounded as scale_rows)
        r = row_factor(scale_ptr + row.to(tl.int64) * stride_scale, scale_width, inv_scale_width, scale_eps, BLOCK_S)
        x = round_to(x * r, logits_ptr.dtype.element_ty)
    if TALKER:
        # sampling.process_talker_logits, op for op: repetition penalty on the ids seen so far (x * p below zero,
        # x / p above, IEEE division), EOS barred before min_new_tokens, the suppressed ids removed.
        p = tl.load(penalty_ptr + row).to(tl.float32)
        # (SEEN_ROWS: row `row`'s ids are row seen_rows[row] of the whole table: no gather of the batch's rows)
        seen_row = tl.load(seen_rows_ptr + row).to(tl.int64) if SEEN_ROWS else row.to(tl.int64)
        seen = tl.load(seen_ptr + seen_row * stride_seen + offs, mask=offs < vocab, other=0) != 0
        x = tl.where(seen, tl.where(x < 0, x * p, tl.div_rn(x, p)), x)
        too_early = tl.load(num_gen_ptr + row) < tl.load(min_new_ptr + row)
        x = tl.where((offs == eos_id) & too_early, float("-inf"), x)
        suppressed = tl.load(suppress_ptr + offs, mask=offs < vocab, other=0) != 0
        x = tl.where(suppressed, float("-inf"), x)
    # Greedy rows skip the sampling below, and sampling rows the greedy argmax (one reduction of the row fewer).
    if tl.load(do_sample_ptr + row) != 0:
        temperature = tl.load(temperature_ptr + row).to(tl.float32)
        k = tl.load(top_k_ptr + row)
        k = tl.minimum(tl.maximum(tl.where(k > 0, k, vocab), 1), vocab)
        if USE_TOP_P:
            w = tl.div_rn(x, temperature)
            # One ascending sort serves both filters; the -inf padding sorts to the front and never matters.
            asc = tl.sort(w)
            thr = tl.max(tl.where(offs == BLOCK - k, asc, float("-inf")), 0)      # the k-th largest
            top_p = tl.load(top_p_ptr + row).to(tl.float64)
            if top_p < 1.0:
                # 1 - top_p in double, rounded once to fp32: transformers' Python-float threshold.
                cut = (1.0 - top_p).to(tl.float32)
                # Top-k filtered row, still ascending (what apply_top_p sorts); its softmax and cumulative sum.
                filt = tl.where(asc >= thr, asc, float("-inf"))
                if PRECISE:
                    e = libdevice.exp(filt - tl.max(filt, 0))   # expf, as torch's softmax
                else:
                    e = tl.exp(filt - tl.max(filt, 0))          # the interpreter has no libdevice
                cumulative = tl.cumsum(tl.div_rn(e, tl.sum(e, 0)), 0)
                # Kept: cumulative > cut, and always the largest (the last slot); the kept set is a suffix.
                kept = (cumulative > cut) | (offs == BLOCK - 1)
                thr = tl.maximum(thr, tl.min(tl.where(kept, filt, float("inf")), 0))
        else:
            # No sort needed for top-k alone. The k-th largest of w = x / t is x's k-th largest / t (a division by
            # t > 0 keeps the order, ties included), and x from 16-bit logits has KEY_BITS significant key bits.
            thr = tl.div_rn(_kth_largest(x, k, RADIX_BITS, KEY_BITS, HALF_EXIT), temperature)
            w = tl.div_rn(x, temperature)           # after the select: only x lives through its passes
        w = tl.where(w >= thr, w, float("-inf"))
        # The noise of batch_sampling.uniform_noise / kernels/uniform_noise.py, bit for bit.
        key = tl.load(keys_ptr + row).to(tl.uint32)
        frame = tl.load(frame_ptr + row).to(tl.uint32)
        stream = _lowbias32(key ^ _lowbias32(frame * 16 + codebook.to(tl.uint32)))
        v = offs.to(tl.uint32)
        bits = _lowbias32(stream ^ _lowbias32(v * 0x9E3779B9 + 0x632BE5AB))
        u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        if PRECISE:
            gumbel = libdevice.log(-libdevice.log(u))     # logf, as torch.log; tl.log is the approximate lg2
        else:
            gumbel = tl.log(-tl.log(u))
        ids = tl.argmax(w - gumbel, 0, tie_break_left=True)   # filtered (-inf) stays -inf
    else:
        ids = tl.argmax(x, 0, tie_break_left=True)
    tl.store(out_ptr + row, ids.to(tl.int64))
    if EMBED:
        _copy_row(emb_ptr + ids.to(tl.int64) * stride_emb, emb_out_ptr + row.to(tl.int64) * stride_emb_out, emb_dim,
                  BLOCK_E)
    if EMBED2:
        _copy_row(emb2_ptr + ids.to(tl.int64) * stride_emb2, emb2_out_ptr + row.to(tl.int64) * stride_emb2_out,
                  emb2_dim, BLOCK_E2)


@triton.jit
def _copy_row(src, dst, n, BLOCK: tl.constexpr):
    for e0 in range(0, n, BLOCK):
        e = e0 + tl.arange(0, BLOCK)
        tl.store(dst + e, tl.load(src + e, mask=e < n), mask=e < n)


def key_bits(dtype: torch.dtype, talker: bool, radix_bits: int) -> int:
    """The top-k radix select's significant key bits (_kth_largest): the bits an fp32 value converted from `dtype`
    can differ in (bf16: sign, exponent, 7 mantissa bits = 16; fp16: its 10 mantissa bits take the fp32 value to
    bit 13 = 19), rounded up to whole passes; 32 for fp32 logits and for the talker's draw, whose logit processing
    (x * p, x / p) makes values of any fp32 bits."""
    if FULL_KEYS:
        return 32
    significant = 32 if talker else _SIGNIFICANT_KEY_BITS.get(dtype, 32)
    return -(-significant // radix_bits) * radix_bits


def supported(logits: torch.Tensor) -> bool:
    """[B, V] with a unit last stride, 1 <= V <= 4096 (the row lives in registers), a float dtype."""
    return (logits.dim() == 2 and logits.stride(-1) == 1 and 1 <= logits.shape[-1] <= MAX_VOCAB
            and logits.dtype in _DTYPES)


def _check_table(name: str, table: torch.Tensor | None, rows: torch.Tensor | None, logits: torch.Tensor) -> None:
    b, vocab = logits.shape
    if (table is None) != (rows is None):
        raise ValueError(f"{name} and {name}_out come together")
    if table is not None and (table.dim() != 2 or table.shape[0] < vocab or table.stride(-1) != 1
                              or rows.shape != (b, table.shape[1]) or rows.dtype != table.dtype
                              or rows.stride(-1) != 1 or table.device != logits.device
                              or rows.device != logits.device):
        raise ValueError(f"{name} must be [>= {vocab}, D] and {name}_out [{b}, D] in its dtype, unit last strides, "
                         f"on the logits' device; got {tuple(table.shape)} and {tuple(rows.shape)}")


def _block_e(table: torch.Tensor | None) -> int:
    return min(4096, triton.next_power_of_2(table.shape[1])) if table is not None else 16


def select_tokens(logits: torch.Tensor, do_sample: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor, keys: torch.Tensor, frame: torch.Tensor, codebook: int,
                  use_top_p: bool, num_warps: int | None = None, talker: tuple | None = None,
                  radix_bits: int = RADIX_BITS, embed: torch.Tensor | None = None,
                  embed_out: torch.Tensor | None = None, embed2: torch.Tensor | None = None,
                  embed2_out: torch.Tensor | None = None,
                  row_scale: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
    """ids [B] int64 for logits [B, V] (see `supported`): do_sample [B] bool, temperature [B] float32, top_k [B]
    int64 (0 = off), top_p [B] float64 (1 = off), keys [B] (seed_key, < 2^32), frame [B] int64, one codebook for
    the batch. talker: the talker's logit processing first (see below). use_top_p=False skips the top-p stage (only
    valid when no sampling row has top_p < 1, as WarpParams.any_top_p). embed [>= V, D] with embed_out [B, D] (its
    dtype, unit last strides): embed_out[b] = embed[ids[b]] as well; embed2 / embed2_out (only with embed) a second
    table's row the same way (the code predictor's projected inputs). row_scale (x [B, H] of the logits' dtype
    and device, unit last stride, H <= 4096; eps): the logits scaled by x's RMSNorm row factor first (module
    docstring). No host sync: capturable in a CUDA graph."""
    b, vocab = logits.shape
    if radix_bits not in (1, 2, 4):        # (a width not dividing 32 would leave the threshold's low bits 0)
        raise ValueError(f"radix_bits must be 1, 2 or 4, got {radix_bits}")
    if embed is None and embed2 is not None:
        raise ValueError("embed2 comes with embed")
    for name, table, rows in (("embed", embed, embed_out), ("embed2", embed2, embed2_out)):
        _check_table(name, table, rows, logits)
    if row_scale is not None:
        x, eps = row_scale
        if (x.dim() != 2 or x.shape[0] != b or x.stride(-1) != 1 or x.dtype != logits.dtype
                or x.device != logits.device or not 1 <= x.shape[1] <= MAX_ROW_FACTOR_WIDTH):
            raise ValueError(f"row_scale rows must be [{b}, <= {MAX_ROW_FACTOR_WIDTH}] of the logits' dtype and "
                             f"device with a unit last stride; got {tuple(x.shape)} {x.dtype}")
        scale = (x, x.stride(0), x.shape[1], 1.0 / x.shape[1], float(eps))
    else:
        scale = (logits, 0, 1, 1.0, 0.0)                                   # unused (compiled out)
    out = torch.empty(b, dtype=torch.long, device=logits.device)
    if talker is not None:
        # (seen [B, V] bool, penalty [B], num_generated [B], min_new_tokens [B], suppress [V] bool, eos_id[,
        # seen_rows [B] int64]): the talker's logit processing (sampling.process_talker_logits) applied first, in
        # the kernel. With seen_rows, seen is a whole table [N, V] and row b's ids are its row seen_rows[b].
        seen, penalty, num_generated, min_new_tokens, suppress, eos_id, *rest = talker
        seen_rows = rest[0] if rest else None
        seen = seen if seen.stride(-1) == 1 else seen.contiguous()
        extra = (seen.view(torch.uint8), logits if seen_rows is None else seen_rows.contiguous(),
                 penalty.to(torch.float32).contiguous(), num_generated.contiguous(), min_new_tokens.contiguous(),
                 suppress.contiguous().view(torch.uint8), int(eos_id), seen.stride(0))
    else:
        seen_rows = None
        extra = (logits, logits, logits, logits, logits, logits, 0, 0)  # unused (TALKER is compiled out)
    if b:
        block = triton.next_power_of_2(vocab)
        pdl = use_pdl(logits)
        emb = [(t, o, t.shape[1], t.stride(0), o.stride(0)) if t is not None
               else (logits, logits, 0, 0, 0)                              # unused (compiled out)
               for t, o in ((embed, embed_out), (embed2, embed2_out))]
        _select_tokens_kernel[(b,)](
            logits, do_sample.contiguous().view(torch.uint8), temperature.contiguous(), top_k.contiguous(),
            top_p.contiguous(), keys.contiguous(), frame.contiguous(), out, int(codebook), vocab, logits.stride(0),
            *extra, *emb[0], *emb[1], *scale, USE_TOP_P=bool(use_top_p), PRECISE=logits.is_cuda,
            TALKER=talker is not None,
            RADIX_BITS=radix_bits, KEY_BITS=key_bits(logits.dtype, talker is not None, radix_bits), BLOCK=block,
            USE_PDL=trigger_mode(pdl, "select_tokens"), EMBED=embed is not None, BLOCK_E=_block_e(embed),
            EMBED2=embed2 is not None, BLOCK_E2=_block_e(embed2), HALF_EXIT=HALF_EXIT, SEEN_ROWS=seen_rows is not None,
            ROW_SCALE=row_scale is not None, BLOCK_S=triton.next_power_of_2(scale[2]),
            num_warps=num_warps or (talker is not None and TALKER_WARPS) or (8 if block >= 2048 else 4),
            enable_fp_fusion=False,   # every product / sum rounded as in the torch ops
            **launch_kwargs(pdl))
    return out
