"""EngineCore: one model replica's synchronous step loop (scheduler -> talker -> codec -> outputs).

    core = EngineCore.from_config(EngineConfig(model="path/or/hub-id"))
    core.add_request(SpeechRequest(text="Hello."))
    while core.has_work():
        for out in core.step():          # AudioChunk ... then one FinalRecord per request
            ...

One `step()`: the scheduler picks this step's decodes and prefill chunks (continuous batching under a token
budget, paged KV with prefix caching, preemption when memory runs out); the talker runs the prefill chunks, then
one batched decode that completes one frame per running request; the codec executor turns due frames into PCM
chunks (batched across requests); finished requests free their KV blocks, slot and codec state at once.
It is single-threaded and knows nothing of HTTP or asyncio: `inprocess.py` / `process.py` drive it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..audio.io import pcm_bytes
from .block_manager import BlockManager, num_blocks_for
from .codec_executor import CodecExecutor
from .model_api import CodecModel, PagedKVContext, PreparedRequest, TTSModel
from .request import AudioChunk, FinalRecord, FinishReason, SpeechRequest, Usage
from .scheduler import Scheduler, SchedulerConfig
from .sequence import SeqStatus, Sequence

Output = AudioChunk | FinalRecord


@dataclass
class EngineConfig:
    model: str                                 # model folder or hub id
    device: str = "cpu"
    dtype: str = "float32"
    max_num_seqs: int = 32                     # requests decoding at once (model slots)
    max_num_batched_tokens: int = 2048         # positions computed per step (decodes + prefill chunks)
    prefill_chunk_size: int | None = 512       # most prompt positions of one request per step
    block_size: int = 16                       # positions per KV page
    kv_cache_bytes: int | None = None          # memory for the KV pool (default: enough for max_num_seqs x 4096)
    num_kv_blocks: int | None = None           # or an explicit number of pages (tests: a tiny pool)
    chunk_frames: int = 25                     # regular streaming chunk (2 s of audio at 12.5 Hz)
    max_waiting: int = 1024                    # queue limit; add_request raises QueueFullError beyond it


class QueueFullError(RuntimeError):
    """The engine's queue is full: retry later (HTTP 429/503)."""


@dataclass
class _Live:
    """Engine-side bookkeeping of one request."""
    request: SpeechRequest
    prepared: PreparedRequest
    seq: Sequence
    arrived_at: float
    attached: bool = False
    frames_out: int = 0
    samples_out: int = 0
    chunks_out: int = 0
    first_chunk_at: float | None = None
    finish_reason: FinishReason | None = None
    extra: dict = field(default_factory=dict)


