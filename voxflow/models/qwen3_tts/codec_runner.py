"""The Qwen3-TTS codec behind `voxflow.engine.model_api.CodecModel`: pooled streaming decode, batched, graphed, async.

Each request's streaming state (codec_streaming.py: attention window, conv tails) is one row of a pool allocated
once (codec_pool.py); the request holds a `CodecRow` handle. Successive calls concatenate to exactly one pass
over all its frames. One call decodes many requests:

1. requests are grouped by how their frames are cut into PIECES of a bucketed size (`frame_pieces`): n frames
   become as many `max(frame_buckets)` pieces as fit, then the rest exactly as a sum of buckets (3 = 2 + 1),
   except in a request's FINAL chunk, where the rest is one bucket padded with zero codes (20 -> 25) whose extra
   audio is cut off: the decoder is causal, so padding after the last frame cannot change the earlier audio,
   and the state it leaves is never used again. Streaming is exact, so cutting a chunk into pieces does not
   change the audio (beyond float rounding);
2. each group is padded to a batch bucket (1, 2, 4, ... 128) with the pool's scratch row (larger groups are split
   into batches of the largest bucket);
3. each piece is one `CodecStatePool.step` (gather rows -> stream_decode -> scatter rows back), replayed from a
   CUDA graph per (batch bucket, piece size) on CUDA (codec_graphs.py), run eagerly on CPU — the same padding
   and pool logic either way. So only a small, fixed set of shapes is ever captured.

On CUDA all of it runs on the runner's own stream, which first waits for the caller's current stream (where the
frames were made) or only for a given event (`after`), and the PCM comes back through pinned host memory with a
non-blocking copy and an event: `decode_async` returns a `PendingPCM` at once; `decode` is the synchronous form.
Calls must come from one thread at a time (the graphs' static inputs are shared).

Voice clone (ICL): `new_state(reference frames)` decodes the reference silently, so the generated audio starts
right after it, with the reference as context — what the official decode-then-cut does, minus its
proportional cut rounding (generate.decode_to_wav may keep one extra leading sample). Note the official
decode also restarts its context every 300 frames (300/25 windows); a stream never does, so beyond 300 frames
the two legitimately differ (the stream equals the single-pass decode).
"""
from __future__ import annotations

import contextlib
import logging
import time
import types
from collections import defaultdict
from typing import Sequence

import numpy as np
import torch

from ...engine import sm_partition
from ...engine.frame_rows import FrameRows, stack_sources
from ...engine.host_to_device import to_device
from .codec_decoder import CodecDecoder
from .codec_graphs import CodecGraphs
from .codec_pool import CodecRow, CodecStatePool

log = logging.getLogger("voxflow.codec")

Frames = torch.Tensor | Sequence[torch.Tensor]     # one request's frames: [n, Q], or pieces of it in order

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# The engine's first chunks (1/2/5 frames), its ramp chunks (5, 10; 20 = 10 + 10) and regular chunks (25) take one
# or two pieces; other sizes split.
FRAME_BUCKETS = (1, 2, 5, 10, 25)


