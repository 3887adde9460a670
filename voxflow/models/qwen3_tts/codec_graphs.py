"""CUDA graphs of the pooled codec step, one per (batch size, frames), captured lazily and replayed.

Measured on an H200, an eager streaming decode step costs ~18.5 ms at batch 1, mostly launch overhead of the
decoder's many small kernels; replaying the captured step costs ~2.7 ms. `CodecStatePool.step` has static
shapes and no host synchronisation for a given (B, T), so each such shape is captured once:

    static inputs   rows [B] (pool row numbers), codes [B, Q, T]       written before each replay
    static output   waveform [B, T * upsample] float32                 read (copied out) after each replay

All graphs share one memory pool (a `torch.cuda.MemPool`), so the memory of the many shapes is that of the
largest, not their sum: a later capture may reuse the memory of an earlier graph's intermediates, which are
dead once its replay ends. That memory may then also hold another graph's static output, so an output is only
valid until the next replay of ANY graph: `run`'s caller copies it out at once, on the same stream (replays and
copies are serialised on the codec stream, which is what makes the sharing safe).

Capture follows the documented recipe: the step first runs eagerly on the (non-default) codec stream a few times
so that lazy initialisation (cuBLAS handles and workspaces, cuDNN heuristics, derived weights) happens outside
the capture. The warm-up allocates from the graphs' own pool, which the capture then reuses: run outside it, its
activations were a second copy of the graph's, freed to the caching allocator's default pool but kept reserved
there (16 streams x 25 frames in fp16: ~0.75 GiB of the 0.6B engine's peak, session 21 call 1's snapshot). The
rule that makes this safe: nothing a warm-up allocates may outlive it once a graph exists, since its blocks may be
another graph's scratch memory, overwritten by that graph's replays. The static inputs are made outside the pool;
the lazily derived weights (packed convolutions, fused projections) are made by the first warm-up, before any graph.
The warm-up and capture use rows that all point at the pool's scratch row, so nothing a live request owns is written.
`capture_error_mode="thread_local"` lets other threads (e.g. an engine thread running the talker) keep using CUDA
while this thread captures.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .codec_pool import CodecStatePool

WARMUP_RUNS = 2


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    rows: torch.Tensor       # [B] int64, static input
    codes: torch.Tensor      # [B, Q, T] int64, static input
    out: torch.Tensor        # [B, T * upsample] float32, static output


class CodecGraphs:
    def __init__(self, pool: CodecStatePool, stream: torch.cuda.Stream):
        self.pool = pool
        self.stream = stream
        with torch.cuda.device(pool.device):         # a pool belongs to the device current at its creation
            self.mempool = torch.cuda.MemPool()      # the graphs' memory, and their eager warm-ups'
        self.graphs: dict[tuple[int, int], _Captured] = {}
        self.num_quantizers = pool.decoder.config.num_quantizers
        self.capture_seconds = 0.0          # host time spent capturing (the engine's step trace reads it)

    def __contains__(self, shape: tuple[int, int]) -> bool:
        return shape in self.graphs

    def run(self, rows: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """`pool.step(rows, codes)` by graph replay, on the codec stream (which must be current). The result is
        the graph's static output: copy what you need before the next replay of any graph (module docstring)."""
        captured = self.capture(rows.shape[0], codes.shape[-1])
        captured.rows.copy_(rows)
        captured.codes.copy_(codes)
        captured.graph.replay()
        return captured.out

    def capture(self, batch: int, frames: int) -> _Captured:
        """The graph of shape (batch, frames), capturing it first if needed (a full device synchronisation)."""
        key = (batch, frames)
        if key in self.graphs:
            return self.graphs[key]
        device = self.pool.device
        started = time.perf_counter()
        with torch.cuda.stream(self.stream):
            # the static inputs outlive the warm-up: outside the graphs' pool (module docstring)
            rows = torch.full((batch,), self.pool.scratch_row, dtype=torch.long, device=device)
            codes = torch.zeros((batch, self.num_quantizers, frames), dtype=torch.long, device=device)
            with torch.no_grad(), torch.cuda.use_mem_pool(self.mempool, device):
                for _ in range(WARMUP_RUNS):
                    self.pool.step(rows, codes)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph, pool=self.mempool.id, stream=self.stream,
                                               capture_error_mode="thread_local"):
            out = self.pool.step(rows, codes)
        captured = self.graphs[key] = _Captured(graph, rows, codes, out)
        self.capture_seconds += time.perf_counter() - started
        return captured
