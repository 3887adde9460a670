"""The per-frame decode step at static shapes: padded batch buckets, device-side input buffers, and on a GPU one
CUDA graph per (batch bucket, KV-table width, model variant) for the whole step.

`DecodeRunner.run(slots, block_tables, context_lens, slot_mapping)` is what the engine calls once per step. It

1. pads the batch up to the next bucket (1, 2, 4, 8, 16, 24, 32, 48, 64, ...): padding rows point at the model's
   scratch slot (`model.padding_slot`) and at a scratch KV page the engine keeps out of the block manager, so
   they compute garbage that nobody reads and write nowhere that matters;
2. writes the inputs into preallocated host buffers (pinned on a GPU) and copies them into static device buffers
   (double-buffered, so the host never overwrites a source the previous step's copy may still read);
3. runs `model.decode` on views of the static buffers: eagerly on a CPU (the same padding and buffers, so CPU
   tests exercise them), or by replaying the CUDA graph captured for that shape (captured on first use, or up
   front with `capture`), so one step costs one graph launch instead of thousands of kernel launches.

The model's decode must then be capturable: device tensors only, no host reads, shapes fixed by the inputs.
It tells the runner when it reallocated buffers a graph may hold (`model.graph_epoch` changes: every graph is
dropped and captured again) and which variant of the step it wants (`model.decode_variant()`, e.g. whether any
request samples at all: a greedy-only batch skips the sampling math).

The outputs live in the graph's memory and are overwritten by the next replay: the caller copies what it needs
before the next `run` (the engine does, on the same stream).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .model_api import DecodeOutput, PagedKVContext, TTSModel


# Session 41 (H100) measured the step's copies captured inside its graph (one graph per shape and staging buffer):
# 1.7B c=1 full steps 3.50 ms against 3.49, 0.6B c=64 5.79 against 5.79; not kept (code in commit 23949d1).


def batch_buckets(max_batch: int) -> list[int]:
    """Padded batch sizes: powers of two up to 16, then steps of half a power of two, capped by max_batch."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b = b * 2 if b < 16 else b + (1 << (b.bit_length() - 2))
    sizes.append(max_batch)
    return sizes


_warm_up_streams: dict[str, "torch.cuda.Stream"] = {}


def warm_up_stream(device=None) -> "torch.cuda.Stream":
    """The one side stream every capture's warm-up runs on, per device (decode and prefill runners alike): every
    stream that runs a GEMM gets a cuBLAS workspace of its own, kept for the life of the process (32 MiB on Hopper),
    and the blocks a warm-up frees are cached for its stream only. With a new stream per decode capture, 20 such
    workspaces stayed live after startup (session 20 call 3); one stream for the decode captures left 3 (session 21
    call 1)."""
    key = str(device)                      # the runners all name the device as the model does
    stream = _warm_up_streams.get(key)
    if stream is None:
        stream = _warm_up_streams[key] = torch.cuda.Stream(device)
    return stream


def warm_then_capture(run, pool, side: "torch.cuda.Stream | None" = None) -> tuple["torch.cuda.CUDAGraph", object]:
    """Run `run()` once on a side stream (`warm_up_stream()` unless given: lazy initialisation, Triton compiles:
    nothing of that may happen inside a capture), then capture it into a CUDA graph in the memory pool `pool`;
    returns (graph, the captured outputs)."""
    side = side or warm_up_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out


def width_bucket(width: int) -> int:
    """Block-table width rounded up to a power of two (the attention context takes a few static shapes)."""
    return 1 << max(0, width - 1).bit_length()


@dataclass
class RunnerStats:
    graphs: int = 0
    capture_seconds: float = 0.0
    replays: int = 0
    eager_steps: int = 0


def _segment(batch: int) -> int:
    """Values a per-row input's segment takes in the packed buffer: the batch rounded up to even, so that every
    segment starts 16-byte aligned (what a vectorised or TMA reader wants; Triton specialises on it)."""
    return batch + batch % 2


def _input_views(buf: torch.Tensor, batch: int, width: int) -> dict[str, torch.Tensor]:
    """The decode inputs as views of one int64 buffer [slots | lens | mapping | tables B x W], each of the first
    three a `_segment(B)`-long segment of which the views take B values."""
    b, seg = batch, _segment(batch)
    return dict(slots=buf[:b], lens=buf[seg:seg + b], mapping=buf[2 * seg:2 * seg + b].view(b, 1),
                tables=buf[3 * seg:3 * seg + b * width].view(b, width))


