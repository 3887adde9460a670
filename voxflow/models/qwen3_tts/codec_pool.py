"""The codec's streaming states as one pool of rows, allocated once and updated in place.

A request's codec state (codec_streaming.CodecStreamState: attention window, conv tails, frame counter) is one
row of a single pooled `CodecStreamState` of `max_rows + 1` rows; the request holds a `CodecRow` handle. One
batched decode step is

    rows = the batch's row numbers (a device LongTensor)
    state = pool.index_select(rows)  ->  stream_decode (functional)  ->  pool.index_copy_(rows, new state)

Every tensor in that step has a shape fixed by (batch size, frames), and the pool itself never moves, so the
step can be captured in a CUDA graph (codec_graphs.py) and replayed with new row numbers and codes.

Row `max_rows` is scratch that no request owns: padded batch entries (graph buckets) read it and write it, so
their garbage never lands in a live request's row. Its content is always the output of some earlier decode of
valid codes (or the initial state), hence finite, which is all padded entries need.

Rows go back to the free list on `release` (idempotent) or, as a safety net for callers that only drop the
handle, when the handle is garbage-collected (weakref.finalize). A handle must stay referenced while work that
uses its row is queued (PendingPCM keeps its handles); the row is then reset by whoever takes it next, on the
same stream as every other pool write, so stream order makes the reuse safe.
"""
from __future__ import annotations

import threading
import weakref

import torch

from .codec_decoder import CodecDecoder
from ...engine.host_to_device import to_device
from .codec_streaming import CodecStreamState, init_stream_state, stream_decode


class CodecPoolFullError(RuntimeError):
    """Every row of the codec state pool is taken (more live codec streams than the pool was sized for)."""


class CodecRow:
    """A request's handle on its pool row. `row` is the row number; `release()` gives the row back."""

    __slots__ = ("row", "pool", "_finalizer", "__weakref__")

    def __init__(self, row: int, pool: "CodecStatePool"):
        self.row = row
        self.pool = pool
        self._finalizer = weakref.finalize(self, pool._give_back, row)
        self._finalizer.atexit = False      # nothing to give back when the interpreter exits

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def release(self) -> None:
        self._finalizer()   # a finalize object runs its callback at most once: release is idempotent

    def __repr__(self) -> str:
        return f"CodecRow({self.row}{', released' if self.released else ''})"


class CodecStatePool:
    def __init__(self, decoder: CodecDecoder, max_rows: int):
        if max_rows < 1:
            raise ValueError(f"the codec state pool needs at least one row, got {max_rows}")
        self.decoder = decoder
        self.max_rows = max_rows
        self.scratch_row = max_rows
        # One allocation for all rows (+ scratch), in the decoder's dtype and device; never reallocated.
        self.state = init_stream_state(decoder, max_rows + 1)
        self._initial = init_stream_state(decoder, 1)       # what a fresh row is reset to
        self._free = list(range(max_rows - 1, -1, -1))      # pop() hands out row 0 first
        # A finalizer may run on any thread, or inside allocate() itself when a collection triggers: re-entrant.
        self._lock = threading.RLock()
        self.device = self.state.frames.device
        # Row numbers as a device tensor, so that resetting a row needs no host-to-device copy (a blocking copy
        # would wait for all the work queued on the codec stream).
        self._row_ids = torch.arange(max_rows + 1, device=self.device)

    # ---- rows ---------------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> CodecRow:
        """Take a free row and reset it to the initial state (on the current stream)."""
        return self.allocate_many(1)[0]

    def allocate_many(self, n: int) -> list[CodecRow]:
        """Take n free rows (all or none) and reset them in one pass: one copy per state tensor for all of them
        (a burst of new streams would otherwise cost n x the ~30 state tensors in launches)."""
        with self._lock:
            if len(self._free) < n:
                raise CodecPoolFullError(
                    f"no free codec state row for {n} new stream(s): {len(self._free)} of {self.max_rows} rows free "
                    "(the pool is sized from the engine's max_num_seqs; is a finished request's codec state never "
                    "released?)")
            rows = [self._free.pop() for _ in range(n)]
        handles = [CodecRow(row, self) for row in rows]
        if n == 1:
            self.reset(self._row_ids[rows[0]: rows[0] + 1])
        elif n > 1:
            self.reset(to_device(torch.tensor(rows, dtype=torch.long), self.device))
        return handles

    def _give_back(self, row: int) -> None:
        with self._lock:
            self._free.append(row)

    def reset(self, rows: torch.Tensor) -> None:
        """Rows [n] (device LongTensor) back to the state of a stream that has fed no frame."""
        for k, v in self.state.tensors.items():
            init = self._initial.tensors[k].expand(rows.shape[0], *v.shape[1:])
            v.index_copy_(0, rows, init)

    # ---- the batched step ----------------------------------------------------------------------------------
    def step(self, rows: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Decode codes [B, Q, T] for the streams in rows [B] (device LongTensor; entries may repeat only for the
        scratch row) and write their new states back in place -> waveform [B, T * upsample] in float32.

        Static shapes for a given (B, T) and no host synchronisation: capturable in a CUDA graph.
        """
        batch = CodecStreamState({k: v.index_select(0, rows) for k, v in self.state.tensors.items()})
        wav, new = stream_decode(self.decoder, codes, batch)
        for k, v in new.tensors.items():
            self.state.tensors[k].index_copy_(0, rows, v)
        return wav[:, 0].float()

    def read(self, row: int) -> CodecStreamState:
        """A copy of one row's state (tests, debugging; on CUDA synchronise the codec stream first)."""
        return self.state.select([row])
