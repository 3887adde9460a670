"""OneShotCore: the engine core for non-autoregressive ("one-shot") voices such as Piper (VITS).

A one-shot model turns a whole unit of text (a sentence) into its waveform in one forward pass: no KV cache,
no frames, no codec. This core gives such a model the same interface as `EngineCore` (add_request / abort /
step / has_work / stats / info / create_voice / shutdown), so the in-process and process clients and the API
serve it unchanged.

    core = OneShotCore(model, OneShotConfig(max_running=32))
    core.add_request(SpeechRequest(text="Hello there. How are you?"))
    while core.has_work():
        for out in core.step():          # AudioChunk ... then one FinalRecord per request
            ...

What the model provides (`OneShotModel`, duck-typed; the core never imports a family):
- `sample_rate: int`; `describe() -> dict` (the core's `info()`);
- `prepare(request) -> OneShotPlan`: validate (ValueError for bad input) and split the text into synthesis
  units (sentences; the model decides, the core treats them as opaque), with per-request options;
- `synthesize_batch(items: list[(unit, options)]) -> list[np.ndarray]`: float32 mono waveforms, one per item.
  The model decides whether that is one batched forward pass or a loop; it must return each item's audio
  independent of what else is in the batch (the stream == non-stream and "load does not change the audio"
  guarantees rest on that);
- optional `make_voice(ref_audio, ref_text, x_vector_only)` (voice cloning; absent = ValueError).

Scheduling, one `step()`:
- admit waiting requests into the running set (at most `max_running`), FIFO;
- pick up to `max_batch` running requests and the next unit of each, within `max_step_cost` (sum of unit
  costs, e.g. phoneme ids; the first pick always fits, so one oversized unit still runs). Requests that have
  not produced audio yet go first (time to first audio), but when any started request exists at least one of
  them is in every step, and started requests are served round-robin, so no request starves;
- synthesize the picked units (one `synthesize_batch` call). If the call raises, each item is retried alone
  and only the request whose unit fails ends with an ERROR record (error_kind "internal"): errors stay
  isolated per request;
- streaming requests get one AudioChunk per unit as soon as it is synthesized; non-streaming ones
  (`request.streaming.stream == False`) get one AudioChunk holding all units at the end. The PCM of a
  non-streamed request is the concatenation of the streamed chunks' PCM, byte for byte (s16 is encoded
  sample-wise, so this holds for both formats).
- a request whose units are all done gets its FinalRecord (reason EOS) in the same step.

AudioChunk fields (there are no codec frames here): `first_frame` / `num_frames` count synthesis units
(sentences): a chunk covers units [first_frame, first_frame + num_frames); `num_samples` counts samples at
`sample_rate`. Usage: `prompt_tokens` = the plan's token count (phoneme ids for Piper), `frames` = units
synthesized, `audio_seconds` = samples out / sample rate.

`abort(request_id)` drops a request at any point (waiting, between units) and returns its ABORTED record.
Nothing else is held for it: a one-shot model keeps no per-request state between units.
"""
from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..audio.io import pcm_bytes
from .config import EngineConfig
from .errors import QueueFullError  # the class the clients catch as back-pressure
from .request import AudioChunk, FinalRecord, FinishReason, SpeechRequest, Usage, check_options

log = logging.getLogger(__name__)

Output = AudioChunk | FinalRecord


@dataclass
class OneShotPlan:
    """What a model's `prepare(request)` returns."""
    units: list[Any]                       # synthesis units in order (e.g. phoneme-id lists of sentences)
    options: Any = None                    # per-request synthesis options, passed back with every unit
    costs: list[int] | None = None         # per-unit work estimate for the step budget (default 1 each)
    prompt_tokens: int = 0                 # reported as Usage.prompt_tokens


class OneShotModel(Protocol):
    sample_rate: int

    def describe(self) -> dict: ...

    def prepare(self, request: SpeechRequest) -> OneShotPlan: ...

    def synthesize_batch(self, items: list[tuple[Any, Any]]) -> list[np.ndarray]: ...


@dataclass
class OneShotConfig:
    max_running: int = 32                  # requests in progress at once (the rest wait, FIFO)
    max_batch: int = 4                     # units synthesized per step (one per request)
    max_step_cost: int = 2048              # sum of unit costs per step (the first pick always fits)
    max_waiting: int = 1024                # queue limit; add_request raises QueueFullError beyond it

    @classmethod
    def from_engine_config(cls, config: Any) -> "OneShotConfig":
        """Map an EngineConfig: max_num_seqs -> max_running, max_num_batched_tokens -> max_step_cost (when set:
        its default, 4096, is sized for a GPU talker's steps; a one-shot step's units run one after another on a
        CPU, so it keeps its own 2048 then), max_waiting -> max_waiting. max_batch stays 4: with onnxruntime on CPU
        a step runs its units one after another (see models/piper/voice.py), so a bigger batch only lengthens the
        step (abort latency)."""
        budget = getattr(config, "max_num_batched_tokens", None)
        if budget is None or budget == EngineConfig.max_num_batched_tokens:
            budget = cls.max_step_cost
        return cls(max_running=max(1, int(getattr(config, "max_num_seqs", 32))), max_step_cost=max(1, int(budget)),
                   max_waiting=int(getattr(config, "max_waiting", 1024)))


