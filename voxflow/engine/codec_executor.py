"""The codec stage: turns each request's frames into PCM chunks, batched across requests, asynchronously.

Streaming policy (per request):
  - the first chunk leaves after `initial_chunk_frames` frames: the request's own value, or one chosen from the
    current load (`initial_frames_for_load`): small when the engine is idle (lowest first-packet latency), larger
    when busy (fewer, bigger codec calls while many streams share the GPU);
  - then regular chunks of `chunk_frames` (the request's own value, honoured as given); when the request leaves it
    to the engine, the chunks after the first RAMP up to it: each is at most the audio already sent times
    `ramp_factor` (at 1: 5, 5, 10, 20, 25, ...), so the next chunk is ready before the listener has played what
    came before, as long as the engine runs faster than 1 / ramp_factor of real time (a 0.4 s first chunk followed
    at once by a 2 s one underruns at any RTF > 0.2); a larger factor means fewer, larger codec calls (at 2: 5, 10,
    25, ...);
  - at the end, whatever is left (a final partial chunk); with `tail_chunk`, a request's last frames before its
    length limit go in chunks of that size as they come (a burst of requests that end together, as a closed-loop
    benchmark's do, otherwise leaves 64 x ~20 frames of codec work after the talker's last step);
  - non-streaming requests are decoded once, when they finish (the fewest passes);
  - per launch, chunks go least-audio-sent first, and past `max_frames_per_launch` frames regular chunks wait for a
    later launch (bursts of aligned chunk boundaries are spread over a few steps);
  - with `call_rows`, a codec call holds at most that many requests: chunks due together land in several calls,
    one after another, so the first requests' audio (and their final records) need not wait for the whole burst.
A stream's first chunk needs a codec state, and a codec with `free_states` has only so many: a request whose talker
work is done keeps its state until its last chunk is collected, so a new request can get a talker slot before a
state is free. Its first chunk then waits for a later launch (its frames stay pending; `row_starved` says so for the
round): the calls ahead of it land, and their requests retire and free their states.
The codec keeps a per-request streaming state, so chunk boundaries never change the audio: the concatenated
chunks equal a one-pass decode of all frames.

Asynchrony: `launch()` starts every due chunk (requests that decode the same number of frames share one call, or
calls of at most `call_rows`) and returns at once; with a codec that has `decode_async` the work runs on the
codec's own CUDA stream while the talker goes on, and the PCM lands in pinned host memory. `collect()` hands back
the chunks whose PCM has landed, in launch order (or, blocking, waits for every call or only for the oldest). A
request is `drained` once it is finished and its last chunk was collected: only then may the engine send its final
record.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .frame_rows import FrameRows, Piece
from .model_api import CodecModel


def initial_frames_for_load(num_active: int) -> int:
    """First-chunk size when the request leaves it to the engine: 1 frame (80 ms of audio) when nearly idle,
    growing with the number of active streams so the codec runs fewer, larger batches under load. Up to 16 streams
    2 frames: each frame waits one talker step (~6 ms at 16 on an H200), and a burst of new requests shares one
    codec call whatever its chunk size, so 5 frames there only added ~20 ms to every first packet. Above, 5 frames:
    10 measured worse at 64 streams on the H200 (session 10: TTFP p50 / p99 230 / 336 ms with 10, 167 / 189 with 5,
    throughput 466 -> 478 audio-s/s)."""
    if num_active <= 2:
        return 1
    if num_active <= 16:
        return 2
    return 5


@dataclass(eq=False)
class CodecStream:
    request_id: str
    stream: bool
    initial_frames: int
    chunk_frames: int
    prefix_frames: torch.Tensor | None = None
    state: Any = None
    pending: list[Piece] = field(default_factory=list)          # frames not yet decoded: (source, start, rows)
    num_pending: int = 0
    frames_done: int = 0                                        # frames already sent to the codec
    chunks_done: int = 0                                        # chunks launched
    in_flight: int = 0                                          # chunks launched but not collected
    finished: bool = False                                      # the talker produced its last frame
    ramp: bool = False                                          # chunks grow from the first up to chunk_frames
    ramp_factor: float = 1.0                                    # ... each at most the audio sent times this
    sizes: tuple[int, ...] = ()                                 # the codec's one-pass chunk sizes (ramp rounding)
    total_frames: int | None = None                             # frames at the length limit (None: unknown)
    tail_chunk: int = 0                                         # chunk size for the last frames before it (0: off)

    def next_chunk_size(self) -> int:
        """Frames to decode now (0 = wait for more)."""
        if self.finished:
            return self.num_pending
        if not self.stream:
            return 0
        if self.chunks_done == 0:
            want = self.initial_frames
        elif self.ramp:
            want = min(self.chunk_frames, max(self.initial_frames, int(self.frames_done * self.ramp_factor)))
            if want < self.chunk_frames:
                # A growing chunk rounded down to a size the codec decodes in one pass: on the H200 a 16-frame chunk
                # cut into 10 + 5 + 1 slowed the talker beside it twice as much as a whole 25-frame one (1.7B c=1,
                # session 31 call 1's step trace), for the per-pass cost of the codec's graph replays.
                want = max((n for n in self.sizes if n <= want), default=want)
        else:
            want = self.chunk_frames
        if self.tail_chunk and self.total_frames is not None:
            left = self.total_frames - self.frames_done       # frames still to go to the codec, pending ones included
            if left <= want:
                # The rest would be one final chunk decoded after the talker's last step: go in tail_chunk pieces
                # while more than one is left, the last piece with the final frame (sent at finish).
                want = self.tail_chunk
                if left <= want:
                    return 0
        return want if self.num_pending >= want else 0

    @property
    def drained(self) -> bool:
        return self.finished and self.num_pending == 0 and self.in_flight == 0


@dataclass
class DecodedChunk:
    request_id: str
    pcm: np.ndarray          # float32
    first_frame: int
    num_frames: int
    index: int
    nonfinite: bool = False  # the decode gave NaN (zeroed in pcm): the request's codec state is poisoned


class _SyncPending:
    """`decode_async`'s result shape for codecs that only decode synchronously."""

    def __init__(self, pcm: list[np.ndarray]):
        self._pcm = pcm

    def ready(self) -> bool:
        return True

    def result(self) -> list[np.ndarray]:
        return self._pcm


