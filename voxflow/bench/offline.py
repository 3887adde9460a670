"""Offline mode: the engine driven in-process (no HTTP, no asyncio), to separate engine speed from server overhead.

The same load shapes as the HTTP client on the engine's own clock (`time.monotonic()`, the clock of
`AudioChunk.emitted_at`): closed loop keeps `c` requests in the engine and adds the next as soon as one
finishes; open loop adds requests at their Poisson times between steps, and a request's arrival is its
*scheduled* time (a step in progress delays its admission, which then counts as queueing, as it would for a
server). TTFP = first AudioChunk's emitted_at - arrival; E2E = FinalRecord.finished_at - arrival; audio bytes are
s16 PCM at the engine's sample rate. Records have the same shape as the HTTP ones (metrics.RequestRecord).
"""
from __future__ import annotations

import collections
import time

from .client import Level, poisson_times
from .metrics import RequestRecord
from .workloads import Prompt, RequestSpec, WorkloadError

STREAM_ALIASES = {"initial_codec_chunk_frames": "initial_chunk_frames", "chunk_frames": "chunk_frames"}


def parse_engine_args(items: list[str] | None) -> dict:
    """`--engine-arg key=value` (repeatable) -> EngineConfig fields (voxflow/engine/engine_args.py)."""
    from voxflow.engine.engine_args import parse_engine_args as parse
    try:
        return parse(items)
    except ValueError as e:
        raise WorkloadError(str(e)) from None


def build_engine(model: str, *, device: str = "cpu", dtype: str = "float32", max_num_seqs: int | None = None,
                 engine_args: dict | None = None, gc_freeze: bool = True):
    """The engine an offline run measures; gc_freeze: its startup objects out of the garbage collector's sight, as
    the serving process does (engine/gc_freeze.py)."""
    from voxflow.engine.engine import EngineConfig
    from voxflow.engine.gc_freeze import freeze_core_startup
    from voxflow.models.registry import build_engine as build_core
    kw = dict(engine_args or {})
    if max_num_seqs is not None:
        kw["max_num_seqs"] = max_num_seqs
    core = build_core(EngineConfig(model=model, device=device, dtype=dtype, **kw))   # one-shot (piper:...) too
    if gc_freeze:
        freeze_core_startup(core)
    return core


class RequestFactory:
    """Prompt -> SpeechRequest for the engine (same settings as the HTTP body where they apply)."""

    def __init__(self, core, spec: RequestSpec):
        from voxflow.engine.request import SamplingOptions
        self.core, self.spec = core, spec
        info = core.info()
        self.voice = spec.voice
        task = spec.task or info.get("task")
        voices = info.get("voices") or []
        if self.voice is None and task == "custom_voice" and voices:
            self.voice = "vivian" if "vivian" in [v.lower() for v in voices] else voices[0]
        sampling = {k: v for k, v in spec.extra_body.items() if k in SamplingOptions.__dataclass_fields__}
        streaming = {STREAM_ALIASES[k]: v for k, v in spec.extra_body.items() if k in STREAM_ALIASES}
        self.ignored_extras = sorted(set(spec.extra_body) - set(sampling) - set(STREAM_ALIASES))
        sampling.update(seed=spec.seed, greedy=spec.greedy, max_new_tokens=spec.max_new_tokens,
                        ignore_eos=spec.ignore_eos)
        self.sampling, self.streaming = sampling, streaming
        self._refs: dict[bytes, bytes] = {}
        self._n = 0

    def __call__(self, prompt: Prompt, tag: str):
        from voxflow.engine.request import SamplingOptions, SpeechRequest, StreamingOptions
        spec = self.spec
        ref = spec.reference_for(prompt)
        ref_audio = ref_text = None
        if ref is not None:
            data, _, ref_text = ref
            if data not in self._refs:
                from voxflow.audio.io import load_reference_audio
                self._refs[data] = load_reference_audio(data, target_sr=self.core.sample_rate).astype("<f4").tobytes()
            ref_audio = self._refs[data]
        self._n += 1
        return SpeechRequest(
            text=prompt.text, task=spec.task, voice=self.voice, instructions=spec.instructions,
            language=spec.language_of(prompt), ref_audio=ref_audio,
            ref_text=None if spec.x_vector_only else ref_text, x_vector_only=spec.x_vector_only,
            sampling=SamplingOptions(**self.sampling),
            streaming=StreamingOptions(stream=spec.stream != "off", **self.streaming),
            pcm_format="s16", request_id=f"bench-{tag}-{self._n:06d}")


