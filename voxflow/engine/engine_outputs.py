"""What an EngineCore's steps hand out: the codec chunks that landed as AudioChunks, and each request's FinalRecord
once its last chunk is out (or at once, on an abort or an error), with its resources given back. A mixin of
EngineCore (engine.py), which owns the state it uses: `model`, `scheduler`, `codec_exec`, `live`, `_finishing`,
`stats_counters`, `_ttfp_parts` / `_ttfp_count`."""
from __future__ import annotations

import time

import numpy as np

from ..audio.io import pcm_bytes
from .live_request import LiveRequest, ttfp_parts_of
from .request import AudioChunk, FinalRecord, FinishReason, Usage
from .sequence import SeqStatus

Output = AudioChunk | FinalRecord
CODEC_NAN_ERROR = ("the codec decoder produced NaN audio (a half-precision overflow?); the server can run it in "
                   "fp32: --codec-dtype float32")


class StepOutputs:
    def _emit_chunks(self, outputs: list[Output], block: bool = False, block_oldest: bool = False) -> None:
        """The codec chunks that have landed into `outputs` as AudioChunks (block: wait for every launched call;
        block_oldest: for the oldest)."""
        for dc in self.codec_exec.collect(block=block, block_oldest=block_oldest):
            live = self.live.get(dc.request_id)
            if live is not None and dc.nonfinite:
                # NaN audio (an overflowing half-precision codec): the stream's codec state holds NaN now, so
                # every later chunk would too; end the request with an error rather than stream silence
                live.finish_reason = FinishReason.ERROR
                outputs.append(self._retire(live, error=CODEC_NAN_ERROR))
            elif live is not None:
                outputs.append(self._chunk(live, dc.pcm, dc.first_frame, dc.num_frames, dc.index))

    def _retire_drained(self, outputs: list[Output]) -> None:
        """The final records of the finishing requests whose last chunks have all been collected, into `outputs`."""
        for rid in [rid for rid in self._finishing if self.codec_exec.drained(rid)]:
            outputs.append(self._retire(self._finishing[rid]))

    def _chunk(self, live: LiveRequest, pcm: np.ndarray, first_frame: int, num_frames: int,
               index: int) -> AudioChunk:
        now = time.monotonic()
        parts = None
        if live.first_chunk_at is None:
            live.first_chunk_at = now
            if live.first_frame_at is None:     # a synchronous (CPU) codec: the chunk came before the step's read
                live.first_frame_at = now
            parts = self._note_first_audio(live)
        live.samples_out += pcm.shape[0]
        live.chunks_out += 1
        return AudioChunk(live.request.request_id, index, pcm_bytes(pcm, live.request.pcm_format),
                          self.model.sample_rate, int(pcm.shape[0]), first_frame, num_frames, emitted_at=now,
                          ttfp_parts=parts)

    def _release_talker(self, live: LiveRequest) -> None:
        """Give back the request's model slot and KV blocks (its codec stream may still be finishing)."""
        seq = live.seq
        if live.attached and seq.slot is not None:
            self.model.detach(seq.slot)
        if seq.status is not SeqStatus.FINISHED:
            self.scheduler.finish(seq)
        live.talker_done = True

    def _note_first_audio(self, live: LiveRequest) -> dict | None:
        """Adds the request's first-audio split to the engine's totals; returns it (None: incomplete marks)."""
        parts = ttfp_parts_of(live)
        if parts is None:
            return None
        for name, value in parts.items():
            self._ttfp_parts[name] += value
        self._ttfp_count += 1
        return parts

    def _retire(self, live: LiveRequest, error: str | None = None) -> FinalRecord:
        rid = live.request.request_id
        if not live.talker_done:
            self._release_talker(live)
        self.codec_exec.remove(rid)
        self._finishing.pop(rid, None)
        del self.live[rid]
        reason = live.finish_reason or FinishReason.ERROR
        key = {FinishReason.ABORTED: "aborted", FinishReason.ERROR: "errors"}.get(reason, "finished")
        self.stats_counters[key] += 1
        seconds = live.samples_out / self.model.sample_rate
        self.stats_counters["audio_seconds"] += seconds
        return FinalRecord(rid, reason, Usage(prompt_tokens=live.prepared.prompt_len, frames=live.frames_out,
                                              audio_seconds=seconds),
                           error=error, arrived_at=live.arrived_at, first_chunk_at=live.first_chunk_at,
                           ttfp_parts=ttfp_parts_of(live))
