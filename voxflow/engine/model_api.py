"""The contract between the engine and a model family.

The engine never imports a model family by name: it receives an object implementing `TTSModel` (built by
the family's plugin, e.g. `voxflow.models.qwen3_tts.plugin.Qwen3TTSPlugin`) and drives it:

    prepared = model.prepare(request)              # validate + prompt embeddings (may be slow: voice clone)
    model.attach_many([(slot, prepared), ...])     # per-request decode state into persistent slots
    model.prefill(slot, embeds[a:b], start=a, kv=ctx, last=(b == P))   # chunked prefill, KV written to pages
    out = model.decode(slots, kv=ctx)              # one frame for every slot in the batch
    model.detach(slot)                             # request finished / aborted / preempted
    embeds = model.resume_embeds(slot)             # after preemption: prompt + fed-back frames, re-prefilled

The KV cache is paged and owned by the engine (`PagedKVContext` below): the model writes the new tokens'
keys/values to `slot_mapping` and reads each sequence's context through its block table.

The codec (frames -> waveform) is a separate, stateful, batched stage (`CodecModel`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from ..kernels import FP8_KV
from .request import SpeechRequest


@dataclass(frozen=True)
class KVSpec:
    """Shape of one token's KV entry per layer, so the engine can size its page pool."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8


# EngineConfig.kv_cache_dtype -> what the pages store (None: the model's own KV dtype).
KV_CACHE_DTYPES = {"auto": None, "fp8": FP8_KV}


