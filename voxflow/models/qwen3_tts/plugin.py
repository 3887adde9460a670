"""Qwen3-TTS for the engine: the batched, paged talker behind `voxflow.engine.model_api.TTSModel`.

It computes what the eager reference loop (generate.py) computes, for many requests at once:

    prefill(slot, prompt chunks)   talker over the chunk on the paged cache; after the last chunk: codec_head on
                                   it, c0 of frame 0 drawn, its hidden state h kept in the slot
    decode(slots)                  per slot, in one batch: codes 1..15 of the pending frame from (h, c0), the
                                   frame fed back (embed_frame + trailing text or tts_pad) at position P + fed,
                                   codec_head, the official c0 pipeline with per-row parameters, next c0

All per-request state lives in device tensors indexed by slot (slots.py); decode gathers and scatters rows and
never loops over requests in Python nor reads anything back to the host. Greedy rows give exactly the
reference's codes; sampled rows use counter-based noise (batch_sampling.py), so seeded output is reproducible
and independent of the batch but differs from the eager reference's torch-RNG replay.

Preemption. `detach(slot)` snapshots the slot's evolving state (pending c0, h, frames fed, seen ids, frame
history; device copies, no sync) into the request's `PreparedRequest.state`. Re-attaching the same
PreparedRequest (to any slot) restores it, and `resume_embeds(slot)` returns prompt + fed-back frames for the
re-prefill. A slot whose first c0 has already been drawn does NOT sample again on its `last` prefill chunk (it
only writes KV; the pending c0 and h are kept): decoding continues exactly where it stopped. Keeping the slot
attached and only re-prefilling (pages dropped) works the same way.

Limits: `max_frames` = max_new_tokens - 1 may be 0 (max_new_tokens = 1): such a request yields no frame and
must not be decoded. The first c0 is never EOS (min_new_tokens = 2), so a prefill never ends a request.
"""
from __future__ import annotations

import hashlib
import os
import random
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.profiler import record_function

from voxflow.engine.host_to_device import tensor_to, to_device
from voxflow.engine.model_api import DecodeOutput, KVSpec, PagedKVContext, PreparedRequest
from voxflow.engine.request import SamplingOptions, SpeechRequest
from voxflow.layers.paged_attention import PagedKVView

from .batch_sampling import residual_sample_fn, seed_key, select_c0
from .generate import SynthesisRequest, VoiceClonePrompt, make_voice_clone_prompt, prepare_many
from .model import Qwen3TTS
from .position_keys import position_keys_many
from .sampling import SamplingParams, WarpParams, suppress_mask
from .slots import SlotLoad, SlotTable
from .voice_data import pcm_f32, voice_from_data, voice_to_data

_PUBLIC_TASK = {"custom_voice": "custom_voice", "voice_design": "voice_design", "base": "voice_clone"}


@dataclass
class Qwen3RequestState:
    """`PreparedRequest.state` of a Qwen3-TTS request."""
    params: SamplingParams
    trailing_text: torch.Tensor                 # [N, H]
    ignore_eos: bool = False
    seed: int | None = None                     # fixed at the first attach when the request gave none
    resume: dict | None = field(default=None, repr=False)   # slot snapshot taken by detach (preemption)
    needs_first_c0: bool = True


