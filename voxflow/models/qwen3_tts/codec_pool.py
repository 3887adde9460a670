"""The codec's streaming states as one pool of rows, allocated once and updated in place.

A request's codec state (codec_streaming.CodecStreamState: attention window, conv tails, frame counter) is one
row of a single pooled `CodecStreamState` of `max_rows + 1` rows; the request holds a `CodecRow` handle. One
batched decode step is

    rows = the batch's row numbers (a device LongTensor)
    state = pool.index_select(rows)  ->  stream_decode (its new state written into a packed buffer)
                                     ->  pool.index_copy_(rows, that buffer)

The ~42 state tensors of a row live side by side in one flat [rows, N] buffer per dtype (`PackedRows`; the named
tensors are views into it), so the gather is one index_select and the write-back one index_copy_ per dtype, not
one of each per tensor: 74 small launches (~0.63 ms of a 16-stream codec call's GPU time on the H200, session 14)
became ~5 (~0.22 ms). The decode writes each new state tensor straight into its piece of a packed buffer
(codec_decoder_blocks.StateWriter), which the write-back scatters as it is (no cat). On a GPU the row gather and
scatter are a Triton pass each (kernels/row_copy.py).

Every tensor in that step has a shape fixed by (batch size, frames), and the pool itself never moves, so the
step can be captured in a CUDA graph (codec_graphs.py) and replayed with new row numbers and codes.

Row `max_rows` is scratch that no request owns: padded batch entries (graph buckets) read it and write it, so
their garbage never lands in a live request's row. Its content is the output of some earlier decode of valid
codes (or the initial state): finite, unless a half-precision decode overflowed - and even then only the padded
entries' discarded outputs see it, since every batch row is computed on its own.

Rows go back to the free list on `release` (idempotent) or, as a safety net for callers that only drop the
handle, when the handle is garbage-collected (weakref.finalize). A handle must stay referenced while work that
uses its row is queued (PendingPCM keeps its handles); the row is then reset by whoever takes it next, on the
same stream as every other pool write, so stream order makes the reuse safe.
"""
from __future__ import annotations

import os
import threading
import weakref

import torch

from voxflow.kernels import use_kernels

from .codec_decoder import CodecDecoder
from .codec_decoder_blocks import StateWriter
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


