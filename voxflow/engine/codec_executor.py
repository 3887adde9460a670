"""The codec stage: turns each request's frames into PCM chunks, batched across requests.

Streaming policy (per request):
  - the first chunk leaves after `initial_chunk_frames` frames: the request's own value, or one chosen from the
    current load (`initial_frames_for_load`): small when the engine is idle (lowest first-packet latency), larger
    when busy (fewer, bigger codec calls while many streams share the GPU);
  - then regular chunks of `chunk_frames`;
  - at the end, whatever is left (a final partial chunk);
  - non-streaming requests are decoded once, when they finish (the fewest passes).
The codec keeps a per-request streaming state, so chunk boundaries never change the audio: the concatenated
chunks equal a one-pass decode of all frames.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .model_api import CodecModel


def initial_frames_for_load(num_active: int) -> int:
    """First-chunk size when the request leaves it to the engine: 1 frame (80 ms of audio) when nearly idle,
    growing with the number of active streams so the codec runs fewer, larger batches under load."""
    if num_active <= 2:
        return 1
    if num_active <= 8:
        return 2
    if num_active <= 32:
        return 5
    return 10


@dataclass
class CodecStream:
    request_id: str
    stream: bool
    initial_frames: int
    chunk_frames: int
    prefix_frames: torch.Tensor | None = None
    state: Any = None
    pending: list[torch.Tensor] = field(default_factory=list)   # frames not yet decoded, each [n, 16]
    num_pending: int = 0
    frames_done: int = 0                                        # frames already turned into PCM
    chunks_done: int = 0

    def next_chunk_size(self, finished: bool) -> int:
        """Frames to decode now (0 = wait for more)."""
        if finished:
            return self.num_pending
        if not self.stream:
            return 0
        want = self.initial_frames if self.chunks_done == 0 else self.chunk_frames
        return want if self.num_pending >= want else 0


@dataclass
class DecodedChunk:
    request_id: str
    pcm: np.ndarray          # float32
    first_frame: int
    num_frames: int
    index: int


class CodecExecutor:
    def __init__(self, codec: CodecModel, chunk_frames: int = 25):
        self.codec = codec
        self.chunk_frames = chunk_frames
        self.streams: dict[str, CodecStream] = {}

    def add(self, request_id: str, *, stream: bool, initial_frames: int | None, chunk_frames: int | None,
            num_active: int, prefix_frames: torch.Tensor | None = None) -> None:
        init = initial_frames if initial_frames is not None else initial_frames_for_load(num_active)
        self.streams[request_id] = CodecStream(request_id, stream, max(1, init), max(1, chunk_frames or self.chunk_frames),
                                               prefix_frames=prefix_frames)

    def remove(self, request_id: str) -> None:
        """Drop a request's codec state at once (finished or aborted)."""
        self.streams.pop(request_id, None)

    def push(self, request_id: str, frames: torch.Tensor) -> None:
        s = self.streams[request_id]
        s.pending.append(frames)
        s.num_pending += frames.shape[0]

    def run(self, finished: set[str]) -> list[DecodedChunk]:
        """Decode every chunk that is due, batching requests that decode the same number of frames."""
        due: dict[int, list[CodecStream]] = {}
        for s in self.streams.values():
            n = s.next_chunk_size(s.request_id in finished)
            if n > 0:
                due.setdefault(n, []).append(s)
        out = []
        for n, group in due.items():
            frames = []
            for s in group:
                if s.state is None:
                    s.state = self.codec.new_state(s.prefix_frames)
                frames.append(self._take(s, n))
            pcms, states = self.codec.decode([s.state for s in group], frames)
            for s, pcm, state in zip(group, pcms, states):
                s.state = state
                out.append(DecodedChunk(s.request_id, pcm, s.frames_done, n, s.chunks_done))
                s.frames_done += n
                s.chunks_done += 1
        return out

    @staticmethod
    def _take(s: CodecStream, n: int) -> torch.Tensor:
        allf = torch.cat(s.pending) if len(s.pending) > 1 else s.pending[0]
        head, rest = allf[:n], allf[n:]
        s.pending = [rest] if rest.shape[0] else []
        s.num_pending -= n
        return head