class CodecExecutor:
    def __init__(self, codec: CodecModel, chunk_frames: int = 25, ramp: bool = True,
                 max_frames_per_launch: int | None = None, tail_chunk: int = 0, call_rows: int | None = None,
                 ramp_factor: float = 1.0):
        if not ramp_factor >= 1.0:
            raise ValueError(f"ramp_factor must be >= 1 (each growing chunk at most the audio sent times it), "
                             f"got {ramp_factor}")
        if max_frames_per_launch is not None and max_frames_per_launch < 1:
            raise ValueError(f"max_frames_per_launch must be >= 1 (or None: no limit), got {max_frames_per_launch}")
        if tail_chunk < 0:
            raise ValueError(f"tail_chunk must be >= 0 (0: off), got {tail_chunk}")
        if call_rows is not None and call_rows < 1:
            raise ValueError(f"call_rows must be >= 1 (or None: no limit), got {call_rows}")
        self.tail_chunk = tail_chunk
        self.call_rows = call_rows
        self.row_starved = False            # this launch round held back a first chunk: no free codec state (trace)
        self._budget, self._regular_sent = max_frames_per_launch, False        # this launch round's (launch())
        self.codec = codec
        self.chunk_frames = chunk_frames
        self.ramp = ramp
        self.ramp_factor = float(ramp_factor)
        self.sizes = tuple(sorted(n for n in (getattr(codec, "chunk_sizes", None) or ()) if n > 0))
        self.max_frames_per_launch = max_frames_per_launch
        self.streams: dict[str, CodecStream] = {}
        self._launched: deque[tuple[Any, list[tuple[CodecStream, int, int, int]]]] = deque()

    def add(self, request_id: str, *, stream: bool, initial_frames: int | None, chunk_frames: int | None,
            num_active: int, prefix_frames: torch.Tensor | None = None, total_frames: int | None = None) -> None:
        """A request's codec stream; total_frames: its frame count at its length limit, if known (tail_chunk)."""
        init = initial_frames if initial_frames is not None else initial_frames_for_load(num_active)
        self.streams[request_id] = CodecStream(request_id, stream, max(1, init),
                                               max(1, chunk_frames or self.chunk_frames), prefix_frames=prefix_frames,
                                               ramp=self.ramp and chunk_frames is None,
                                               ramp_factor=self.ramp_factor, sizes=self.sizes,
                                               total_frames=total_frames, tail_chunk=self.tail_chunk)

    def remove(self, request_id: str) -> None:
        """Drop a request's codec state at once (finished or aborted); chunks still in flight are discarded."""
        s = self.streams.pop(request_id, None)
        if s is not None and s.state is not None and hasattr(self.codec, "release"):
            self.codec.release(s.state)

    def push(self, request_id: str, frames: torch.Tensor) -> None:
        """Frames [n, Q] for one request."""
        s = self.streams[request_id]
        s.pending.append((frames, 0, frames.shape[0]))
        s.num_pending += frames.shape[0]

    def push_rows(self, frames: torch.Tensor, request_ids: list[str | None]) -> None:
        """One talker step's frames [B, Q]: row i is the next frame of request_ids[i] (None: a row for no one).
        Rows are named, not sliced (frame_rows.py): a step at c=64 would otherwise make 64 views."""
        for i, rid in enumerate(request_ids):
            if rid is not None:
                s = self.streams[rid]
                s.pending.append((frames, i, 1))
                s.num_pending += 1

    def finish(self, request_id: str) -> None:
        """The talker is done with this request: what is pending goes out as the final (partial) chunk."""
        self.streams[request_id].finished = True

    def drained(self, request_id: str) -> bool:
        s = self.streams.get(request_id)
        return s is None or s.drained

    @property
    def busy(self) -> bool:
        return bool(self._launched)

    # ---- launch / collect ------------------------------------------------------------------------------------
    def launch(self, after: Any = None, same_round: bool = False, only: list[str | None] | None = None) -> int:
        """Start decoding every chunk that is due; returns how many chunks were launched. `after`: an event the
        codec's stream waits for before it reads the frames (None: everything queued so far). same_round: this
        call shares the regular chunks' frame budget with the previous one (an engine step launches twice).
        only: the requests to look at (None entries skipped; None: all), e.g. those that got frames since the
        round's first launch: any other due chunk was held back by the budget, which this round has spent."""
        streams = self.streams.values() if only is None else [self.streams[r] for r in only if r is not None]
        ready = [(s, n) for s in streams if (n := s.next_chunk_size()) > 0]
        # Streams' first chunks ahead of everything (the codec stream runs calls in launch order), then the least
        # audio sent first.
        ready.sort(key=lambda sn: (not (sn[0].stream and sn[0].chunks_done == 0), sn[0].frames_done))
        if not same_round:
            self.row_starved = False
        room = getattr(self.codec, "free_states", None)
        stateless = [s for s, _ in ready if s.state is None]
        if room is not None and len(stateless) > room:
            # Finished streams first (their one chunk gives the state back at once; a streamed one's first chunk
            # would hold it for the whole request), then in the launch order.
            granted = {id(s) for s in sorted(stateless, key=lambda s: not s.finished)[:room]}
            ready = [(s, n) for s, n in ready if s.state is not None or id(s) in granted]
            self.row_starved = True
        if self.max_frames_per_launch is not None:
            # Past the budget, regular chunks wait for a later launch: their streams have seconds of audio queued,
            # while streams that started together reach their chunk boundaries together, and one call for all of
            # them (64 x 25 frames: ~90 ms on an H200) stalls the talker for several steps and every first chunk
            # queued behind it. First and final chunks never wait and are not charged to the budget; at least one
            # regular chunk goes per round, so none waits for ever.
            if not same_round:
                self._budget, self._regular_sent = self.max_frames_per_launch, False
            kept = []
            for s, n in ready:
                if s.chunks_done == 0 or s.finished:
                    kept.append((s, n))
                elif self._budget > 0 or not self._regular_sent:
                    kept.append((s, n))
                    self._budget -= n
                    self._regular_sent = True
            ready = kept
        due: dict[int, list[CodecStream]] = {}
        for s, n in ready:
            due.setdefault(n, []).append(s)
        fresh = [s for group in due.values() for s in group if s.state is None]
        # An async codec orders new states and decodes after `after` only (their frames and prefixes were made
        # before it), not after all the talker work queued so far.
        when = {"after": after} if after is not None and hasattr(self.codec, "decode_async") else {}
        if len(fresh) > 1 and hasattr(self.codec, "new_states"):      # a burst of first chunks: one reset pass
            for s, state in zip(fresh, self.codec.new_states([s.prefix_frames for s in fresh], **when)):
                s.state = state
        launched = 0
        # One call per chunk size (the codec batches requests that decode as many frames), cut into calls of at most
        # call_rows requests: each lands on its own, so a burst's first calls are collected before its last run.
        size = self.call_rows
        calls = ([(n, group[a: a + size]) for n, group in due.items() for a in range(0, len(group), size)] if size
                 else list(due.items()))
        for n, group in calls:
            frames, final = [], []
            for s in group:
                if s.state is None:
                    s.state = self.codec.new_state(s.prefix_frames, **when)
                frames.append(self._take(s, n))
                final.append(s.finished and s.num_pending == 0)
            pending = self._decode(group, frames, final, when)
            rows = []
            for s in group:
                rows.append((s, s.frames_done, n, s.chunks_done))
                s.frames_done += n
                s.chunks_done += 1
                s.in_flight += 1
            self._launched.append((pending, rows))
            launched += len(group)
        return launched

    def _decode(self, group: list[CodecStream], frames: list[list[Piece]], final: list[bool], when: dict):
        states = [s.state for s in group]
        rows = FrameRows(frames)
        if hasattr(self.codec, "decode_async"):
            return self.codec.decode_async(states, rows, final=final, **when)
        # A plain CodecModel takes one [n, 16] tensor per request.
        pcm, new_states = self.codec.decode(states, rows.tensors())
        for s, state in zip(group, new_states):
            s.state = state
        return _SyncPending(pcm)

    @property
    def calls_in_flight(self) -> int:
        """Codec calls launched and not yet collected (on a GPU: possibly still running on the codec's stream)."""
        return len(self._launched)

    def collect(self, block: bool = False, block_oldest: bool = False) -> list[DecodedChunk]:
        """Chunks whose PCM has landed, in launch order. block: wait for every launched call first; block_oldest:
        wait for the oldest call only (then the others that have landed too)."""
        out = []
        wait = len(self._launched) if block else int(block_oldest)      # calls to take even if not ready yet
        while self._launched and (wait > 0 or self._launched[0][0].ready()):
            wait -= 1
            pending, rows = self._launched.popleft()
            pcms = pending.result()
            flags = getattr(pending, "nonfinite", None) or [False] * len(pcms)
            for (s, first, n, index), pcm, bad in zip(rows, pcms, flags):
                s.in_flight -= 1
                if self.streams.get(s.request_id) is s:          # else removed (aborted) meanwhile
                    out.append(DecodedChunk(s.request_id, pcm, first, n, index, nonfinite=bad))
        return out

    @staticmethod
    def _take(s: CodecStream, n: int) -> list[Piece]:
        """The next n pending frames as the pieces they arrived in (no copy): the codec assembles them on its own
        stream, after the event of the step that made them, rather than on the talker's stream after it."""
        pieces, need, taken = [], n, 0
        for source, start, count in s.pending:
            if count <= need:
                pieces.append((source, start, count))
                need -= count
                taken += 1
            else:
                pieces.append((source, start, need))
                break
            if not need:
                break
        del s.pending[:taken]
        if need:                                # the head piece was split: its rest stays pending
            source, start, count = s.pending[0]
            s.pending[0] = (source, start + need, count - need)
        s.num_pending -= n
        return pieces
