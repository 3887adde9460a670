"""Frames of several requests, named as rows of a few source tensors: what the codec stage hands an async codec.

The talker makes one [B, Q] tensor of frames a step, one row per request. A 25-frame chunk of a request is thus 25
rows of 25 different step tensors, and a codec call for 16 requests reads 400 such rows. Handed over as 400 one-row
views, the codec's host side looped, checked and concatenated per view. Named as (source, row) they cost the host
list arithmetic only, and the device one gather: the distinct sources concatenated once, then one indexed copy
(`gather`). On an H200 host (session 20 call 2, 0.6B c=64) a step that launched codec chunks (~14) spent 1.05 ms of
engine-thread time launching them instead of 1.62; the throughput did not change (those steps wait on the GPU).

A piece is (source tensor [r, Q], start row, row count), a slice of the source that is never materialised.
"""
from __future__ import annotations

from typing import Sequence

import torch

Piece = tuple[torch.Tensor, int, int]


class FrameRows:
    """Per request its frames as pieces, in order. sources: the distinct source tensors [r_k, Q], in first use order
    (each listed once however many pieces use it); a piece's rows are numbered into the sources stacked end to end
    (`stack_sources`), which is what `gather` reads."""

    def __init__(self, pieces: Sequence[Sequence[Piece]]):
        self.pieces = [list(p) for p in pieces]
        self.sources: list[torch.Tensor] = []
        self._offset: dict[int, int] = {}                   # id(source) -> its first row in the stack
        stacked = 0
        for request in self.pieces:
            for source, _, _ in request:
                if id(source) not in self._offset:
                    self._offset[id(source)] = stacked
                    self.sources.append(source)
                    stacked += source.shape[0]

    @classmethod
    def of_tensors(cls, requests: Sequence[Sequence[torch.Tensor]]) -> "FrameRows":
        """Per request its frames as whole tensors in order (each [n, Q])."""
        return cls([[(t, 0, t.shape[0]) for t in pieces] for pieces in requests])

    def __len__(self) -> int:
        return len(self.pieces)

    def counts(self) -> list[int]:
        return [sum(count for _, _, count in request) for request in self.pieces]

    def tensors(self) -> list[torch.Tensor]:
        """Per request its frames as one [n, Q] tensor (for codecs that take plain tensors): a view of its one piece,
        else its pieces' slices concatenated, on their device (nothing waits for the GPU)."""
        width = self.sources[0].shape[1] if self.sources else 0
        out = []
        for pieces in self.pieces:
            views = [source[start:start + count] for source, start, count in pieces]
            if not views:
                out.append(torch.zeros((0, width), dtype=torch.long))
            else:
                out.append(views[0] if len(views) == 1 else torch.cat(views))
        return out

    def gather(self, stacked: torch.Tensor, requests: Sequence[int], padded: int, length: int,
               index_to_device) -> torch.Tensor:
        """Frames of `requests` (indices into rows) as [padded, length, Q], each request's frames then zero frames
        up to `length`, then zero rows up to `padded` requests. `stacked`: `stack_sources(...)` of these sources
        (one per call, shared by its batches); index_to_device: host index tensor -> the device, without blocking."""
        zero = stacked.shape[0] - 1
        flat: list[int] = []
        for i in requests:
            before = len(flat)
            for source, start, count in self.pieces[i]:
                first = self._offset[id(source)] + start
                if count == 1:
                    flat.append(first)
                else:
                    flat.extend(range(first, first + count))
            n = len(flat) - before
            if n > length:
                raise ValueError(f"request {i} has {n} frames, more than {length}")
            flat.extend([zero] * (length - n))
        flat.extend([zero] * ((padded - len(requests)) * length))
        index = index_to_device(torch.tensor(flat, dtype=torch.long))
        return stacked.index_select(0, index).view(padded, length, stacked.shape[1])


def stack_sources(sources: Sequence[torch.Tensor], width: int, device: torch.device, to_device) -> torch.Tensor:
    """The sources end to end as int64 on `device`, plus one zero row last (what padding reads): [sum r_k + 1, width].
    to_device: host tensor -> device without blocking."""
    parts = []
    for s in sources:
        if s.dim() != 2 or s.shape[1] != width:
            raise ValueError(f"frames must be [n, {width}], got {tuple(s.shape)}")
        if s.device != device:
            s = to_device(s)
        parts.append(s if s.dtype == torch.long else s.to(torch.long))
    parts.append(torch.zeros((1, width), dtype=torch.long, device=device))
    return torch.cat(parts)
