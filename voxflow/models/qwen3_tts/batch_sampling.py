"""Token selection for the batched engine path: the official logits pipeline (sampling.py) with per-row
parameters, and counter-based randomness instead of per-request torch.Generators.

Every random draw is a pure function of (request seed, frame index, codebook index, vocabulary index):
    u = hash(seed, frame, codebook, v) in (0, 1)        (integer mixing, vectorised on the device)
    id = argmax_v(warped_logits[v] - log(-log(u)))       (Gumbel-max: an exact draw from softmax(warped))
so a request's sampled codes do not depend on which other requests share its batch, on chunked prefill or on
preemption (each (frame, codebook) pair is drawn exactly once), and there is no per-row Python loop or host
sync. Greedy rows take the argmax of the processed logits, exactly as the eager reference does.

Consequence, by design: SEEDED audio from the engine differs from the eager reference loop (generate.py),
which replays the official torch RNG order (one multinomial per draw); the distribution is the same. Greedy
decoding is identical.

Draw indices: c0 of frame k is (frame k, codebook 0) — frame 0's c0 is drawn after the prefill; codes 1..15
of frame k are (frame k, codebooks 1..15).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.profiler import record_function

from voxflow.kernels import use_kernels

from .sampling import WarpParams, process_talker_logits, warp_logits

MASK32 = 0xFFFFFFFF


# --------------------------------------------------------------------------------------------------
# 32-bit integer hashing held in int64 tensors (values always in [0, 2^32), so >> is a logical shift and no
# product overflows: a 32x32-bit multiply is split into two 16x32-bit ones).
# --------------------------------------------------------------------------------------------------
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & MASK32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mixer (Wellons' "lowbias32") on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash32_int(x: int) -> int:
    """`hash32` for one Python int (host side)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def seed_key(seed: int) -> int:
    """A request seed (any Python int) -> its 32-bit stream key."""
    s = int(seed) % (1 << 64)
    return hash32_int(hash32_int(s & MASK32) ^ (s >> 32))


_vocab_hash_cache: dict[tuple[int, str], torch.Tensor] = {}


def _vocab_hash(vocab: int, device: torch.device) -> torch.Tensor:
    key = (vocab, str(device))
    if key not in _vocab_hash_cache:
        v = torch.arange(vocab, dtype=torch.long, device=device)
        _vocab_hash_cache[key] = hash32((v * 0x9E3779B9 + 0x632BE5AB) & MASK32)
    return _vocab_hash_cache[key]


def uniform_noise(keys: torch.Tensor, frame: torch.Tensor, codebook: int, vocab: int) -> torch.Tensor:
    """[B, vocab] float32 in (0, 1): keys [B] (seed_key), frame [B] long, one codebook index for the batch.
    On a GPU one Triton kernel computes the same bits (voxflow/kernels/uniform_noise.py)."""
    if use_kernels(keys):
        from voxflow.kernels.uniform_noise import uniform_noise as fused
        return fused(keys, frame, codebook, vocab)
    stream = hash32(keys ^ hash32((frame * 16 + codebook) & MASK32))
    bits = hash32(stream[:, None] ^ _vocab_hash(vocab, keys.device)[None, :])
    # 23 bits: (m + 0.5) / 2^23 is exact in fp32 and never reaches 0 or 1, so the Gumbel transform stays finite.
    return ((bits >> 9).to(torch.float32) + 0.5) * (2.0 ** -23)


def gumbel_argmax(logits: torch.Tensor, keys: torch.Tensor, frame: torch.Tensor, codebook: int) -> torch.Tensor:
    """One draw per row from softmax(logits) ([B, V] fp32, -inf = filtered) with counter-based noise."""
    u = uniform_noise(keys, frame, codebook, logits.shape[-1])
    return (logits - torch.log(-torch.log(u))).argmax(dim=-1)


# --------------------------------------------------------------------------------------------------
# The two sampling stages
# --------------------------------------------------------------------------------------------------
def select_c0(logits: torch.Tensor, seen: torch.Tensor, num_generated: torch.Tensor, penalty: torch.Tensor,
              min_new_tokens: torch.Tensor, suppress: torch.Tensor, params: WarpParams, keys: torch.Tensor,
              frame: torch.Tensor, eos_id: int, any_sampling: bool = True,
              seen_rows: torch.Tensor | None = None) -> torch.Tensor:
    """c0 ids [B] from raw talker logits [B, V]: repetition penalty, min-length EOS rule, suppression (all rows),
    then argmax (greedy rows) or temperature / top-k / top-p + Gumbel-max (sampling rows). seen: [B, V], or with
    seen_rows [B] a whole table [N, V] whose row seen_rows[b] is row b's (the kernel then reads it in place: no
    gather of the batch's rows on the step's critical path)."""
    talker = (seen, penalty, num_generated, min_new_tokens, suppress, eos_id) + (
        () if seen_rows is None else (seen_rows,))
    fused = _fused_select(logits, _kernel_params(params, logits, any_sampling), keys, frame, 0, talker)
    if fused is not None:
        return fused
    if seen_rows is not None:
        seen = seen[seen_rows]
    processed = process_talker_logits(logits, seen, num_generated, penalty, min_new_tokens, suppress, eos_id)
    greedy = processed.argmax(dim=-1)
    if not any_sampling:
        return greedy
    sampled = gumbel_argmax(warp_logits(processed, params), keys, frame, 0)
    return torch.where(params.do_sample, sampled, greedy)