def run_level(core, factory: RequestFactory, level: Level, prompts: list[Prompt], warmups: list[Prompt],
              seed: int, progress=None, keep_audio: bool = False) -> list[RequestRecord]:
    """keep_audio: measured requests keep their s16 PCM as `record.pcm` (not a field: never in the JSON)."""
    records: list[RequestRecord] = []
    for phase, items in (("warmup", warmups), ("measure", prompts)):
        if items:
            records += _run_phase(core, factory, level, items, phase == "warmup",
                                  seed + (phase == "warmup"), progress, keep_audio and phase == "measure")
    return records


def _run_phase(core, factory, level: Level, items: list[Prompt], warmup: bool, seed: int, progress,
               keep_audio: bool = False):
    from voxflow.engine.core_driving import add_to_core, early_outputs, refusal_kind
    from voxflow.engine.request import AudioChunk
    open_loop = level.mode == "open"
    times = poisson_times(len(items), level.rate, seed) if open_loop else [None] * len(items)
    pending = collections.deque(enumerate(times))
    cap = level.max_concurrency if open_loop else level.concurrency
    inflight: dict[str, tuple[RequestRecord, float]] = {}
    done: list[RequestRecord] = []
    sr = core.sample_rate
    origin = time.monotonic()

    def finish(rec: RequestRecord):
        done.append(rec)
        if progress is not None:
            progress.update(1)

    def take(outputs) -> None:
        for out in outputs:
            entry = inflight.get(out.request_id)
            if entry is None:
                continue
            rec, arrival = entry
            if isinstance(out, AudioChunk):
                t = out.emitted_at - arrival
                if rec.first_byte_s is None:
                    rec.first_byte_s = t
                rec.chunk_times_s.append(t)
                rec.chunk_bytes.append(len(out.pcm))
                rec.audio_bytes += len(out.pcm)
                rec.sample_rate = out.sample_rate
                if keep_audio:
                    rec.pcm += out.pcm
                continue
            del inflight[out.request_id]
            rec.end_s = out.finished_at - arrival
            rec.ttfp_parts_s = getattr(out, "ttfp_parts", None)
            reason = getattr(out.reason, "value", out.reason)
            if reason == "error":
                rec.error, rec.error_detail = f"engine_{out.error_kind or 'error'}", (out.error or "")[:300]
            elif reason == "aborted":
                rec.error = "aborted"
            elif rec.audio_bytes == 0:
                rec.error, rec.error_detail = "no_audio", "the request finished without audio"
            finish(rec)

    with early_outputs(core, take):     # (outputs ready before a step's end: EngineConfig.emit_while_waiting)
        while pending or inflight:
            now = time.monotonic()
            admitted = []           # the requests due now, added together (their prompts built in one batched pass)
            while pending and (cap is None or len(inflight) < cap) and \
                    (not open_loop or origin + pending[0][1] <= now):
                i, sched = pending.popleft()
                prompt = items[i]
                rec = RequestRecord(index=i, prompt_id=prompt.id, warmup=warmup, stream=factory.spec.stream != "off",
                                    scheduled_s=sched, text_chars=len(prompt.text), sample_rate=sr,
                                    sample_rate_source="engine")
                req = factory(prompt, "w" if warmup else "m")
                rec.request_id = req.request_id
                if keep_audio:
                    rec.pcm = bytearray()
                arrival = origin + sched if open_loop else time.monotonic()
                rec.start_s = arrival - origin
                admitted.append((req, rec, arrival))
                inflight[req.request_id] = (rec, arrival)      # (counted against the cap; refused ones leave below)
            errors = add_to_core(core, [a[0] for a in admitted]) if admitted else []
            for (req, rec, arrival), error in zip(admitted, errors):
                if error is None:
                    continue
                kind = refusal_kind(error)
                del inflight[req.request_id]
                rec.error, rec.error_detail, rec.end_s = kind, str(error)[:300], time.monotonic() - arrival
                finish(rec)
            if not core.has_work():
                if pending and open_loop:
                    time.sleep(max(0.0, origin + pending[0][1] - time.monotonic()))
                continue
            take(core.step())
    done.sort(key=lambda r: r.index)
    return done