def frame_pieces(n: int, final: bool, buckets: Sequence[int] | None) -> tuple[int, ...]:
    """The piece sizes (each a bucket) that decode n frames; only a final chunk's last piece may exceed its frames.

    buckets None: one piece of exactly n frames (no splitting, no padding)."""
    if n <= 0:
        return ()
    if buckets is None:
        return (n,)
    top = buckets[-1]
    pieces = [top] * (n // top)
    rest = n % top
    if rest and final:
        pieces.append(next(b for b in buckets if b >= rest))       # padded: the extra audio is cut off
    while rest and not final:
        piece = max(b for b in buckets if b <= rest)               # exact: greedy sum of buckets
        pieces.append(piece)
        rest -= piece
    return tuple(pieces)


def zero_nonfinite(pcm: np.ndarray) -> bool:
    """Zeroes a chunk's NaN samples in place; True if there were any. The decoder clamps its output to [-1, 1], so
    NaN is the only non-finite value left: a half-precision decode that overflowed (codec_precision.py checks a
    checkpoint at load, not every input). NaN cast to 16-bit PCM would be full-scale noise; and the stream's state
    then holds NaN too, so the engine ends such a request with an error (PendingPCM.nonfinite says which)."""
    if np.isfinite(pcm).all():
        return False
    np.nan_to_num(pcm, copy=False, nan=0.0, posinf=1.0, neginf=-1.0)
    return True


class PendingPCM:
    """The PCM of one `decode_async` call: `ready()` never blocks; `result()` waits only if the copy is not done."""

    def __init__(self, num_requests: int, event: torch.cuda.Event | None, keep_alive: list,
                 on_nonfinite=None):
        self._parts: list[tuple[torch.Tensor, int, int] | None] = [None] * num_requests   # (host, row, samples)
        self._event = event
        self._keep_alive = keep_alive      # the call's state handles: their rows stay taken until the result
        self._pcm: list[np.ndarray] | None = None
        self._on_nonfinite = on_nonfinite  # called with the number of chunks zero_nonfinite repaired
        self.nonfinite: list[bool] = []    # after result(): per request, whether its chunk had NaN (now zeroed)

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def result(self) -> list[np.ndarray]:
        """float32 PCM per request, in the order of the call (empty for requests that fed no frame)."""
        if self._pcm is None:
            if self._event is not None:
                self._event.synchronize()
            # Copies: the arrays outlive this object, and the pinned buffers should go back to their cache.
            self._pcm = [np.zeros(0, dtype=np.float32) if p is None else p[0][p[1], : p[2]].numpy().copy()
                         for p in self._parts]
            self._parts, self._keep_alive = [], []
            self.nonfinite = [zero_nonfinite(pcm) for pcm in self._pcm]
            if any(self.nonfinite) and self._on_nonfinite is not None:
                self._on_nonfinite(sum(self.nonfinite))
        return self._pcm


class Qwen3CodecRunner:
    """Streaming codec decode for up to `max_rows` live requests (the engine's max_num_seqs).

    cuda_graphs: replay captured CUDA graphs (CUDA only; ignored on CPU). batch_buckets / frame_buckets: the
    padded shapes (see the module docstring); None turns that padding / splitting off. stream_sms: on a GPU, the
    codec stream's kernels confined to this many SMs, or "auto" (engine/sm_partition.py); None: the whole GPU.
    """

    def __init__(self, model, *, max_rows: int = 32, cuda_graphs: bool = True,
                 batch_buckets: Sequence[int] | None = BATCH_BUCKETS,
                 frame_buckets: Sequence[int] | None = FRAME_BUCKETS, stream_sms: int | str | None = None):
        self.decoder: CodecDecoder = model.codec_decoder
        self.sample_rate = model.sample_rate
        self.samples_per_frame = model.samples_per_frame
        self.device = next(self.decoder.parameters()).device
        self.dtype = next(self.decoder.parameters()).dtype
        self.nonfinite_chunks = 0          # chunks that held NaN samples (zero_nonfinite): the engine's stats
        self.pool = CodecStatePool(self.decoder, max_rows)
        if frame_buckets is not None:
            frame_buckets = tuple(sorted(set(frame_buckets)))
            if frame_buckets[0] != 1:
                raise ValueError("frame_buckets must contain 1 (any frame count must be a sum of buckets)")
        self.frame_buckets = frame_buckets
        if batch_buckets is not None:
            # Buckets past the first one that holds every row can never be used.
            sizes = sorted(set(batch_buckets))
            batch_buckets = tuple(b for b in sizes if b < max_rows) + tuple(b for b in sizes if b >= max_rows)[:1]
        self.batch_buckets = batch_buckets
        self.cuda = self.device.type == "cuda"
        # _partition: the green context owning a partitioned stream; stream_sms: its SMs (None: the whole GPU)
        self.stream, self._partition, self.stream_sms = None, None, None
        if self.cuda:
            self.stream, self._partition, self.stream_sms = sm_partition.stream_for(self.device, stream_sms)
        else:
            sm_partition.check_setting(stream_sms)      # no stream on a CPU, but a bad setting is still an error
        self.graphs = CodecGraphs(self.pool, self.stream) if self.cuda and cuda_graphs else None

    @classmethod
    def from_decoder(cls, decoder: CodecDecoder, sample_rate: int = 24000, **kwargs) -> "Qwen3CodecRunner":
        """A runner over a bare decoder (tests and tools that load only the codec)."""
        model = types.SimpleNamespace(codec_decoder=decoder, sample_rate=sample_rate,
                                      samples_per_frame=decoder.total_upsample)
        return cls(model, **kwargs)

    # ---- the CodecModel contract -------------------------------------------------------------------------
    def new_state(self, prefix_frames: torch.Tensor | None, after: torch.cuda.Event | None = None) -> CodecRow:
        """A free pool row reset to a fresh stream; `prefix_frames` [R, 16] are decoded into it silently.
        Raises CodecPoolFullError when every row is held. `after`: as in decode_async (the prefix must have been
        complete when it was recorded)."""
        return self.new_states([prefix_frames], after)[0]

    @torch.no_grad()
    def new_states(self, prefixes: list[torch.Tensor | None], after: torch.cuda.Event | None = None
                   ) -> list[CodecRow]:
        """`new_state` for several streams at once (all rows or none): the rows are reset in one pass. Without
        `after` the codec stream waits for everything queued on the caller's stream, in the engine's step the
        decode it has just launched: the first chunks launched behind this reset waited a whole step for it."""
        with self._on_stream(after):
            handles = self.pool.allocate_many(len(prefixes))
            primed = [(h, p) for h, p in zip(handles, prefixes) if p is not None and p.shape[0] > 0]
            if primed:
                # One batched call: sixteen clones of one voice arriving together prime their rows in the
                # reference's few pieces at batch 16, not sixteen batch-1 decodes one after another (session 7's
                # voice-clone c=16 run: first frame 129 ms after prefill, first chunk 272 ms after that).
                self._enqueue([h for h, _ in primed], FrameRows.of_tensors([[p] for _, p in primed]),
                              [False] * len(primed), want_audio=False)
        return handles

    def release(self, state: CodecRow) -> None:
        """Give the request's row back (idempotent). Work already queued for it still completes correctly."""
        state.release()

    def _note_nonfinite(self, chunks: int) -> None:
        if self.nonfinite_chunks == 0:
            log.warning("the codec decoded NaN samples (%s decoder; the requests affected end with an error): "
                        "if it recurs, serve with --codec-dtype float32", str(self.dtype).removeprefix("torch."))
        self.nonfinite_chunks += chunks

    def decode(self, states: list[CodecRow], frames: list[Frames], final: list[bool] | None = None
               ) -> tuple[list[np.ndarray], list[CodecRow]]:
        """Decode frames[i] ([n_i, 16], or a list of such pieces in order) into states[i]; float32 PCM per request,
        and the states (updated in place: the same handles). final[i]: this is the request's last chunk, so it
        may be padded (its state must not be decoded into again)."""
        return self.decode_async(states, frames, final).result(), list(states)

    @torch.no_grad()
    def decode_async(self, states: list[CodecRow], frames: list[Frames] | FrameRows, final: list[bool] | None = None,
                     after: torch.cuda.Event | None = None) -> PendingPCM:
        """`decode`, queued on the codec stream; returns at once (on CPU it has already run). frames: per request
        its frames, or all of them as a FrameRows (the engine's codec stage: rows of its steps' frames).

        The codec stream first waits for everything queued so far on the caller's current stream, or, when
        `after` (a CUDA event) is given, only for that event: then every CUDA tensor in `frames` must have been
        complete when `after` was recorded (pass a request's frames as the list of pieces they were made in
        rather than concatenating them on the caller's stream after the event)."""
        if len(states) != len(frames):
            raise ValueError(f"{len(states)} states for {len(frames)} frame blocks")
        final = [False] * len(states) if final is None else list(final)
        if len(final) != len(states):
            raise ValueError(f"{len(final)} final flags for {len(states)} requests")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("a codec state appears twice in one decode call")
        for s in states:
            if not isinstance(s, CodecRow) or s.released or s.pool is not self.pool:
                raise ValueError(f"not a live codec state of this runner: {s!r}")
        if not isinstance(frames, FrameRows):
            frames = FrameRows.of_tensors([list(f) if isinstance(f, (list, tuple)) else [f] for f in frames])
        with self._on_stream(after):
            return self._enqueue(states, frames, final, want_audio=True)

    @property
    def free_states(self) -> int:
        """How many new states (pool rows) new_state / new_states can hand out now."""
        return self.pool.num_free

    @property
    def chunk_sizes(self) -> tuple[int, ...]:
        """Frame counts decoded in one pass (one graph replay): the engine's growing chunks round down to them
        (every count with buckets off)."""
        return self.frame_buckets or ()

    @property
    def capture_seconds(self) -> float:
        """Host seconds spent capturing the codec's CUDA graphs so far (0 without graphs)."""
        return self.graphs.capture_seconds if self.graphs is not None else 0.0

    def warmup(self, batch_sizes: Sequence[int], frame_counts: Sequence[int]) -> float:
        """Prepare every (batch bucket, piece) shape that these batch sizes and chunk sizes use — capture its
        CUDA graph, or run it once eagerly — and return the seconds it took. Only the scratch row is written."""
        t0 = time.perf_counter()
        with torch.no_grad(), self._on_stream(None):
            for b, m in self.warmup_shapes(batch_sizes, frame_counts):
                if self.graphs is not None:
                    self.graphs.capture(b, m)
                else:
                    rows = torch.full((b,), self.pool.scratch_row, dtype=torch.long, device=self.device)
                    codes = torch.zeros((b, self.decoder.config.num_quantizers, m), dtype=torch.long,
                                        device=self.device)
                    self.pool.step(rows, codes)
        if self.cuda:
            self.stream.synchronize()
        return time.perf_counter() - t0

    def warmup_shapes(self, batch_sizes: Sequence[int], frame_counts: Sequence[int]) -> list[tuple[int, int]]:
        """The (batch bucket, piece) shapes `warmup` prepares, largest first (most frames decoded, then the larger
        batch: more streams' context rows). Why that order: the graphs share one memory pool, and a capture can
        reuse the blocks an earlier one's intermediates freed only where they are large enough. Captured smallest
        first (before session 37), each larger graph needed new segments while the small ones' blocks stayed
        reserved around the static outputs kept in them (session 28 call 5: the 0.6B codec pool held 1,342 MiB
        in 38 segments for 135 MiB allocated, and sub-pixel convolutions' other sizes took 746 MiB more)."""
        batches = {self._batch_bucket(b) for b in batch_sizes if b > 0}
        pieces = {p for n in frame_counts for p in frame_pieces(n, False, self.frame_buckets)}
        return sorted(((b, m) for b in batches for m in pieces), key=lambda s: (s[0] * s[1], s[0]), reverse=True)

    # ---- internals ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _on_stream(self, after: torch.cuda.Event | None):
        """Run the block on the codec stream, after `after` or else everything queued on the caller's stream."""
        if self.stream is None:
            yield
            return
        if after is not None:
            self.stream.wait_event(after)
        else:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield

    def _batch_bucket(self, b: int) -> int:
        if self.batch_buckets is None:
            return b
        return next((x for x in self.batch_buckets if x >= b), self.batch_buckets[-1])

    def _max_batch(self) -> int | None:
        return None if self.batch_buckets is None else self.batch_buckets[-1]

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor to the decoder's device without blocking (a blocking copy would wait for the whole codec
        stream)."""
        return to_device(t, self.device)

    def _enqueue(self, states: list[CodecRow], frames: FrameRows, final: list[bool], want_audio: bool) -> PendingPCM:
        """Decode on the current stream (the codec stream on CUDA); the PCM copies are queued behind it."""
        counts = frames.counts()
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, n in enumerate(counts):
            pieces = frame_pieces(n, final[i], self.frame_buckets)
            if pieces:
                groups[pieces].append(i)
        pending = PendingPCM(len(states), None, list(states), self._note_nonfinite)
        stacked = self._stack(frames.sources) if groups else None
        cap = self._max_batch()
        for pieces, idx in groups.items():
            for a in range(0, len(idx), cap or len(idx)):
                batch = idx[a: a + cap] if cap else idx
                wav = self._decode_batch([states[i] for i in batch], frames, stacked, batch, pieces)
                if not want_audio:
                    continue
                if self.cuda:
                    host = torch.empty(wav.shape, dtype=torch.float32, pin_memory=True)
                    host.copy_(wav, non_blocking=True)
                else:
                    host = wav
                for row, i in enumerate(batch):
                    pending._parts[i] = (host, row, counts[i] * self.samples_per_frame)
        if self.cuda:
            pending._event = torch.cuda.Event()
            pending._event.record(self.stream)
        return pending

    def _decode_batch(self, states: list[CodecRow], frames: FrameRows, stacked: torch.Tensor, batch: list[int],
                      pieces: tuple[int, ...]) -> torch.Tensor:
        """B requests (frames' rows `batch`), cut into the same pieces -> float32 waveform [B, sum(pieces) *
        upsample] on the device."""
        b, total, spf = len(states), sum(pieces), self.samples_per_frame
        padded = self._batch_bucket(b)
        rows = [s.row for s in states] + [self.pool.scratch_row] * (padded - b)
        rows = self._to_device(torch.tensor(rows, dtype=torch.long))
        # [padded, Q, total]: zero codes fill the padding (valid codes: what padded rows and padded final frames
        # decode is discarded, it only has to be finite).
        codes = frames.gather(stacked, batch, padded, total, self._to_device).transpose(1, 2)
        out = torch.empty((b, total * spf), dtype=torch.float32, device=self.device)
        at = 0
        for m in pieces:
            piece = codes[:, :, at: at + m]
            wav = self.graphs.run(rows, piece) if self.graphs is not None else self.pool.step(rows, piece)
            out[:, at * spf: (at + m) * spf].copy_(wav[:b])
            at += m
        return out

    def _stack(self, sources: list[torch.Tensor]) -> torch.Tensor:
        """A call's frame sources end to end on the device, a zero row last (frame_rows.stack_sources)."""
        for s in sources:
            if s.device.type == "cuda":
                # Made on the caller's stream, read here on the codec stream: keep the allocator from handing its
                # memory to someone else before this read has run.
                s.record_stream(self.stream)
        return stack_sources(sources, self.decoder.config.num_quantizers, self.device, self._to_device)
