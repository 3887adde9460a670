"""EngineCore: one model replica's step loop (scheduler -> talker -> codec -> outputs).

    core = EngineCore.from_config(EngineConfig(model="path/or/hub-id"))
    core.add_request(SpeechRequest(text="Hello."))
    core.add_requests([...])             # a burst of arrivals: their prompts built in one batched pass
    while core.has_work():
        for out in core.step():          # AudioChunk ... then one FinalRecord per request
            ...

One `step()`: the scheduler picks this step's decodes and prefill chunks (continuous batching under a token
budget, paged KV with prefix caching, preemption when memory runs out); the talker runs the prefill chunks, then
launches one batched decode that completes one frame per running request (`DecodeRunner`: padded batch buckets,
one CUDA graph per shape on a GPU). The host reads that step's finished flags one step late (`inflight.py`): it
first launches step N, then collects step N - 1 (frames go to the codec on the device; finished requests give
back their KV blocks and slot at once), so the GPU never waits for Python bookkeeping. The codec executor
launches the chunks that are due (batched across requests; on the codec's own CUDA stream when it has one) and
collects those whose PCM has landed. A finished request's final record leaves after its last chunk.
It is single-threaded and knows nothing of HTTP or asyncio: `inprocess.py` / `process.py` drive it (through
`core_driving.py`). Around the step loop, in files of their own: how requests come in (`engine_intake.py`: checked,
their prompts built together, queued), what the steps hand out (`engine_outputs.py`: chunks, final records, resources
given back), what the host does while it waits for the decode in flight (`engine_waiting.py`), the per-request
bookkeeping (`live_request.py`), the loading, graph captures and warm-up requests
(`engine_startup.py`), the step trace (`step_trace.py`), and, when asked, the prefill on a CUDA stream of its own
beside the decode (`prefill_lane.py`).
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable

import numpy as np
import torch

from .block_manager import BlockManager, blocks_for
from .codec_executor import CodecExecutor
from .config import EngineConfig
from .engine_intake import RequestIntake
from .engine_outputs import Output, StepOutputs
from .engine_startup import check_fp8_pages, kv_pool_blocks, load_core, make_prefill_runner, warm_up
from .engine_stream import on_engine_stream, talker_stream
from .engine_waiting import WhileWaiting
from .gpu_memory import memory_stats
from .graph_runner import DecodeRunner
from .inflight import FlagBuffers, InflightDecode
from .kernel_compiles import KernelCompileWatch
from .live_request import TTFP_PARTS, LiveRequest
from .model_api import CodecModel, TTSModel, pool_spec
from .prefill_dispatch import PrefillDispatch
from .prefill_lane import make_prefill_lane
from .request import AudioChunk, FinalRecord, FinishReason
from .scheduler import Scheduler, SchedulerConfig
from .sequence import Sequence
from .step_trace import StallCounts, StepTrace

log = logging.getLogger("voxflow.engine")


class EngineCore(RequestIntake, StepOutputs, WhileWaiting):
    def __init__(self, model: TTSModel, codec: CodecModel, config: EngineConfig):
        self.model, self.codec, self.config = model, codec, config
        device = torch.device(model.device)
        # The talker's GPU work (this constructor's allocations and captures, prompt builds, steps) on one stream:
        # the current one, or a high-priority one (engine_stream.py).
        self._stream = talker_stream(device, config.talker_high_priority)
        # Triton compiles: startup's go in its record, a served step's in its trace line (kernel_compiles.py)
        self.kernel_compiles = KernelCompileWatch().start()
        self._build(device)
        self.kernel_compiles.serving()
        self._stall_counts = StallCounts(self.kernel_compiles, self.prefill, device)   # since the last line
        if self.kernel_compiles.available:
            self.startup["triton_compiles"] = self.kernel_compiles.at_startup
        log.info("engine ready: %s", self.startup)

    @on_engine_stream
    def _build(self, device: torch.device) -> None:
        model, codec, config = self.model, self.codec, self.config
        started = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        spec = pool_spec(model.kv_spec, config.kv_cache_dtype)
        check_fp8_pages(config.kv_cache_dtype, device)
        from ..kernels import kernels_enabled
        num_blocks = kv_pool_blocks(config, spec, device)
        # One page more than the block manager hands out: the scratch page padded decode rows write to.
        shape = (num_blocks + 1, config.block_size, spec.num_kv_heads, spec.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=spec.dtype, device=model.device) for _ in range(spec.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=spec.dtype, device=model.device) for _ in range(spec.num_layers)]
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens,
                                                   config.prefill_chunk_size, config.kv_reserve_frames),
                                   self.block_manager)
        self.codec_exec = CodecExecutor(codec, config.chunk_frames, ramp=config.chunk_ramp,
                                        max_frames_per_launch=config.codec_frames_per_step,
                                        tail_chunk=config.codec_tail_chunk, call_rows=config.codec_call_rows,
                                        ramp_factor=config.chunk_ramp_factor)
        max_width = min(num_blocks, blocks_for(config.max_model_len, config.block_size))
        self.runner = DecodeRunner(model, self.k_cache, self.v_cache, config.block_size, config.max_num_seqs,
                                   max_width, scratch_block=num_blocks, cuda_graphs=config.cuda_graphs,
                                   # the paged attention kernel reads only real pages: one table width fits all
                                   fixed_width=device.type == "cuda" and kernels_enabled())
        self.scratch_slot = num_blocks * config.block_size      # first position of the scratch page
        self.prefill_runner = make_prefill_runner(model, self.k_cache, self.v_cache, config, num_blocks,
                                                  max_width, device)
        self.prefill = PrefillDispatch(model, self.k_cache, self.v_cache, self.block_manager, config.block_size,
                                       self.scratch_slot, self.prefill_runner, config.batch_prefill)
        self._prefill_lane = make_prefill_lane(config, device)    # None: the prefill on the talker's stream
        self.flags = FlagBuffers(self.runner.buckets[-1], device)
        self._inflight: InflightDecode | None = None
        self._first_chunk_due = False       # the last step launched a first chunk: the next one waits for it
        self._finishing: dict[str, LiveRequest] = {}       # talker done, last chunks not collected yet
        # Set by the driver for one step (CoreDriver.step(emit=...)): where the outputs that are ready while the
        # host waits for the decode in flight go at once (EngineConfig.emit_while_waiting)
        self.emit_early: Callable[[list[Output]], None] | None = None
        self._early_chunks = self._early_finals = 0  # this step's outputs that went out early
        self._early_seconds = 0.0                    # the host's time in this step's emit_early calls
        # Set by the engine process's driver for one step (CoreDriver.step(arrivals=...)): takes the requests that
        # arrived meanwhile into the core (EngineConfig.intake_while_waiting)
        self.take_arrivals: Callable[[], None] | None = None
        self._intake_seconds = 0.0                   # the host's time in this step's take_arrivals call
        self._frame_listeners: list = []             # add_frame_listener
        self.live: dict[str, LiveRequest] = {}
        self.steps = 0
        self.stats_counters = {"finished": 0, "aborted": 0, "errors": 0, "preemptions": 0, "audio_seconds": 0.0}
        # Where first-audio latency goes, summed over the requests that got audio (see `_note_first_audio`).
        self._ttfp_parts = dict.fromkeys(TTFP_PARTS, 0.0)
        self._ttfp_count = 0
        # Host seconds per phase of step() (where the time goes; `wait_decode` is time blocked on the GPU).
        self.timings = dict.fromkeys(("schedule", "prefill", "launch_decode", "wait_decode", "collect_decode",
                                      "first_chunk_wait", "emit_early", "intake", "codec_launch",
                                      "codec_collect"), 0.0)
        self.startup: dict = {"kv_cache_blocks": num_blocks,
                              "kv_cache_bytes": 2 * sum(t.numel() * t.element_size() for t in self.k_cache),
                              "kv_cache_dtype": str(spec.dtype).removeprefix("torch.")}
        if getattr(model, "preloaded_text_rows", None):     # the prompt rows made at load: (ids,) bytes, seconds
            self.startup["preloaded_text_rows"] = model.preloaded_text_rows
        if getattr(codec, "precision", None):       # the codec's dtype and how it was chosen (codec_precision.py)
            self.startup["codec_precision"] = codec.precision
        if getattr(codec, "stream", None) is not None:      # a GPU codec stream: its SMs (None: the whole GPU)
            self.startup["codec_sms"] = getattr(codec, "stream_sms", None)
        self.trace: StepTrace | None = None
        self._warm_up()
        # After warm-up: the trace holds served steps only.
        self.trace = StepTrace(config.trace_steps, config.trace_profile_prepare) if config.trace_steps else None
        self.startup["startup_seconds"] = round(time.perf_counter() - started, 3)
        if device.type == "cuda":
            self.startup.update(memory_stats(device))

    def _warm_up(self) -> None:
        warm_up(self)

    def reset_stats(self) -> None:
        """Every counter back to zero (after the warm-up requests: the stats describe served requests only)."""
        self.steps = 0
        self.scheduler.prompt_tokens = self.scheduler.prompt_tokens_cached = 0
        self.stats_counters = dict.fromkeys(self.stats_counters, 0)
        self.stats_counters["audio_seconds"] = 0.0
        self._ttfp_parts = dict.fromkeys(TTFP_PARTS, 0.0)
        self._ttfp_count = 0
        self.timings = dict.fromkeys(self.timings, 0.0)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "EngineCore":
        """Load the model and codec `config` names and build an engine on them (engine_startup.load_core)."""
        return load_core(cls, config)

    # ---- requests ---------------------------------------------------------------------------------------
    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    @on_engine_stream
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

    @on_engine_stream
    def create_voice(self, ref_audio: bytes, ref_text: str | None, x_vector_only: bool) -> dict:
        """Compute a voice-clone prompt once (float32 mono PCM at the model rate in); plain data out, to store
        and send back as `SpeechRequest.voice_clone_prompt`. ValueError on bad input."""
        audio = np.frombuffer(ref_audio, dtype="<f4")
        if audio.size == 0:
            raise ValueError("reference audio is empty")
        return self.model.make_voice(audio, ref_text, x_vector_only)

    def has_work(self) -> bool:
        return bool(self.live) or self._inflight is not None or self.codec_exec.busy

    def stats(self) -> dict:
        r = self.runner.stats
        device = torch.device(self.model.device)
        memory = memory_stats(device) if device.type == "cuda" else {}
        return {**memory, "running": self.scheduler.num_running, "waiting": self.scheduler.num_waiting,
                "kv_usage": self.scheduler.kv_usage(), "steps": self.steps, **self.stats_counters,
                "prompt_tokens": self.scheduler.prompt_tokens,
                "prompt_tokens_cached": self.scheduler.prompt_tokens_cached,
                "codec_nonfinite_chunks": getattr(self.codec, "nonfinite_chunks", 0),
                "graphs": r.graphs, "graph_capture_seconds": round(r.capture_seconds, 3), "startup": self.startup,
                "kernels_compiled_while_serving": self.kernel_compiles.stats(),
                "step_seconds": {k: round(v, 3) for k, v in self.timings.items()},
                "ttfp_breakdown_ms": {k: round(v / self._ttfp_count * 1e3, 2) for k, v in self._ttfp_parts.items()}
                if self._ttfp_count else {}}

    def shutdown(self) -> None:
        for rid in list(self.live):
            self.abort(rid)
        self.codec_exec.collect(block=True)
        if self._inflight is not None:
            self._inflight.wait()
            self._inflight = None
        if self.trace is not None:
            self.trace.close()
            self.trace = None
        self.kernel_compiles.stop()

    # ---- one step ---------------------------------------------------------------------------------------
    @on_engine_stream
    def step(self) -> list[Output]:
        self.steps += 1
        outputs: list[Output] = []
        t = self.timings
        captured_before = self._capture_seconds() if self.trace is not None else 0.0
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        for rejection in sched.rejected:
            live = self.live.get(rejection.seq.request_id)
            if live is not None:
                live.finish_reason = FinishReason.ERROR
                outputs.append(self._retire(live, error=rejection.reason))
        self.stats_counters["preemptions"] += len(sched.preempted)
        t1 = time.perf_counter()
        t["schedule"] += t1 - t0

        launched, t2, t3 = self._queue_prefill_and_decode(sched, t1)
        previous, self._inflight = self._inflight, launched
        self._early_chunks = self._early_finals = 0
        self._early_seconds = self._intake_seconds = 0.0
        emit_error = None
        if previous is not None:
            emit_error = self._take_arrivals_while_waiting(previous.event)
            if emit_error is None and self.config.emit_while_waiting and self.emit_early is not None \
                    and previous.event is not None:
                emit_error = self._emit_while_waiting(previous.event)
            self._collect_decode(previous)
        if self._first_chunk_due:
            # The last step launched a first chunk: wait for it now, with this step's decode already queued behind
            # it on the GPU (waiting for it there, before this launch, left the talker idle for the whole codec
            # call: ~2.5 ms of every request's E2E at c=1 on the H200, session 31 call 1's step trace).
            self._first_chunk_due = False
            waited = time.perf_counter()
            self._emit_chunks(outputs, block=True)
            waited = time.perf_counter() - waited
        else:
            waited = 0.0
        t4 = time.perf_counter()
        aside = waited + self._early_seconds + self._intake_seconds     # not waiting for the decode
        t["collect_decode"] += t4 - t3 - aside
        t["first_chunk_wait"] += waited
        t["emit_early"] += self._early_seconds
        t["intake"] += self._intake_seconds
        # Chunks of the frames queued so far (up to the step just read): the codec stream waits only for that step.
        codec_launched = self.codec_exec.launch(after=previous.event if previous is not None else None)
        if launched is not None and self._queue_frames(launched):
            # ... then the chunks the queued step's frames complete, behind that step alone: a first chunk leaves
            # in the step that decodes its frames and a length-limited request's final one behind its last step,
            # with the codec's host-side launch (~1 ms on the H200) done while the talker runs, not after it.
            codec_launched += self.codec_exec.launch(after=launched.event, same_round=True, only=launched.owners)
        t5 = time.perf_counter()
        t["codec_launch"] += t5 - t4
        # Lightly loaded, with a stream waiting for its first audio: the next step waits for its chunk right after
        # queueing its own decode (under load the chunk is collected when it lands).
        first_audio = (launched is not None and len(launched.seqs) <= self.config.eager_first_chunk
                       and self._awaits_first_chunk(launched))
        self._first_chunk_due = first_audio and codec_launched > 0      # (nothing launched: nothing to wait for)
        # With no talker work queued, wait for the codec: with codec_call_rows for its oldest call only (the requests
        # it finishes retire in this step, and what arrives meanwhile is scheduled in the next while the codec
        # decodes the rest), else for every call. (A first chunk held back for want of a codec state is not waited
        # for: the calls ahead of it land and retire their requests while the talker goes on.)
        idle = launched is None and not sched.prefill
        if self.config.codec_call_rows is not None:
            self._emit_chunks(outputs, block_oldest=idle)
        else:
            self._emit_chunks(outputs, block=idle)
        self._retire_drained(outputs)
        t6 = time.perf_counter()
        t["codec_collect"] += t6 - t5
        if self.trace is not None:
            marks = (t0, t1, t2, t3, t4, t5, t6)
            self.trace.write({
                "step": self.steps, "t": round(self._mono_at(t0), 6),
                "ms": {k: round((b - a - (aside if k == "collect_decode" else 0.0)) * 1e3, 3)
                       for k, a, b in zip(("schedule", "prefill", "launch_decode", "collect_decode", "codec_launch",
                                           "codec_collect"), marks, marks[1:])}
                | {"first_chunk_wait": round(waited * 1e3, 3), "emit_early": round(self._early_seconds * 1e3, 3),
                   "intake": round(self._intake_seconds * 1e3, 3)},
                "decode": len(sched.decode), "prefill": len(sched.prefill),
                "prefill_tokens": sum(c.end - c.start for c in sched.prefill), "codec_launched": codec_launched,
                "chunks": sum(isinstance(o, AudioChunk) for o in outputs) + self._early_chunks,
                "finished": sum(isinstance(o, FinalRecord) for o in outputs) + self._early_finals,
                "early_chunks": self._early_chunks, "early_finished": self._early_finals,
                "codec_in_flight": self.codec_exec.calls_in_flight, "codec_starved": self.codec_exec.row_starved,
                "running": self.scheduler.num_running, "waiting": self.scheduler.num_waiting,
                "capture_ms": round((self._capture_seconds() - captured_before) * 1e3, 3),
                **self._stall_counts.since_last()})
        if emit_error is not None:
            raise emit_error            # (after a whole step: the engine's state is as after any other)
        return outputs

    def _queue_prefill_and_decode(self, sched, t1: float) -> tuple[InflightDecode | None, float, float]:
        """This step's prefill chunks and its decode queued on the GPU; (the decode in flight, the perf_counter
        marks after the prefill and after the decode's launch, as if the prefill went first). With
        `decode_before_prefill` the running streams' decode goes first, so the GPU runs it while the host builds
        the prefill (its chunks' inputs, attaches): the two touch disjoint slots and pages, so the order changes no
        output. With `prefill_stream` the prefill runs on its lane's stream beside the decode; the step first waits
        for the previous step's (prefill_lane.py)."""
        t = self.timings
        if self._prefill_lane is not None:
            self._prefill_lane.before_step()
        if not self.config.decode_before_prefill:
            if sched.prefill:
                self._run_prefills(sched.prefill)
            t2 = time.perf_counter()
            t["prefill"] += t2 - t1
            launched = self._launch_decode(sched.decode) if sched.decode else None
            t3 = time.perf_counter()
            t["launch_decode"] += t3 - t2
            return launched, t2, t3
        launched = self._launch_decode(sched.decode) if sched.decode else None
        t2 = time.perf_counter()
        if sched.prefill:
            try:
                self._run_prefills(sched.prefill)
            except BaseException:
                # (a failed step the engine survives, as in its warm-up) the decode just queued is the next step's
                # to read; the one before it is read now, as this step would have
                previous, self._inflight = self._inflight, launched
                if previous is not None:
                    self._collect_decode(previous)
                raise
        t3 = time.perf_counter()
        t["launch_decode"] += t2 - t1
        t["prefill"] += t3 - t2
        return launched, t1 + (t3 - t2), t3

    def _capture_seconds(self) -> float:
        """Seconds spent capturing CUDA graphs so far, by the talker's runners (decode, prefill) and the codec
        when it reports it: a capture while serving (a shape or sampling variant not captured at startup, or graphs
        dropped) stalls every stream."""
        runners = (self.runner, self.prefill_runner)
        codec = getattr(self.codec, "capture_seconds", 0.0)
        return sum(r.stats.capture_seconds for r in runners if r is not None) + codec

    @staticmethod
    def _mono_at(perf: float) -> float:
        """A perf_counter reading on the monotonic clock (the one requests' timestamps use)."""
        return time.monotonic() - (time.perf_counter() - perf)

    def _attach(self, lives: list[LiveRequest]) -> None:
        """Requests at their first prefill chunk: to their slots (together: one set of device writes for all) and
        codec streams."""
        new = [live for live in lives if not live.attached]
        if not new:
            return
        self.model.attach_many([(live.seq.slot, live.prepared) for live in new])
        for live in new:
            live.attached = True
            seq = live.seq
            self.codec_exec.add(seq.request_id, stream=live.request.streaming.stream,
                                initial_frames=live.request.streaming.initial_chunk_frames,
                                chunk_frames=live.request.streaming.chunk_frames,
                                num_active=self.scheduler.num_running,
                                prefix_frames=live.prepared.codec_prefix_frames, total_frames=seq.max_frames)

    def _prefill_embeds(self, live: LiveRequest, end: int) -> torch.Tensor:
        """The request's prefill input (it is attached: `_attach`)."""
        seq = live.seq
        if seq.num_preemptions > 0:
            embeds = live.extra.get("resume_embeds")
            if embeds is None or embeds.shape[0] < end:
                # every frame scheduled before the preemption has been fed back by the time the GPU gets here
                embeds = live.extra["resume_embeds"] = self.model.resume_embeds(seq.slot, seq.num_frames)
            return embeds
        return live.prepared.prompt_embeds

    def _run_prefills(self, chunks) -> None:
        """This step's prefill chunks, attached and given their inputs here, run by `PrefillDispatch`."""
        items = [(self.live[c.seq.request_id], c) for c in chunks]
        self._attach([live for live, _ in items])
        pairs = [(c, self._prefill_embeds(live, c.end)) for live, c in items]
        lane = self._prefill_lane
        with lane.running([embeds for _, embeds in pairs]) if lane is not None else contextlib.nullcontext():
            self.prefill.run(pairs)
        now = time.monotonic()
        for live, c in items:
            if c.is_last:
                live.extra.pop("resume_embeds", None)
                if live.prefilled_at is None:
                    live.prefilled_at = now

    def _launch_decode(self, seqs: list[Sequence]) -> InflightDecode:
        bm = self.block_manager
        out = self.runner.run([s.slot for s in seqs], [s.block_table for s in seqs], [s.num_computed for s in seqs],
                              [bm.slot_mapping(s, s.num_computed - 1, s.num_computed)[0] for s in seqs])
        return self.flags.launch([self.live[s.request_id] for s in seqs], out)

    def add_frame_listener(self, listener) -> None:
        """`listener(frames, request_ids)` for every step's frames as they go to the codec: `frames` [B, 16] on the
        engine's device (the step's own copy: keep views of it, it is not reused), `request_ids[i]` the request row i
        is a real frame of, in order, or None (a padding or extra row). The codes of a request are its rows (what
        `voxflow synthesize --save-codes` saves in batch mode); its audio is decoded from exactly these frames."""
        self._frame_listeners.append(listener)

    def _awaits_first_chunk(self, inflight: InflightDecode) -> bool:
        return any(live.chunks_out == 0 and live.request.streaming.stream and not live.talker_done
                   for live in inflight.seqs)

    def _queue_frames(self, inflight: InflightDecode) -> bool:
        """The queued step's frames to the codec stage at once (its codec work waits on the step's event): the rows
        of requests still running after the previous step's read. A request whose last frame by length this step
        makes is finished for the codec now, so its final chunk can go behind this step. Returns whether any row
        went. (A request that turns out to have finished at the previous step gets no row: that decode is the
        extra one of the one-step-late read; its EOS frame came in the previous step.)"""
        owners = [live.request.request_id if self.live.get(live.request.request_id) is live and not live.talker_done
                  else None for live in inflight.seqs]
        inflight.owners = owners
        if not any(owners):
            return False
        for listener in self._frame_listeners:
            listener(inflight.frames, owners)
        self.codec_exec.push_rows(inflight.frames, owners)
        for live, rid in zip(inflight.seqs, owners):
            if rid is not None and live.seq.num_frames >= live.seq.max_frames:
                live.last_frame_queued = True
                self.codec_exec.finish(rid)
        return True

    def _collect_decode(self, inflight: InflightDecode) -> None:
        """Step N - 1's results (its frames went to the codec when it was queued): finished requests give back their
        KV blocks and slot."""
        t0 = time.perf_counter()
        finished, eos = inflight.wait()
        self.timings["wait_decode"] += time.perf_counter() - t0
        if inflight.owners is None:
            # The step that launched it raised before queueing its frames (a failed step the engine survives, as
            # in its warm-up): queue them now, as they would have been then.
            self._queue_frames(inflight)
        for i, live in enumerate(inflight.seqs):
            rid = inflight.owners[i]
            # no row for this request (the extra decode after its finish), or aborted since
            if rid is None or self.live.get(rid) is not live:
                continue
            live.frames_out += 1
            if live.first_frame_at is None:
                live.first_frame_at = time.monotonic()
            if finished[i] or live.last_frame_queued:
                live.finish_reason = FinishReason.EOS if eos[i] else FinishReason.LENGTH
                self._release_talker(live)
                self.codec_exec.finish(rid)
                self._finishing[rid] = live
