"""Offline batch synthesis: many requests through the batched engine in-process, no HTTP, with progress."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from ..audio.io import pcm_from_bytes
from .engine import EngineCore
from .request import AudioChunk, FinalRecord, SpeechRequest


@dataclass
class OfflineResult:
    request: SpeechRequest
    chunks: list[AudioChunk] = field(default_factory=list)
    final: FinalRecord | None = None

    def audio(self) -> np.ndarray:
        """The whole utterance as float32 PCM (chunks concatenated)."""
        data = b"".join(c.pcm for c in sorted(self.chunks, key=lambda c: c.index))
        return pcm_from_bytes(data, self.request.pcm_format)


def run_offline(core: EngineCore, requests: Iterable[SpeechRequest],
                on_finish: Callable[[OfflineResult], None] | None = None) -> list[OfflineResult]:
    """Submit every request (bad ones end at once with an error record) and step until all are done.
    Results come back in submission order; `on_finish` is called as each request ends (progress, writing)."""
    results: dict[str, OfflineResult] = {}
    order = []
    for req in requests:
        res = results[req.request_id] = OfflineResult(req)
        order.append(req.request_id)
        try:
            core.add_request(req)
        except (ValueError, RuntimeError) as e:
            from .request import FinishReason
            res.final = FinalRecord(req.request_id, FinishReason.ERROR, error=str(e))
            if on_finish:
                on_finish(res)
    while core.has_work():
        for out in core.step():
            res = results[out.request_id]
            if isinstance(out, AudioChunk):
                res.chunks.append(out)
            else:
                res.final = out
                if on_finish:
                    on_finish(res)
    return [results[rid] for rid in order]