def _kernel_params(params: WarpParams, like: torch.Tensor, any_sampling: bool) -> WarpParams | None:
    """The selection kernel's view of a stage's settings, made once per stage (not per draw): without sampling
    requests, every row greedy and no top-p. None off the kernel path."""
    if not use_kernels(like):
        return None
    if any_sampling:
        return params
    return WarpParams(torch.zeros_like(params.do_sample), params.temperature, params.top_k, params.top_p,
                      any_top_p=False)


def _fused_select(logits: torch.Tensor, params: WarpParams | None, keys: torch.Tensor, frame: torch.Tensor,
                  codebook: int, talker: tuple | None = None, embed: torch.Tensor | None = None,
                  embed_out: torch.Tensor | None = None, embed2: torch.Tensor | None = None,
                  embed2_out: torch.Tensor | None = None,
                  row_scale: tuple[torch.Tensor, float] | None = None) -> torch.Tensor | None:
    """On the GPU (params from `_kernel_params`): the whole selection (greedy argmax, or temperature / top-k /
    top-p / Gumbel-max per row; with `talker`, the talker's logit processing first) in one kernel with the same
    results (voxflow/kernels/select_tokens.py); with embed / embed_out (and embed2 / embed2_out), the drawn ids'
    table rows copied out too; with row_scale, the logits first scaled by its rows' RMSNorm factor.
    None where it does not apply."""
    if params is None:
        return None
    from voxflow.kernels import select_tokens as fused
    if not fused.supported(logits):
        return None
    return fused.select_tokens(logits, params.do_sample, params.temperature, params.top_k, params.top_p, keys, frame,
                               codebook, params.any_top_p, talker=talker, embed=embed, embed_out=embed_out,
                               embed2=embed2, embed2_out=embed2_out, row_scale=row_scale)


def residual_sample_fn(params: WarpParams, keys: torch.Tensor, frame: torch.Tensor,
                       any_sampling: bool = True) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """The `sample_fn(logits [B, 2048], j)` that `CodePredictor.predict` calls for codebook j + 1."""
    kernel_params = _kernel_params(params, keys, any_sampling)       # once for the frame's 15 draws

    def sample(logits: torch.Tensor, j: int) -> torch.Tensor:
        with record_function("cp_sampling"):           # a named range in profiles
            picked = _fused_select(logits, kernel_params, keys, frame, j + 1)
            if picked is not None:
                return picked
            logits = logits.to(torch.float32)
            greedy = logits.argmax(dim=-1)
            if not any_sampling:
                return greedy
            sampled = gumbel_argmax(warp_logits(logits, params), keys, frame, j + 1)
            return torch.where(params.do_sample, sampled, greedy)

    def draw_and_embed(logits: torch.Tensor, j: int, table: torch.Tensor, table2: torch.Tensor | None = None,
                       out: torch.Tensor | None = None, row_scale: tuple[torch.Tensor, float] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(sample(logits, j), table[those ids], table2[those ids] or None without table2) -- on the kernel path the
        draw copies the rows itself (no lookup launch), into `out` [B, D] when given (rows may be strided); (ids,
        None, None) where it does not, and the caller looks them up. (select_tokens checks the tables.) The table2
        rows are a fresh tensor on every call: the code predictor's layers may overwrite them (OWNED_INPUT).
        row_scale (x [B, H], eps): the logits came from a head with x's RMSNorm folded in (CP_FOLDED_HEAD) and are
        first scaled by x's row factor (folded_norms.scale_rows; in the kernel where it runs)."""
        if kernel_params is not None:
            with record_function("cp_sampling"):
                rows = (out if out is not None else
                        torch.empty(logits.shape[0], table.shape[1], dtype=table.dtype, device=table.device))
                rows2 = (None if table2 is None else
                         torch.empty(logits.shape[0], table2.shape[1], dtype=table2.dtype, device=table2.device))
                picked = _fused_select(logits, kernel_params, keys, frame, j + 1, embed=table, embed_out=rows,
                                       embed2=table2, embed2_out=rows2, row_scale=row_scale)
            if picked is not None:
                return picked, rows, rows2
        if row_scale is not None:
            from voxflow.layers.folded_norms import scale_rows
            logits = scale_rows(logits, *row_scale)
        return sample(logits, j), None, None

    sample.draw_and_embed = draw_and_embed      # CodePredictor.predict takes it where offered
    return sample