@dataclass
class _Live:
    request: SpeechRequest
    plan: OneShotPlan
    arrived_at: float
    next_unit: int = 0
    chunks_out: int = 0
    samples_out: int = 0
    first_chunk_at: float | None = None
    held: list[np.ndarray] = field(default_factory=list)    # non-streaming: units waiting for the end

    @property
    def done(self) -> bool:
        return self.next_unit >= len(self.plan.units)

    def cost(self) -> int:
        costs = self.plan.costs
        return int(costs[self.next_unit]) if costs else 1


class OneShotCore:
    def __init__(self, model: OneShotModel, config: OneShotConfig | None = None):
        self.model = model
        self.config = config or OneShotConfig()
        for key in ("max_running", "max_batch", "max_step_cost"):
            if getattr(self.config, key) < 1:
                raise ValueError(f"OneShotConfig.{key} must be >= 1")
        self.live: dict[str, _Live] = {}
        self.waiting: collections.deque[str] = collections.deque()
        self.running: collections.deque[str] = collections.deque()   # round-robin order (front = next)
        self.steps = 0
        self.stats_counters = {"finished": 0, "aborted": 0, "errors": 0, "preemptions": 0, "audio_seconds": 0.0,
                               "units": 0, "synthesis_seconds": 0.0}
        self.last_batch_size = 0
        self._served_fresh = False      # max_batch 1: the last step served a not-started request

    # ---- the EngineCore interface -----------------------------------------------------------------------
    @property
    def sample_rate(self) -> int:
        return int(self.model.sample_rate)

    def add_request(self, request: SpeechRequest) -> None:
        """Validate and queue. Raises ValueError (bad input) or QueueFullError; nothing is queued then."""
        check_options(request)          # the numeric options' bounds, as EngineCore.add_requests checks them
        rid = request.request_id
        if rid in self.live:
            raise ValueError(f"request id {rid!r} is already in use")
        if request.pcm_format not in ("f32", "s16"):
            raise ValueError(f"pcm_format must be 'f32' or 's16', not {request.pcm_format!r}")
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFullError(f"the engine queue is full ({self.config.max_waiting} waiting requests)")
        try:
            plan = self.model.prepare(request)
        except ValueError:
            raise
        except Exception as e:          # the model choked on this input: fail this request, not the engine
            log.exception("model.prepare failed for request %s", rid)
            raise ValueError(f"the model could not prepare this request: {type(e).__name__}: {e}") from e
        if not plan.units:
            raise ValueError("the text has nothing to speak")
        if plan.costs is not None and len(plan.costs) != len(plan.units):
            raise RuntimeError("model.prepare returned costs that do not match its units")
        self.live[rid] = _Live(request, plan, time.monotonic())
        self.waiting.append(rid)

    def abort(self, request_id: str) -> list[Output]:
        """Stop a request at once (client gone); returns its final record (empty if unknown/finished)."""
        live = self.live.get(request_id)
        if live is None:
            return []
        return [self._retire(live, FinishReason.ABORTED)]

    def has_work(self) -> bool:
        return bool(self.live)

    def info(self) -> dict:
        return self.model.describe()

    def create_voice(self, ref_audio: bytes, ref_text: str | None, x_vector_only: bool) -> dict:
        make = getattr(self.model, "make_voice", None)
        if make is None:
            name = self.model.describe().get("name", "this model")
            raise ValueError(f"{name} cannot clone voices: it only speaks with its preset voice(s)")
        audio = np.frombuffer(ref_audio, dtype="<f4")
        if audio.size == 0:
            raise ValueError("reference audio is empty")
        return make(audio, ref_text, x_vector_only)

    def stats(self) -> dict:
        return {"running": len(self.running), "waiting": len(self.waiting), "kv_usage": 0.0, "steps": self.steps,
                "batch_size": self.last_batch_size, **self.stats_counters}

    def shutdown(self) -> None:
        for rid in list(self.live):
            self.abort(rid)

    # ---- one step ---------------------------------------------------------------------------------------
    def step(self) -> list[Output]:
        self.steps += 1
        self._admit()
        picked = self._pick()
        self.last_batch_size = len(picked)
        outputs: list[Output] = []
        if not picked:
            return outputs
        audios = self._synthesize(picked)
        for live, audio in zip(picked, audios):
            rid = live.request.request_id
            if rid not in self.live:
                continue
            if isinstance(audio, BaseException):
                outputs.append(self._retire(live, FinishReason.ERROR,
                                            error=f"synthesis failed: {type(audio).__name__}: {audio}",
                                            error_kind="internal"))
                continue
            unit = live.next_unit
            live.next_unit += 1
            self.stats_counters["units"] += 1
            if live.request.streaming.stream:
                outputs.append(self._chunk(live, audio, unit, 1))
            else:
                live.held.append(audio)
                if live.done:
                    whole = np.concatenate(live.held) if live.held else np.zeros(0, np.float32)
                    live.held = []
                    outputs.append(self._chunk(live, whole, 0, len(live.plan.units)))
            if live.done:
                outputs.append(self._retire(live, FinishReason.EOS))
        return outputs

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_running:
            self.running.append(self.waiting.popleft())

    def _pick(self) -> list[_Live]:
        """This step's requests: not-started ones first (FIFO), at least one started one (round-robin), within
        max_batch and max_step_cost."""
        cfg = self.config
        fresh = [rid for rid in self.running if self.live[rid].next_unit == 0]
        started = [rid for rid in self.running if self.live[rid].next_unit > 0]
        order = fresh + started
        if started and fresh:
            # keep a seat for the started request next in line, so a flood of new requests cannot starve it
            # (with max_batch 1: every other step)
            if cfg.max_batch > 1:
                order = fresh[:cfg.max_batch - 1] + [started[0]] + fresh[cfg.max_batch - 1:] + started[1:]
            elif self._served_fresh:
                order = started + fresh
        picked, budget = [], cfg.max_step_cost
        for rid in order:
            if len(picked) >= cfg.max_batch:
                break
            live = self.live[rid]
            cost = live.cost()
            if picked and cost > budget:
                continue
            picked.append(live)
            budget -= cost
        self._served_fresh = bool(picked) and picked[0].next_unit == 0
        # round-robin: the started requests served now go to the back of the line
        served = {live.request.request_id for live in picked}
        for rid in [r for r in started if r in served]:
            self.running.remove(rid)
            self.running.append(rid)
        return picked

    def _synthesize(self, picked: list[_Live]) -> list[np.ndarray | BaseException]:
        items = [(live.plan.units[live.next_unit], live.plan.options) for live in picked]
        t0 = time.perf_counter()
        try:
            audios = list(self.model.synthesize_batch(items))
            if len(audios) != len(items):
                raise RuntimeError(f"synthesize_batch returned {len(audios)} waveforms for {len(items)} units")
        except Exception as batch_error:          # find the culprit: each item alone
            if len(items) == 1:
                audios = [batch_error]
            else:
                log.warning("batched synthesis failed (%s); retrying %d units one by one", batch_error, len(items))
                audios = []
                for item in items:
                    try:
                        audios.append(self.model.synthesize_batch([item])[0])
                    except Exception as e:
                        audios.append(e)
        self.stats_counters["synthesis_seconds"] += time.perf_counter() - t0
        return [a if isinstance(a, BaseException) else np.asarray(a, dtype=np.float32).reshape(-1) for a in audios]

    # ---- outputs ----------------------------------------------------------------------------------------
    def _chunk(self, live: _Live, pcm: np.ndarray, first_unit: int, num_units: int) -> AudioChunk:
        now = time.monotonic()
        if live.first_chunk_at is None:
            live.first_chunk_at = now
        index = live.chunks_out
        live.chunks_out += 1
        live.samples_out += int(pcm.shape[0])
        return AudioChunk(live.request.request_id, index, pcm_bytes(pcm, live.request.pcm_format),
                          self.sample_rate, int(pcm.shape[0]), first_unit, num_units, emitted_at=now)

    def _retire(self, live: _Live, reason: FinishReason, error: str | None = None,
                error_kind: str | None = None) -> FinalRecord:
        rid = live.request.request_id
        del self.live[rid]
        for queue in (self.waiting, self.running):
            try:
                queue.remove(rid)
            except ValueError:
                pass
        key = {FinishReason.ABORTED: "aborted", FinishReason.ERROR: "errors"}.get(reason, "finished")
        self.stats_counters[key] += 1
        seconds = live.samples_out / self.sample_rate
        self.stats_counters["audio_seconds"] += seconds
        return FinalRecord(rid, reason, Usage(prompt_tokens=live.plan.prompt_tokens, frames=live.next_unit,
                                              audio_seconds=seconds),
                           error=error, error_kind=error_kind, arrived_at=live.arrived_at,
                           first_chunk_at=live.first_chunk_at)
