"""Offline batch synthesis: many requests through the batched engine in-process, no HTTP, with progress."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from ..audio.io import pcm_from_bytes
from .core_driving import add_to_core, early_outputs
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
    from .request import FinishReason
    results: dict[str, OfflineResult] = {}
    order = []
    requests = list(requests)
    for req in requests:
        results[req.request_id] = OfflineResult(req)
        order.append(req.request_id)
    # All at once: their prompts built in one batched pass (add_to_core); a refused one ends with its error.
    for req, error in zip(requests, add_to_core(core, requests)):
        if error is not None:
            res = results[req.request_id]
            res.final = FinalRecord(req.request_id, FinishReason.ERROR, error=str(error))
            if on_finish:
                on_finish(res)

    def take(outputs) -> None:
        for out in outputs:
            res = results[out.request_id]
            if isinstance(out, AudioChunk):
                res.chunks.append(out)
            else:
                res.final = out
                if on_finish:
                    on_finish(res)
    with early_outputs(core, take):
        while core.has_work():
            take(core.step())
    return [results[rid] for rid in order]