class DecodeRunner:
    def __init__(self, model: TTSModel, k_cache, v_cache, block_size: int, max_batch: int, max_width: int,
                 scratch_block: int, cuda_graphs: bool, fixed_width: bool = False):
        self.model = model
        self.k_cache, self.v_cache = k_cache, v_cache
        self.block_size = block_size
        self.device = torch.device(model.device)
        self.buckets = batch_buckets(max_batch)
        self.max_width = width_bucket(max_width)
        self.fixed_width = fixed_width          # attention kernels read only real pages: one width fits all
        self.scratch_block = scratch_block
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.stats = RunnerStats()
        B, W = self.buckets[-1], self.max_width
        pin = self.device.type == "cuda"
        # Host staging (two sets, used alternately) and the static device inputs every graph reads: each set one
        # int64 buffer laid out [slots B | lens B | mapping B | tables B x W] with a named view per input, so a
        # step's inputs go over in ONE copy (the used prefix) instead of four: on the H200 each copy cost ~1 us plus
        # a 2-6 us gap on the step's stream (benchmarks/results/h200/2026-12-04-session29, call 1's timeline).
        # (Reusing a host buffer two steps later is safe: the engine has read step N's results, so its copy ran,
        # before it launches step N + 2; engine.py's one-step-late collect.)
        size = 3 * _segment(B) + B * W
        self._host_bufs = [torch.zeros(size, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._dev_buf = torch.zeros(size, dtype=torch.long, device=self.device)
        self._host = [_input_views(buf, B, W) for buf in self._host_bufs]
        self._dev = _input_views(self._dev_buf, B, W)
        self._flip = 0
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, DecodeOutput]] = {}
        self._epoch = getattr(model, "graph_epoch", 0)
        self._pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self._side = warm_up_stream(self.device) if self.cuda_graphs else None      # every capture's warm-up

    # ---- shapes ---------------------------------------------------------------------------------------------
    def bucket_for(self, batch: int) -> int:
        for b in self.buckets:
            if b >= batch:
                return b
        raise ValueError(f"decode batch of {batch} exceeds the largest bucket {self.buckets[-1]}")

    def _width_for(self, width: int) -> int:
        if width > self.max_width:
            raise ValueError(f"block table of {width} pages exceeds the runner's {self.max_width}")
        return self.max_width if self.fixed_width else width_bucket(width)

    # ---- one step -------------------------------------------------------------------------------------------
    def run(self, slots: list[int], block_tables: list[list[int]], context_lens: list[int],
            slot_mapping: list[int]) -> DecodeOutput:
        """Decode one frame for each slot; outputs are views [:len(slots)] of buffers the next run overwrites."""
        n = len(slots)
        bucket = self.bucket_for(n)
        width = self._width_for(max(len(t) for t in block_tables))
        flip = self._flip
        self._fill(self._host[flip], slots, block_tables, context_lens, slot_mapping, bucket, width)
        self._copy_inputs(flip, bucket, width)
        if self.cuda_graphs:
            self._check_epoch()
            key = self._key(bucket, width)
            if key not in self._graphs:
                self._capture(key)
            graph, out = self._graphs[key]
            graph.replay()
            self.stats.replays += 1
        else:
            out = self._decode(bucket, width)
            self.stats.eager_steps += 1
        # The other staging buffer next, only now that this step is queued: a step that failed before its replay
        # leaves the step before it unread, whose buffer the next step must not reuse.
        self._flip ^= 1
        return DecodeOutput(out.frames[:n], out.finished[:n], out.eos[:n],
                            None if out.flags is None else out.flags[:n])

    def _key(self, bucket: int, width: int) -> tuple:
        """A captured graph's key: its shape and the model's variant."""
        return (bucket, width, self.model.decode_variant())

    def _copy_inputs(self, flip: int, bucket: int, width: int) -> None:
        """The staged inputs to the device: the prefix up to the end of what this shape reads (the table is laid
        out as [bucket, width] from its start); the other inputs' unread tails ride along (at most 3 x (B + 1)
        values)."""
        used = 3 * _segment(self.buckets[-1]) + bucket * width
        self._dev_buf[:used].copy_(self._host_bufs[flip][:used], non_blocking=True)

    def _fill(self, host, slots, tables, lens, mapping, bucket, width) -> None:
        # Through numpy views of the (pinned) host tensors: a row assignment from a list costs ~1 us, where a
        # torch.as_tensor per row costs ~20 (this runs once per step for every request in the batch).
        n = len(slots)
        t = host["tables"].numpy().reshape(-1)[:bucket * width].reshape(bucket, width)
        t.fill(-1)
        for i, row in enumerate(tables):
            t[i, :len(row)] = row
        t[n:, 0] = self.scratch_block
        s, ln, mp = host["slots"].numpy(), host["lens"].numpy(), host["mapping"].numpy()
        s[:n], s[n:] = slots, self.model.padding_slot
        ln[:n], ln[n:] = lens, 1
        mp[:n, 0], mp[n:, 0] = mapping, self.scratch_block * self.block_size

    def _views(self, bucket: int, width: int) -> PagedKVContext:
        d = self._dev
        tables = d["tables"].view(-1)[:bucket * width].view(bucket, width)
        return PagedKVContext(self.k_cache, self.v_cache, self.block_size, tables, d["lens"][:bucket],
                              d["mapping"][:bucket])

    def _decode(self, bucket: int, width: int) -> DecodeOutput:
        return self.model.decode(self._dev["slots"][:bucket], self._views(bucket, width))

    # ---- CUDA graphs ----------------------------------------------------------------------------------------
    def _check_epoch(self) -> None:
        epoch = getattr(self.model, "graph_epoch", 0)
        if epoch != self._epoch:
            # The model reallocated state a graph reads or writes: every captured graph is stale. New captures go
            # to a new memory pool: once its last graph is gone PyTorch releases a pool, and capturing into the old
            # handle again fails an internal assert (use_count > 0; the H200 voice-clone run of 2026-12-01).
            self._graphs.clear()
            self._epoch = epoch
            if self.cuda_graphs:
                self._pool = torch.cuda.graph_pool_handle()

    def _capture(self, key: tuple) -> None:
        """Capture the step for one shape. Warm-up and capture run on padding rows only (scratch slot, scratch
        page), so live requests' state is untouched; the real inputs are written afterwards."""
        bucket, width, _ = key
        started = time.perf_counter()
        saved = {k: v.clone() for k, v in self._dev.items()}
        d = self._dev
        self._pad_inputs(bucket, width)
        graph, out = warm_then_capture(lambda: self._decode(bucket, width), self._pool, self._side)
        for k, v in saved.items():
            d[k].copy_(v)
        self._graphs[key] = (graph, out)
        self.stats.graphs += 1
        self.stats.capture_seconds += time.perf_counter() - started

    def _pad_inputs(self, bucket: int, width: int) -> None:
        """The device inputs pointing every row at the scratch slot and page."""
        d = self._dev
        d["slots"].fill_(self.model.padding_slot)
        d["tables"].fill_(-1)
        d["tables"].view(-1)[:bucket * width].view(bucket, width)[:, 0] = self.scratch_block
        d["lens"].fill_(1)
        d["mapping"].fill_(self.scratch_block * self.block_size)

    def capture(self, batch_sizes: list[int] | None = None, widths: list[int] | None = None) -> float:
        """Capture graphs up front (startup) for these batch buckets and table widths, for every variant the model
        expects to run (`model.startup_variants()`, e.g. its default sampling settings; else the current one);
        returns seconds spent."""
        if not self.cuda_graphs:
            return 0.0
        before = self.stats.capture_seconds
        self._check_epoch()
        widths = [self.max_width] if self.fixed_width else sorted({self._width_for(w) for w in (widths or [1])})
        variants = getattr(self.model, "startup_variants", lambda: [None])()
        for variant in variants:
            force = getattr(self.model, "force_variant", None)
            if variant is not None and force is not None:
                force(variant)
            try:
                for b in sorted({self.bucket_for(b) for b in (batch_sizes or self.buckets)}):
                    for w in widths:
                        key = self._key(b, w)
                        if key not in self._graphs:
                            self._capture(key)
            finally:
                if variant is not None and force is not None:
                    force(None)
        torch.cuda.synchronize()
        return self.stats.capture_seconds - before