class PackedRows:
    """Named per-row tensors stored as views into one contiguous [rows, N] buffer per dtype, so that a set of rows
    of all of them is gathered or written in one kernel per dtype. Built from a template {name: [1, ...]} whose row
    every row starts as."""

    def __init__(self, template: dict[str, torch.Tensor], rows: int):
        if not template or rows < 1:
            raise ValueError(f"packed rows need at least one tensor and one row (got {len(template)}, {rows})")
        self.layout: dict[torch.dtype, list[tuple[str, int, int, tuple[int, ...]]]] = {}   # name, offset, size, shape
        sizes: dict[torch.dtype, int] = {}
        for name, t in template.items():
            if t.shape[0] != 1:
                raise ValueError(f"template tensor {name!r} has {t.shape[0]} rows, not 1")
            size = t[0].numel()
            self.layout.setdefault(t.dtype, []).append((name, sizes.get(t.dtype, 0), size, tuple(t.shape[1:])))
            sizes[t.dtype] = sizes.get(t.dtype, 0) + size
        self._names = frozenset(template)                             # what `pack` checks a state against
        first = self.pack(template)                                  # the template's row, [1, N] a dtype
        self.flat = {dt: torch.empty((rows, n), dtype=dt, device=first[dt].device).copy_(first[dt].expand(rows, -1))
                     for dt, n in sizes.items()}
        self.tensors = self.views(self.flat)

    def views(self, flat: dict[torch.dtype, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The named tensors over flat buffers of this layout (any leading row count)."""
        out = {}
        for dt, entries in self.layout.items():
            buf = flat[dt]
            for name, offset, size, shape in entries:
                out[name] = buf[:, offset:offset + size].view(buf.shape[0], *shape)
        return out

    def pack(self, tensors: dict[str, torch.Tensor]) -> dict[torch.dtype, torch.Tensor]:
        """tensors {name: [n, ...]} (every name of the layout, each of its shape and dtype) as [n, N] a dtype: one
        cat of the pieces per dtype. Checked on the host only, so it stays capturable in a CUDA graph."""
        if tensors.keys() != self._names:
            raise ValueError(f"state names differ from the layout's: {sorted(set(tensors) ^ self._names)}")
        n = next(iter(tensors.values())).shape[0]
        out = {}
        for dt, entries in self.layout.items():
            pieces = []
            for name, _, size, shape in entries:
                t = tensors[name]
                if t.dtype != dt or tuple(t.shape) != (n, *shape):
                    raise ValueError(f"state {name!r} is {tuple(t.shape)} {t.dtype}, the layout holds "
                                     f"{(n, *shape)} {dt}")
                pieces.append(t.reshape(n, size))
            out[dt] = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
        return out

    def gather(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Copies of the given rows of every tensor (one row gather per dtype)."""
        return self.views({dt: gather_rows(buf, rows) for dt, buf in self.flat.items()})

    def empty(self, n: int) -> dict[torch.dtype, torch.Tensor]:
        """Uninitialised flat buffers for n rows of this layout ([n, N] a dtype; `views` names their pieces)."""
        return {dt: torch.empty((n, buf.shape[1]), dtype=dt, device=buf.device) for dt, buf in self.flat.items()}

    def write_slots(self, rows: torch.Tensor, flat: dict[torch.dtype, torch.Tensor], state: StateWriter) -> None:
        """A decode's new state into the given rows, where `state` wrote it into `flat`'s pieces (its slots): the
        pieces no key was written into get the key's current value first (a state entry the decode did not
        update, e.g. the other transposed-convolution form's), then one row scatter per dtype. Checked on the host
        only (capturable): the state names the layout's tensors."""
        if state.keys() != self._names:
            raise ValueError(f"state names differ from the layout's: {sorted(set(state) ^ self._names)}")
        for entries in self.layout.values():
            for name, *_ in entries:
                if name not in state.written:
                    state.slots[name].copy_(state[name])
        for dt, packed in flat.items():
            scatter_rows(self.flat[dt], rows, packed)

    def write(self, rows: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        """tensors {name: [len(rows), ...]} into those rows: per dtype one cat (`pack`) and one row scatter."""
        for dt, packed in self.pack(tensors).items():
            scatter_rows(self.flat[dt], rows, packed)

    def fill(self, rows: torch.Tensor, row: dict[torch.dtype, torch.Tensor]) -> None:
        """One row's values ({dtype: [1, N]}, e.g. a template's `flat`) into each of the given rows."""
        for dt, buf in self.flat.items():
            scatter_rows(buf, rows, row[dt].expand(rows.shape[0], -1))


# The rows' gather and scatter as kernels/row_copy.py's Triton passes on a GPU (kernels on): PyTorch's index_select
# and index_copy_ took 144 + 123 us of every 16-stream codec call on the H200 (session 28 call 2), copying these few,
# MB-wide rows an element at a time. On by default without a GPU measurement of its own yet (a plain copy, held
# bit-equal to the torch ops; the next device call's codec profiles time both); VOXFLOW_CODEC_ROW_COPY=0: torch's.
ROW_COPY_KERNELS = os.environ.get("VOXFLOW_CODEC_ROW_COPY", "1") == "1"


def gather_rows(buf: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """buf.index_select(0, rows), by the Triton pass where ROW_COPY_KERNELS says so."""
    if ROW_COPY_KERNELS and use_kernels(buf):
        from voxflow.kernels.row_copy import gather_rows as kernel
        return kernel(buf, rows)
    return buf.index_select(0, rows)


def scatter_rows(buf: torch.Tensor, rows: torch.Tensor, src: torch.Tensor) -> None:
    """buf.index_copy_(0, rows, src) (src may be one row expanded), by the Triton pass where ROW_COPY_KERNELS says
    so."""
    if ROW_COPY_KERNELS and use_kernels(buf):
        from voxflow.kernels.row_copy import scatter_rows as kernel
        kernel(buf, rows, src)
    else:
        buf.index_copy_(0, rows, src)


# A step's decode writes its new state straight into the packed write-back rows (codec_decoder_blocks.StateWriter)
# instead of into tensors of its own that the write-back packs with a cat (session 39 on an H100: that cat was one
# 114 us kernel of a 16-stream 1-frame call's 1.68 ms). On by default; session 40 (H100): a 16-stream call's kernel
# time 1.48 -> 1.38 ms at 1 frame, 10.97 -> 10.84 at 25 (benchmarks/results/h100/2026-12-05-session40);
# VOXFLOW_CODEC_STATE_WRITER=0: the cat.
STATE_WRITER = os.environ.get("VOXFLOW_CODEC_STATE_WRITER", "1") == "1"


class CodecStatePool:
    def __init__(self, decoder: CodecDecoder, max_rows: int):
        if max_rows < 1:
            raise ValueError(f"the codec state pool needs at least one row, got {max_rows}")
        self.decoder = decoder
        self.max_rows = max_rows
        self.scratch_row = max_rows
        # One buffer per dtype for all rows (+ scratch), on the decoder's device; never reallocated. Every row
        # starts as the initial state, which is also what `reset` writes (same layout: built from it).
        self._initial = PackedRows(init_stream_state(decoder, 1).tensors, 1)
        self._packed = PackedRows(self._initial.tensors, max_rows + 1)
        self.state = CodecStreamState(self._packed.tensors)  # named views into the packed rows
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
        """Take n free rows (all or none) and reset them in one pass: one copy per state dtype for all of them
        (a burst of new streams would otherwise cost n x the copies)."""
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
        self._packed.fill(rows, self._initial.flat)

    # ---- the batched step ----------------------------------------------------------------------------------
    def step(self, rows: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Decode codes [B, Q, T] for the streams in rows [B] (device LongTensor; entries may repeat only for the
        scratch row) and write their new states back in place -> waveform [B, T * upsample] in float32.

        Static shapes for a given (B, T) and no host synchronisation: capturable in a CUDA graph.
        """
        if not STATE_WRITER:
            wav, new = stream_decode(self.decoder, codes, CodecStreamState(self._packed.gather(rows)))
            self._packed.write(rows, new.tensors)
            return wav[:, 0].float()
        flat = self._packed.empty(rows.shape[0])
        state = StateWriter(self._packed.gather(rows), self._packed.views(flat))
        wav, new = stream_decode(self.decoder, codes, CodecStreamState(state))
        self._packed.write_slots(rows, flat, new.tensors)
        return wav[:, 0].float()

    def read(self, row: int) -> CodecStreamState:
        """A copy of one row's state (tests, debugging; on CUDA synchronise the codec stream first)."""
        return self.state.select([row])