class EngineCore:
    def __init__(self, model: TTSModel, codec: CodecModel, config: EngineConfig):
        self.model, self.codec, self.config = model, codec, config
        if config.num_kv_blocks is not None:
            num_blocks = config.num_kv_blocks
        else:
            budget = config.kv_cache_bytes or model.kv_spec.bytes_per_token * config.max_num_seqs * 4096
            num_blocks = num_blocks_for(budget, model.kv_spec, config.block_size)
        spec = model.kv_spec
        shape = (num_blocks, config.block_size, spec.num_kv_heads, spec.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=spec.dtype, device=model.device) for _ in range(spec.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=spec.dtype, device=model.device) for _ in range(spec.num_layers)]
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens,
                                                   config.prefill_chunk_size), self.block_manager)
        self.codec_exec = CodecExecutor(codec, config.chunk_frames)
        self.live: dict[str, _Live] = {}
        self.steps = 0
        self.stats_counters = {"finished": 0, "aborted": 0, "errors": 0, "preemptions": 0, "audio_seconds": 0.0}

    @classmethod
    def from_config(cls, config: EngineConfig) -> "EngineCore":
        from ..models.registry import load_for_engine
        model, codec = load_for_engine(config.model, device=config.device, dtype=config.dtype,
                                       max_slots=config.max_num_seqs)
        return cls(model, codec, config)

    # ---- requests ---------------------------------------------------------------------------------------
    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    def add_request(self, request: SpeechRequest) -> None:
        """Validate and queue. Raises ValueError (bad input) or QueueFullError; nothing is queued then."""
        if request.request_id in self.live:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        if self.scheduler.num_waiting >= self.config.max_waiting:
            raise QueueFullError(f"the engine queue is full ({self.config.max_waiting} waiting requests)")
        prepared = self.model.prepare(request)
        seq = Sequence.from_prepared(prepared)
        self.live[request.request_id] = _Live(request, prepared, seq, time.monotonic())
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> list[Output]:
        """Stop a request at once (client gone); returns its final record (empty if unknown/finished)."""
        live = self.live.get(request_id)
        if live is None:
            return []
        live.finish_reason = FinishReason.ABORTED
        return [self._retire(live)]

    def info(self) -> dict:
        """The served model as the API shows it (name, task, sample rate, voices, languages, ...)."""
        return self.model.describe()

    def create_voice(self, ref_audio: bytes, ref_text: str | None, x_vector_only: bool) -> dict:
        """Compute a voice-clone prompt once (float32 mono PCM at the model rate in); plain data out, to store
        and send back as `SpeechRequest.voice_clone_prompt`. ValueError on bad input."""
        audio = np.frombuffer(ref_audio, dtype="<f4")
        if audio.size == 0:
            raise ValueError("reference audio is empty")
        return self.model.make_voice(audio, ref_text, x_vector_only)

    def has_work(self) -> bool:
        return bool(self.live)

    def stats(self) -> dict:
        return {"running": self.scheduler.num_running, "waiting": self.scheduler.num_waiting,
                "kv_usage": self.scheduler.kv_usage(), "steps": self.steps, **self.stats_counters}

    def shutdown(self) -> None:
        for rid in list(self.live):
            self.abort(rid)

    # ---- one step ---------------------------------------------------------------------------------------
    def step(self) -> list[Output]:
        self.steps += 1
        outputs: list[Output] = []
        sched = self.scheduler.schedule()
        for rejection in sched.rejected:
            live = self.live.get(rejection.seq.request_id)
            if live is not None:
                live.finish_reason = FinishReason.ERROR
                outputs.append(self._retire(live, error=rejection.reason))
        self.stats_counters["preemptions"] += len(sched.preempted)

        for chunk in sched.prefill:
            live = self.live[chunk.seq.request_id]
            self._run_prefill(live, chunk.start, chunk.end, chunk.is_last)

        finished: set[str] = set()
        if sched.decode:
            finished |= self._run_decode(sched.decode)

        for dc in self.codec_exec.run(finished):
            live = self.live[dc.request_id]
            outputs.append(self._chunk(live, dc.pcm, dc.first_frame, dc.num_frames, dc.index))
        for rid in finished:
            outputs.append(self._retire(self.live[rid]))
        return outputs

    def _kv(self, block_tables: list[list[int]], context_lens: list[int], slot_mapping: list[list[int]]):
        # Table width rounded up to a power of two: the attention context then takes one of a few static shapes
        # per batch size (what CUDA-graph capture needs) instead of a new shape at every block boundary.
        width = max(len(t) for t in block_tables)
        width = 1 << (width - 1).bit_length()
        tables = torch.full((len(block_tables), width), -1, dtype=torch.long)
        for i, t in enumerate(block_tables):
            tables[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        device = self.model.device
        return PagedKVContext(self.k_cache, self.v_cache, self.config.block_size, tables.to(device),
                              torch.tensor(context_lens, dtype=torch.long, device=device),
                              torch.tensor(slot_mapping, dtype=torch.long, device=device))

    def _run_prefill(self, live: _Live, start: int, end: int, last: bool) -> None:
        seq = live.seq
        if not live.attached:
            self.model.attach(seq.slot, live.prepared)
            live.attached = True
            self.codec_exec.add(seq.request_id, stream=live.request.streaming.stream,
                                initial_frames=live.request.streaming.initial_chunk_frames,
                                chunk_frames=live.request.streaming.chunk_frames,
                                num_active=self.scheduler.num_running,
                                prefix_frames=live.prepared.codec_prefix_frames)
        if seq.num_preemptions > 0:
            embeds = live.extra.get("resume_embeds")
            if embeds is None or embeds.shape[0] < end:
                embeds = live.extra["resume_embeds"] = self.model.resume_embeds(seq.slot)
        else:
            embeds = live.prepared.prompt_embeds
        kv = self._kv([seq.block_table], [end], [self.block_manager.slot_mapping(seq, start, end)])
        self.model.prefill(seq.slot, embeds[start:end], start, kv, last)
        if last:
            live.extra.pop("resume_embeds", None)

    def _run_decode(self, seqs: list[Sequence]) -> set[str]:
        slots = torch.tensor([s.slot for s in seqs], dtype=torch.long, device=self.model.device)
        kv = self._kv([s.block_table for s in seqs], [s.num_computed for s in seqs],
                      [self.block_manager.slot_mapping(s, s.num_computed - 1, s.num_computed) for s in seqs])
        out = self.model.decode(slots, kv)
        frames = out.frames.cpu()
        finished = out.finished.cpu().tolist()
        eos = out.eos.cpu().tolist()
        done = set()
        for i, seq in enumerate(seqs):
            live = self.live[seq.request_id]
            self.codec_exec.push(seq.request_id, frames[i:i + 1])
            live.frames_out += 1
            if finished[i]:
                live.finish_reason = FinishReason.EOS if eos[i] else FinishReason.LENGTH
                done.add(seq.request_id)
        return done

    # ---- outputs ----------------------------------------------------------------------------------------
    def _chunk(self, live: _Live, pcm: np.ndarray, first_frame: int, num_frames: int, index: int) -> AudioChunk:
        now = time.monotonic()
        if live.first_chunk_at is None:
            live.first_chunk_at = now
        live.samples_out += pcm.shape[0]
        live.chunks_out += 1
        return AudioChunk(live.request.request_id, index, pcm_bytes(pcm, live.request.pcm_format),
                          self.model.sample_rate, int(pcm.shape[0]), first_frame, num_frames, emitted_at=now)

    def _retire(self, live: _Live, error: str | None = None) -> FinalRecord:
        rid = live.request.request_id
        seq = live.seq
        if live.attached and seq.slot is not None:
            self.model.detach(seq.slot)
        if seq.status is not SeqStatus.FINISHED:
            self.scheduler.finish(seq)
        self.codec_exec.remove(rid)
        del self.live[rid]
        reason = live.finish_reason or FinishReason.ERROR
        key = {FinishReason.ABORTED: "aborted", FinishReason.ERROR: "errors"}.get(reason, "finished")
        self.stats_counters[key] += 1
        seconds = live.samples_out / self.model.sample_rate
        self.stats_counters["audio_seconds"] += seconds
        return FinalRecord(rid, reason, Usage(prompt_tokens=live.prepared.prompt_len, frames=live.frames_out,
                                              audio_seconds=seconds),
                           error=error, arrived_at=live.arrived_at, first_chunk_at=live.first_chunk_at)