def check_kv_cache_dtype(kv_cache_dtype: str) -> str:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {sorted(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    return kv_cache_dtype


def pool_spec(spec: KVSpec, kv_cache_dtype: str) -> KVSpec:
    """The page pool's KVSpec: the model's, or its keys/values stored as fp8 e4m3 ("fp8"): half the bytes of bf16,
    so a pool of the same bytes holds twice the positions and decode attention, which reads every row's context
    each step, reads half. Unscaled (a scale of 1, as vLLM's fp8 KV cache without calibrated scales): e4m3 keeps 3
    mantissa bits (a relative rounding error <= 2^-4) between 2^-6 and 448 and saturates beyond; the talker's keys
    leave an RMSNorm. Writes round to nearest, reads widen exactly; attention math stays in fp32."""
    dtype = KV_CACHE_DTYPES[check_kv_cache_dtype(kv_cache_dtype)]
    return spec if dtype is None else KVSpec(spec.num_layers, spec.num_kv_heads, spec.head_dim, dtype)


@dataclass
class PagedKVContext:
    """Where a batch's keys/values live. Built by the engine for each prefill chunk / decode batch.

    k_cache[l], v_cache[l]: [num_blocks, block_size, num_kv_heads, head_dim] for layer l.
    block_tables: [B, max_blocks_per_seq] int64 (-1 = unused); row b lists sequence b's pages in order.
    context_lens: [B] int64, tokens of each sequence INCLUDING the new ones of this call.
    slot_mapping: [B, S] int64 flat slot (block * block_size + offset) for each new token (S = new tokens per
        row; 1 for decode). All rows of one call have the same S.
    rows_share_sequences: rows may be tokens of the same sequence (a packed prefill, packed_prefill.py: one token a
        row, S = 1): a row's context then holds other rows' new K/V, so every row's K/V is written before any row
        attends.
    prefill_tiles: with rows_share_sequences, (chunk_tables [C, W], kernels.prefill_tiles.PrefillTiles): the rows
        as query tiles of their chunks, for the tiled prefill attention kernel (None: the reference path).
    """
    k_cache: Sequence[torch.Tensor]
    v_cache: Sequence[torch.Tensor]
    block_size: int
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    slot_mapping: torch.Tensor
    rows_share_sequences: bool = False
    prefill_tiles: Any = None


@dataclass
class PreparedRequest:
    """A validated request, ready to run."""
    request_id: str
    prompt_embeds: torch.Tensor        # [P, H] talker input embeddings (on the model's device)
    position_keys: list[int]           # P content hashes: equal key prefixes <=> equal embedding prefixes
    max_frames: int                    # frames this request may produce at most
    state: Any = None                  # model-owned per-request data (trailing text, sampling, voice clone...)
    codec_prefix_frames: torch.Tensor | None = None   # [R, 16] frames to prime the codec (their audio is dropped)
    info: dict = field(default_factory=dict)          # for logs/metrics (layout, language, ...)

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_embeds.shape[0])


@dataclass
class DecodeOutput:
    """One decode call for B slots (all on the model's device; the engine reads `finished` one step late)."""
    frames: torch.Tensor       # [B, 16] int64: the frame each slot completed in this call
    finished: torch.Tensor     # [B] bool: nothing more after this frame (EOS sampled next, or frame limit)
    eos: torch.Tensor          # [B] bool: finished because EOS was sampled (else: length limit)
    flags: torch.Tensor | None = None   # [B, 2] bool (finished, eos) when the model has them side by side (the
                                        # engine's copy out then needs no stack of its own)

    def flag_pairs(self) -> torch.Tensor:
        """[B, 2] bool (finished, eos): the model's own `flags` when it has them, else stacked."""
        return self.flags if self.flags is not None else torch.stack((self.finished, self.eos), dim=1)


class TTSModel(Protocol):
    """The talker side of a model family (one instance per engine; holds persistent slot state)."""
    name: str
    sample_rate: int
    samples_per_frame: int
    kv_spec: KVSpec
    device: torch.device
    max_slots: int

    def describe(self) -> dict:
        """What the API shows: name, family, task (custom_voice | voice_design | voice_clone), sample_rate,
        voices (preset speakers), languages, supports_instructions."""

    def make_voice(self, ref_audio: np.ndarray, ref_text: str | None, x_vector_only: bool) -> dict:
        """A reusable voice-clone prompt from a reference clip (float32 mono at `sample_rate`), as plain
        JSON-serialisable data; pass it back as `SpeechRequest.voice_clone_prompt`. ValueError on bad input."""

    def prepare(self, request: SpeechRequest) -> PreparedRequest:
        """Validate and build the prompt. Raises ValueError with a user-facing message on bad input."""

    def attach(self, slot: int, prepared: PreparedRequest) -> None:
        """Load a request's decode state (sampling params, trailing text, seed, counters) into `slot`."""

    def attach_many(self, pairs: list[tuple[int, PreparedRequest]]) -> None:
        """`attach` for (slot, prepared) pairs with distinct slots at once (the engine attaches a step's new
        requests together: one set of device writes for all)."""

    def detach(self, slot: int) -> None:
        """Forget the slot's request."""

    def prefill(self, slot: int, embeds: torch.Tensor, start: int, kv: PagedKVContext, last: bool) -> None:
        """Run embeds [S, H] at positions start..start+S-1 writing KV; when `last`, sample the first c0."""

    def decode(self, slots: torch.Tensor, kv: PagedKVContext) -> DecodeOutput:
        """One frame for each slot in `slots` [B]: finish the pending frame, feed it back, sample the next c0."""

    def resume_embeds(self, slot: int, fed: int | None = None) -> torch.Tensor:
        """After preemption: the embeddings to re-prefill ([P + fed-back frames, H]) so that decoding resumes
        exactly where it stopped (the next c0 is kept in the slot). `fed`: the frames fed back so far, when the
        caller knows it (the engine: the sequence's frame count), so that nothing is read back from the device."""

    # For the static-shape decode step (engine/graph_runner.py): `decode` must be CUDA-graph capturable (device
    # tensors only, no host reads), accept padded batches, and tolerate decoding a finished slot once more.
    padding_slot: int           # a slot no request owns; padded batch rows use it (its state is garbage)
    graph_epoch: int            # changes whenever decode's persistent buffers are reallocated

    def decode_variant(self) -> Any:
        """A hashable naming the code path decode takes now (graphs are captured per variant)."""

    # Optional: warmup_requests() -> [SpeechRequest]: short, valid requests for this model that the engine runs
    # before serving (engine_startup.run_warmup_requests), so that the first user request pays no lazy initialisation or kernel
    # compilation on the prefill path.
    # Optional: prepare_many(requests) -> [PreparedRequest | ValueError]: `prepare` of a burst of arrivals in one
    # batched pass (one tokenizer call, a few GPU ops for all prompts instead of a dozen or more per request);
    # each entry what `prepare` gives that request alone, a bad request's ValueError in its place. The engine
    # calls it through `prepare_requests` below.


class CodecModel(Protocol):
    """The codec side: frames -> PCM, stateful per request, batched across requests."""
    sample_rate: int
    samples_per_frame: int

    def new_state(self, prefix_frames: torch.Tensor | None) -> Any:
        """A fresh streaming state; `prefix_frames` (e.g. a voice-clone reference) are consumed silently."""

    def decode(self, states: list[Any], frames: list[torch.Tensor]) -> tuple[list[np.ndarray], list[Any]]:
        """Decode frames[i] ([n_i, 16]) with states[i]; returns float32 PCM per request and the new states.
        Concatenating the PCM of successive calls equals a one-pass decode of all frames."""

    # Optional, used when present (engine/codec_executor.py):
    #   decode_async(states, frames, final=[bool], after=event) -> pending with ready() / result() -> [PCM]:
    #       the same decode, started on the codec's own stream (after `after`, an event of the talker's stream)
    #       with the PCM copied to host memory asynchronously; states are updated in place; final[i] says the
    #       state is never used again (its chunk may be padded to a captured shape). The engine passes `frames`
    #       as a FrameRows (engine/frame_rows.py: rows of its steps' frame tensors, gathered on the device).
    #   release(state): the request is gone; its state's memory may be reused.
    #   new_states([prefix_frames | None, ...], after=event) -> [state]: new_state for several requests at once
    #       (first chunks of a burst of requests: one pass instead of one per request). With decode_async, both
    #       new_state and new_states also take `after` (as decode_async: prefixes were complete when recorded).
    #   warmup(batch_sizes, frame_counts) -> seconds: capture CUDA graphs up front.
    #   free_states: how many new states it can make now (a fixed pool): first chunks past it wait for a later
    #       launch rather than fail.
    #   chunk_sizes: frame counts it decodes in one pass (its captured shapes); the engine's growing first
    #       chunks are rounded down to one of them.
    #   capture_seconds: host seconds spent capturing CUDA graphs so far (the step trace's capture_ms).
    #   precision: a dict saying which dtype the decoder runs in and why (the engine's startup record).
    #   nonfinite_chunks: chunks whose PCM held NaN (the engine's stats); decode_async's pending then also has
    #       nonfinite: [bool] per request after result(), and the engine ends those requests with an error.


def prepare_requests(model: TTSModel, requests: list[SpeechRequest]) -> list[PreparedRequest | ValueError]:
    """The model's `prepare_many` when it has one (and it does not raise a ValueError for the batch as a whole),
    else `prepare` request by request: per request its PreparedRequest or the ValueError its `prepare` raised
    (anything else is an engine bug and propagates)."""
    many = getattr(model, "prepare_many", None)
    if many is not None:
        try:
            results = many(requests)
        except ValueError:
            results = None      # a bad request broke the batched pass: one by one below, so that only it fails
        if results is not None:
            if len(results) != len(requests):
                raise RuntimeError(f"prepare_many returned {len(results)} results for {len(requests)} requests")
            return results
    results = []
    for request in requests:
        try:
            results.append(model.prepare(request))
        except ValueError as e:
            results.append(e)
    return results