class Qwen3TTSPlugin:
    def __init__(self, model: Qwen3TTS, max_slots: int, voice_cache_size: int = 16, max_frames: int | None = None):
        self.model = model
        self.talker = model.talker
        tc = model.config.talker
        self.name = os.path.basename(os.path.normpath(model.path))
        self.sample_rate = model.sample_rate
        self.samples_per_frame = model.samples_per_frame
        self.device = model.device
        self.max_slots = max_slots
        self.preloaded_text_rows: dict | None = None    # the loader's record of the prompt rows made at load
        self.kv_spec = KVSpec(num_layers=tc.num_hidden_layers, num_kv_heads=tc.num_key_value_heads,
                              head_dim=tc.head_dim, dtype=model.dtype)
        self.eos_id = tc.codec_eos_token_id
        codebook = self.codebook_size = tc.code_predictor.vocab_size
        self.suppress = suppress_mask(tc.vocab_size, self.eos_id, codebook, self.device)
        with torch.no_grad():
            # tts_pad exactly as build_prompt embeds it (the same 3-row call, or the rows the talker keeps on a GPU),
            # so padded frames match the prompts.
            c = model.config
            ids = [c.tts_bos_token_id, c.tts_eos_token_id, c.tts_pad_token_id]
            kept = self.talker.text_rows(ids)
            self.tts_pad = (kept if kept is not None
                            else self.talker.embed_text(torch.tensor(ids, device=self.device)))[2]
        history = {} if max_frames is None else {"history_cap": max_frames}      # else slots.py's default
        self.slots = SlotTable(max_slots, tc.hidden_size, tc.vocab_size, tc.num_code_groups, model.dtype,
                               self.device, **history)
        self.padding_slot = max_slots          # SlotTable's scratch row: padded rows of a bucketed decode batch
        self._attached: list[PreparedRequest | None] = [None] * max_slots
        self._sampling = [0, 0]      # attached requests that sample c0 / codes 1..15 (host counters)
        # Per stage: (top_k, uses top-p) of the attached sampling requests -> what the warp can skip (exactly).
        self._warp_settings: list[Counter] = [Counter(), Counter()]
        self._forced_variant: tuple | None = None
        self._voice_cache: OrderedDict[tuple, VoiceClonePrompt] = OrderedDict()
        self._voice_cache_size = voice_cache_size

    # ------------------------------------------------------------------------------------------ prepare
    def prepare(self, request: SpeechRequest) -> PreparedRequest:
        """task voice_clone = a Base model; `voice` = preset speaker (ignored by Base: a stored voice is resolved
        to ref_audio before it gets here); validation and prompt are generate.prepare_many's."""
        result = self.prepare_many([request])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def prepare_many(self, requests: list[SpeechRequest]) -> list[PreparedRequest | ValueError]:
        """`prepare` of a burst of requests with their prompts built together (generate.prepare_many): what each
        gets alone, a bad request's ValueError in its place."""
        results: list = [None] * len(requests)
        synths = {}
        for i, request in enumerate(requests):
            try:
                synths[i] = self._synthesis_request(request)
            except ValueError as e:
                results[i] = e
        built = dict(zip(synths, prepare_many(self.model, list(synths.values()))))
        for i, b in built.items():
            if isinstance(b, Exception):
                results[i] = b
            elif (clone := b[3]) is not None and clone.key is None:
                results[i] = ValueError("a voice-clone prompt without a content key (make it with "
                                        "make_voice_clone_prompt or voice_from_data)")
        good = [i for i in built if results[i] is None]
        # The burst's prefix-cache keys together (position_keys_many: ~0.1 ms of the engine thread a prompt alone)
        keys = position_keys_many([(built[i][0], *_voice_of(built[i][3])) for i in good])
        for i, k in zip(good, keys):
            try:
                if isinstance(k, Exception):
                    raise k                         # a ValueError is this request's; anything else a bug
                results[i] = self._prepared(requests[i], *built[i], keys=k)
            except ValueError as e:
                results[i] = e
        return results

    def _synthesis_request(self, request: SpeechRequest) -> SynthesisRequest:
        model = self.model
        if request.task is not None:
            wanted = "base" if request.task == "voice_clone" else request.task
            if wanted not in _PUBLIC_TASK:
                raise ValueError(f"unknown task {request.task!r}; expected one of {sorted(_PUBLIC_TASK.values())}")
            if wanted != model.task:
                raise ValueError(f"this model serves {_PUBLIC_TASK[model.task]} requests, not {request.task}")
        s = request.sampling
        ref_audio, clone = None, None
        if request.ref_audio is not None:
            ref_audio = pcm_f32(request.ref_audio)
        if model.task == "base":
            if request.voice_clone_prompt is not None:
                clone = voice_from_data(request.voice_clone_prompt, self.device, model.dtype, self.codebook_size)
            elif ref_audio is None:
                raise ValueError("voice_clone needs reference audio (ref_audio: float32 PCM at "
                                 f"{model.sample_rate} Hz) or a stored voice")
            else:
                clone = self._voice_clone_prompt(request.ref_audio, ref_audio, request.ref_text,
                                                 request.x_vector_only)
            ref_audio = None
        elif request.voice_clone_prompt is not None:
            raise ValueError(f"stored voice-clone voices need a Base (voice clone) model; this one serves "
                             f"{_PUBLIC_TASK[model.task]}")
        return SynthesisRequest(
            text=request.text, speaker=request.voice if model.task != "base" else None,
            instruct=request.instructions, language=request.language, ref_audio=ref_audio,
            voice_clone_prompt=clone, non_streaming_mode=request.non_streaming_mode, seed=s.seed,
            greedy=s.greedy, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
            repetition_penalty=s.repetition_penalty, max_new_tokens=s.max_new_tokens)

    def _prepared(self, request: SpeechRequest, prompt, params, max_new_tokens: int, clone, *,
                  keys: list[int]) -> PreparedRequest:
        ref_codes = clone.ref_codes if clone is not None else None
        state = Qwen3RequestState(params=params, trailing_text=prompt.trailing_text,
                                  ignore_eos=request.sampling.ignore_eos, seed=params.seed)
        return PreparedRequest(
            request_id=request.request_id, prompt_embeds=prompt.inputs_embeds, position_keys=keys,
            max_frames=max_new_tokens - 1, state=state, codec_prefix_frames=ref_codes,
            info=dict(layout=prompt.layout, language=prompt.language, speaker=prompt.speaker,
                      instruction_dropped=prompt.instruction_dropped))

    def warmup_requests(self) -> list[SpeechRequest]:
        """Three short requests of this model's task (a preset speaker / a voice description / a one-second clip
        as an x-vector-only clone), default sampling: the engine runs the first alone and the other two together,
        which takes the single and the batched prefill paths and the first-c0 draw through their first use."""
        model = self.model
        kw: dict = {}
        if model.task == "custom_voice":
            kw["voice"] = model.speakers[0]
        elif model.task == "voice_design":
            kw["instructions"] = "A calm, clear voice."
        else:
            t = np.linspace(0.0, 1.0, model.sample_rate, dtype=np.float32)          # one second: a quiet 220 Hz tone
            kw.update(ref_audio=(0.1 * np.sin(2 * np.pi * 220.0 * t)).astype("<f4").tobytes(), x_vector_only=True)
        texts = ("Warming up.", "Warming up the batched prefill.", "And its second row.")
        return [SpeechRequest(text=t, sampling=SamplingOptions(max_new_tokens=3), request_id=f"warmup-{i}", **kw)
                for i, t in enumerate(texts)]

    def describe(self) -> dict:
        model = self.model
        return dict(name=self.name, family="qwen3_tts", task=_PUBLIC_TASK[model.task],
                    sample_rate=model.sample_rate, voices=model.speakers, languages=model.languages,
                    supports_instructions=model.config.supports_instructions,
                    samples_per_frame=model.samples_per_frame,
                    default_max_new_tokens=model.generation.max_new_tokens,    # (a request naming none gets it)
                    # Base models accept a precomputed x-vector (the API's `speaker_embedding`) of this size
                    speaker_embedding_dim=model.config.talker.hidden_size if model.task == "base" else None)

    def make_voice(self, ref_audio: np.ndarray, ref_text: str | None, x_vector_only: bool) -> dict:
        audio = np.ascontiguousarray(ref_audio, dtype=np.float32)
        clone = self._voice_clone_prompt(audio.tobytes(), audio, ref_text, x_vector_only)
        return voice_to_data(clone)

    def _voice_clone_prompt(self, raw: bytes, audio: np.ndarray, ref_text, x_vector_only) -> VoiceClonePrompt:
        """x-vector (+ reference codes) of a clip, cached: clients tend to send the same voice again."""
        key = (hashlib.blake2b(raw, digest_size=16).digest(), ref_text, bool(x_vector_only))
        if key in self._voice_cache:
            self._voice_cache.move_to_end(key)
            return self._voice_cache[key]
        clone = make_voice_clone_prompt(self.model, audio, ref_text, x_vector_only)
        self._voice_cache[key] = clone
        while len(self._voice_cache) > self._voice_cache_size:
            self._voice_cache.popitem(last=False)
        return clone

    # ------------------------------------------------------------------------------------ slot lifecycle
    def attach(self, slot: int, prepared: PreparedRequest) -> None:
        self.attach_many([(slot, prepared)])

    def attach_many(self, pairs: list[tuple[int, PreparedRequest]]) -> None:
        """`attach` for several (slot, request) pairs, their slot rows written together (SlotTable.load_many)."""
        slots = [slot for slot, _ in pairs]
        for slot, _ in pairs:
            if self._attached[slot] is not None:
                raise ValueError(f"slot {slot} already holds request {self._attached[slot].request_id}")
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots attached twice at once: {slots}")
        loads = []
        for slot, prepared in pairs:
            st: Qwen3RequestState = prepared.state
            if st.seed is None:
                st.seed = random.getrandbits(63)
            loads.append(SlotLoad(slot, st.params, seed_key(st.seed), prepared.prompt_len, prepared.max_frames,
                                  st.ignore_eos, st.trailing_text.to(self.device)))
        self.slots.load_many(loads)
        for slot, prepared in pairs:
            st = prepared.state
            if st.resume is not None:
                self.slots.restore(slot, st.resume)
                st.resume = None
            self._attached[slot] = prepared
            self._count_sampling(st.params, +1)

    def detach(self, slot: int) -> None:
        prepared = self._attached[slot]
        if prepared is None:
            return
        prepared.state.resume = self.slots.snapshot(slot, prepared.max_frames)
        self.slots.release_text(slot)
        self._attached[slot] = None
        self._count_sampling(prepared.state.params, -1)

    def _count_sampling(self, params: SamplingParams, delta: int) -> None:
        self._sampling[0] += delta * bool(params.do_sample)
        self._sampling[1] += delta * bool(params.subtalker_do_sample)
        stages = ((params.do_sample, params.top_k, params.top_p),
                  (params.subtalker_do_sample, params.subtalker_top_k, params.subtalker_top_p))
        for counter, (samples, top_k, top_p) in zip(self._warp_settings, stages):
            if samples:
                key = (int(top_k), top_p < 1.0)
                counter[key] += delta
                if counter[key] <= 0:
                    del counter[key]

    def _warp_hint(self, stage: int) -> tuple[int | None, bool]:
        """(top_k bound as a power of two, or None when some sampling request has top-k off or very large;
        whether any sampling request uses top-p) for stage 0 (c0) or 1 (codes 1..15)."""
        settings = list(self._warp_settings[stage])
        if not settings:
            return None, False
        ks = [k for k, _ in settings]
        k_max = None if min(ks) <= 0 or max(ks) > 1024 else 1 << (max(ks) - 1).bit_length()
        return k_max, any(p for _, p in settings)

    @staticmethod
    def _hinted(params: WarpParams, hint: tuple[int | None, bool]) -> WarpParams:
        params.top_k_max, params.any_top_p = hint
        return params

    def resume_embeds(self, slot: int, fed: int | None = None) -> torch.Tensor:
        prepared = self._attached[slot]
        if prepared is None:
            raise ValueError(f"slot {slot} holds no request")
        if fed is None:
            # Read back from the slot: the host waits for the decode in flight (the engine passes its own count:
            # this read made each re-prefill's host phase ~7 ms, the GPU idle behind it, H100 session 48 call 1).
            fed = int(self.slots.fed[slot])
        frames = self.slots.history[slot, :fed].to(torch.long)
        trailing = to_device(prepared.state.trailing_text, self.device)
        k = torch.arange(fed, device=self.device)
        text = torch.where((k < trailing.shape[0])[:, None],
                           trailing[k.clamp(max=trailing.shape[0] - 1)], self.tts_pad.to(trailing))
        with torch.no_grad():
            fed_back = self.talker.embed_frame(frames) + text
        return torch.cat((prepared.prompt_embeds.to(fed_back), fed_back))

    # ------------------------------------------------------------------------------------- the talker
    @property
    def graph_epoch(self) -> int:
        """Changes when slot buffers are reallocated (CUDA graphs holding the old ones must be recaptured)."""
        return self.slots.version

    def decode_variant(self) -> tuple:
        """Which sampling stages any attached request uses (a greedy-only batch skips the sampling math), and per
        stage the warp hints (top-k bound, top-p in use): work skipped exactly, never results changed."""
        if self._forced_variant is not None:
            return self._forced_variant
        return self._sampling[0] > 0, self._sampling[1] > 0, self._warp_hint(0), self._warp_hint(1)

    def startup_variants(self) -> list[tuple]:
        """The variants worth capturing before any request arrives: requests with the model's default sampling
        settings (generation_config.json) alone, and greedy-only batches."""
        params = SamplingParams.from_defaults(self.model.generation)
        saved = [list(self._sampling), [c.copy() for c in self._warp_settings]]
        self._count_sampling(params, +1)
        default = (self._sampling[0] > 0, self._sampling[1] > 0, self._warp_hint(0), self._warp_hint(1))
        self._sampling, self._warp_settings = saved
        return [default, (False, False, (None, False), (None, False))]

    def force_variant(self, variant: tuple | None) -> None:
        """Make decode take `variant`'s path whatever is attached (graph capture at startup); None: back to normal.
        Only for capture: a variant that skips work some attached request needs would change its results."""
        self._forced_variant = variant

    @torch.no_grad()
    def prefill(self, slot: int, embeds: torch.Tensor, start: int, kv: PagedKVContext, last: bool) -> None:
        st: Qwen3RequestState = self._attached[slot].state
        n = embeds.shape[0]
        positions = torch.arange(start, start + n, device=self.device)[None]
        x = embeds.to(device=self.device, dtype=self.model.dtype)[None]
        hidden = self.prefill_forward(x, positions, kv)
        if last and st.needs_first_c0:
            # The head runs on the whole chunk, as the reference does on the whole prompt (same GEMM when
            # unchunked), so a lone prefill gives the reference's first c0 bit for bit.
            self._first_c0([slot], self.talker.codec_logits(hidden)[:, -1], hidden[:, -1])

    @torch.no_grad()
    def prefill_batch(self, chunks: list[tuple[int, torch.Tensor, int, bool]], kv: PagedKVContext) -> None:
        """Several requests' prefill chunks (slot, embeds [s_i, H], start, last) in ONE talker forward.

        Chunks are LEFT-padded to the longest, S: row i's real tokens are its last s_i query positions, which is
        where the paged view's right-aligned context and causal mask expect them. The padding queries (zero
        embeddings, position 0) write their K/V where `kv.slot_mapping` says (the engine points them at a scratch
        page), are never part of any context, and their outputs are dropped."""
        size = max(e.shape[0] for _, e, _, _ in chunks)
        dtype = self.model.dtype
        x = torch.zeros(len(chunks), size, self.talker.cfg.hidden_size, dtype=dtype, device=self.device)
        positions = torch.zeros(len(chunks), size, dtype=torch.long, device=self.device)
        for i, (_, embeds, start, _) in enumerate(chunks):
            n = embeds.shape[0]
            x[i, size - n:] = embeds.to(device=self.device, dtype=dtype)
            positions[i, size - n:] = torch.arange(start, start + n, device=self.device)
        hidden = self.prefill_forward(x, positions, kv)
        self.prefill_outputs([(slot, last) for slot, _, _, last in chunks], hidden[:, -1])

    # The prefill split in two for the engine's prefill CUDA graphs (voxflow/engine/prefill_runner.py): the talker
    # forward over left-padded inputs (capturable: device tensors only, shapes fixed by the inputs), then the
    # first-c0 draw from each row's last position (host bookkeeping, outside any graph).
    def prefill_input_spec(self) -> tuple[int, torch.dtype]:
        """(hidden size, dtype) of the talker inputs `prefill_forward` takes."""
        return self.talker.cfg.hidden_size, self.model.dtype

    def prefill_forward(self, x: torch.Tensor, positions: torch.Tensor, kv: PagedKVContext) -> torch.Tensor:
        """x [B, S, H] left-padded prompt embeddings, positions [B, S] -> talker hidden states [B, S, H]; writes the
        K/V of all B x S positions where `kv.slot_mapping` says. Packed (engine/packed_prefill.py): B tokens, S = 1."""
        view = PagedKVView(kv, x.shape[1])
        # (a packed prefill, one token a row, attends through the tiled kernel with kernels on: no mask built then)
        return self.talker(x, positions, view, view.attention_mask(x))

    def prefill_outputs(self, rows: list[tuple[int, bool]], last_hidden: torch.Tensor) -> None:
        """After `prefill_forward`: rows (slot, last chunk?) with each row's last-position hidden state [B, H]; the
        first c0 of the slots whose prompt is now complete."""
        picked = [i for i, (slot, last) in enumerate(rows) if last and self._attached[slot].state.needs_first_c0]
        if picked:
            # index_select with device indices: indexing by a Python list would copy it in blocking
            h = last_hidden if len(picked) == len(rows) else last_hidden.index_select(0, tensor_to(picked, self.device))
            self._first_c0([rows[i][0] for i in picked], self.talker.codec_logits(h), h)

    def _first_c0(self, slot_list: list[int], logits: torch.Tensor, h: torch.Tensor) -> None:
        """c0 of frame 0 for these slots from their last prompt position's logits [n, V] and hidden state [n, H]."""
        s = self.slots
        rows = tensor_to(slot_list, self.device)          # no blocking copy: the decode in flight goes on
        zero = torch.zeros(len(slot_list), dtype=torch.long, device=self.device)
        states = [self._attached[slot].state for slot in slot_list]
        g = s.gather(rows)
        c0 = select_c0(logits, s.seen, zero, g.penalty, g.min_new_tokens, self.suppress,
                       self._hinted(g.talker_params(), self._warp_hint(0)), g.key, zero, self.eos_id,
                       any(st.params.do_sample for st in states), seen_rows=rows)
        s.keep_c0(rows, c0, h)
        for st in states:
            st.needs_first_c0 = False

    @torch.no_grad()
    def decode(self, slots: torch.Tensor, kv: PagedKVContext) -> DecodeOutput:
        s, talker = self.slots, self.talker
        rows = slots.to(device=self.device, dtype=torch.long)
        g = s.gather(rows)                                   # the batch's scalars: one gather per dtype
        c0, h, fed, keys = g.c0, s.h[rows], g.fed, g.key
        # Host-side knowledge only (no sync): skip the sampling math when no attached request samples.
        t_sampling, cp_sampling, t_hint, cp_hint = self.decode_variant()

        # 1. codes 1..15 of the pending frame `fed`, then the frame is complete
        # (The named ranges show up in profiles, not in CUDA graphs.)
        with record_function("code_predictor"):
            sample_fn = residual_sample_fn(self._hinted(g.cp_params(), cp_hint), keys, fed, cp_sampling)
            residual, frame_embed = talker.predict_residual_codes(h, c0, sample_fn, frame_embed=True,
                                                                  embed_parts=s.sums_frame_embed(h))
            frame = torch.cat((c0[:, None], residual), dim=1)                    # [B, 16]

        # 2. feed it back at position P + fed, on the paged cache
        with record_function("talker"):
            # == talker.embed_frame(frame) + the text row
            x, positions = s.frame_input(rows, fed, g.trailing_len, g.prompt_len, frame_embed, self.tts_pad)
            view = PagedKVView(kv, 1)
            positions = positions[:, None]
            hidden = talker(x[:, None], positions, view, view.attention_mask(x))

        # 3. c0 of frame fed + 1 (fed + 1 c0 ids generated so far)
        with record_function("c0_sampling"):
            nxt = fed + 1
            logits = talker.codec_logits(hidden)[:, -1]
            c0_next = select_c0(logits, s.seen, nxt, g.penalty, g.min_new_tokens, self.suppress,
                                self._hinted(g.talker_params(), t_hint), keys, nxt, self.eos_id, t_sampling,
                                seen_rows=rows)

        # 4. scatter the state back; the finished / EOS flags side by side, as the engine copies them out
        flags = s.write_back(rows, fed, frame, c0_next, hidden[:, -1], g.max_frames, self.eos_id)
        return DecodeOutput(frames=frame, finished=flags[:, 0], eos=flags[:, 1], flags=flags)


def _voice_of(clone) -> tuple[int | None, int]:
    """(voice key, reference frames) of a prompt's voice-clone prompt (or None), as position_keys takes them."""
    if clone is None:
        return None, 0
    return clone.key, clone.ref_codes.shape[0] if clone.ref_codes is not None else 0
