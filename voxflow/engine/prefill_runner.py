"""New requests' prompt prefill at static shapes, replayed from CUDA graphs: one per (batch bucket, length bucket).

Why: run eagerly, a 28-layer talker prefill is ~700 kernel launches and ~35 ms of host time on an H200 for ~2 ms
of GPU work (measured: benchmarks/results/h200/2026-12-01-session4/prefill_run3.txt), and that host time is most of
a lone request's first-packet latency. Replayed from a graph it is one launch.

`PrefillRunner.key_for(chunks)` says whether a step's prefill chunks fit a graph: each chunk is run from position 0
to its end (at most `max(lengths)` positions), at most `max(batches)` chunks. A chunk that starts later (a
prefix-cache hit, the rest of a prompt split into chunks, a re-prefill after preemption) is run whole, with the
positions already in the cache mapped to the scratch slot: their K/V are recomputed but written nowhere, while
the attention reads the cached pages through the block table, so the new positions see exactly the context they
would see computed alone. Recomputing a few hundred positions costs the GPU far less than the eager path costs
the host. Anything longer runs the model's eager path.

`run(key, items)` left-pads each chunk to the length bucket and the batch to the batch bucket, exactly as the
model's batched prefill does (padding positions write their K/V into the engine's scratch page and are never part
of any context; padding rows are all scratch), writes the inputs into static buffers, replays the graph (or, on a
CPU, runs the same padded forward eagerly so that tests exercise it), and hands each row's last hidden state to
`model.prefill_outputs` (the first c0 draw: host bookkeeping, outside the graph).

The model provides `prefill_input_spec() -> (hidden, dtype)`, `prefill_forward(x [B, L, H], positions [B, L],
kv) -> hidden [B, L, H]` (capturable: device tensors only) and `prefill_outputs(rows, last_hidden)`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .graph_runner import RunnerStats, width_bucket
from .model_api import PagedKVContext
from .priority_replay import GraphReplayer

# B x L within the step's token budget (2048 by default: 512 for up to 4 prompts, 2048 for one).
PREFILL_LENGTHS = (32, 64, 128, 256, 512, 1024, 2048)
PREFILL_BATCHES = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class PrefillItem:
    slot: int
    embeds: torch.Tensor          # [n, H] input embeddings of positions 0 .. n-1 (the chunk's end)
    block_table: list[int]
    slot_mapping: list[int]       # n flat KV slots (the scratch slot for positions already in the cache)
    last: bool                    # the prompt's last chunk (the first c0 is drawn after it)


class PrefillRunner:
    def __init__(self, model, k_cache, v_cache, block_size: int, scratch_block: int, max_tokens: int,
                 max_batch: int, cuda_graphs: bool, high_priority: bool = False):
        self.model = model
        self.k_cache, self.v_cache = k_cache, v_cache
        self.block_size = block_size
        self.scratch_slot = scratch_block * block_size
        self.scratch_block = scratch_block
        self.device = torch.device(model.device)
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self._replayer = GraphReplayer(self.device, high_priority and self.cuda_graphs)
        # Shapes: B x L within the step's token budget (the scheduler never gives more), B within the model slots.
        self.shapes = [(b, n) for n in PREFILL_LENGTHS for b in PREFILL_BATCHES
                       if b * n <= max_tokens and b <= max(max_batch, 1)]
        self.stats = RunnerStats()
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self._epoch = getattr(model, "graph_epoch", 0)
        self._buffers_made = False

    def _make_buffers(self) -> None:
        tokens = max(b * n for b, n in self.shapes)
        rows = max(b for b, _ in self.shapes)
        width = max(self._width(n) for _, n in self.shapes)
        hidden, dtype = self.model.prefill_input_spec()
        sizes = {"positions": tokens, "mapping": tokens, "tables": rows * width, "lens": rows}
        self._dev = {k: torch.zeros(n, dtype=torch.long, device=self.device) for k, n in sizes.items()}
        self._x = torch.zeros(tokens, hidden, dtype=dtype, device=self.device)
        self._buffers_made = True

    def _width(self, length: int) -> int:
        return width_bucket(-(-length // self.block_size))

    # ---- which chunks fit -------------------------------------------------------------------------------------
    def key_for(self, chunks: list[tuple[int, int]]) -> tuple[int, int] | None:
        """chunks: (start, length) of each; the (batch, length) bucket that holds each from position 0 to its end, or
        None (run them eagerly)."""
        if not self.shapes:
            return None
        longest = max(start + n for start, n in chunks)
        for key in self.shapes:                         # ordered by length, then batch: the smallest fit first
            if key[1] >= longest and key[0] >= len(chunks):
                return key if (not self.cuda_graphs or key in self._graphs) else None
        return None

    # ---- one prefill --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, key: tuple[int, int], items: list[PrefillItem]) -> None:
        if not self._buffers_made:
            self._make_buffers()
        bsz, length = key
        width = self._width(length)
        # Fresh pinned staging every run, from PyTorch's caching host allocator, which hands a block out again only
        # after the copies reading it have run. (Two fixed sets used in turn were not enough: a step may replay
        # several prefill graphs while the GPU is still behind, and a third run overwrote the first one's inputs
        # before its copy ran: wrong lengths and an out-of-bounds gather on the H200.)
        used = {"positions": bsz * length, "mapping": bsz * length, "tables": bsz * width, "lens": bsz}
        host = {k: torch.empty(n, dtype=torch.long, pin_memory=self.device.type == "cuda") for k, n in used.items()}
        pos = host["positions"].numpy().reshape(bsz, length)
        mp = host["mapping"].numpy().reshape(bsz, length)
        tb = host["tables"].numpy().reshape(bsz, width)
        ln = host["lens"].numpy()
        pos.fill(0)
        mp.fill(self.scratch_slot)
        tb.fill(-1)
        tb[:, 0] = self.scratch_block
        ln.fill(1)
        x = self._x[:bsz * length].view(bsz, length, -1)
        x.zero_()
        for i, item in enumerate(items):
            n = item.embeds.shape[0]
            pos[i, length - n:] = range(n)
            mp[i, length - n:] = item.slot_mapping
            # Only the pages of positions [0, n): a prompt's earlier chunk already holds all of its pages.
            pages = item.block_table[:width]
            tb[i, :len(pages)] = pages
            ln[i] = n
            x[i, length - n:].copy_(item.embeds)
        for name, buf in self._dev.items():                 # only the prefix this shape reads
            buf[:used[name]].copy_(host[name], non_blocking=True)
        if self.cuda_graphs:
            self._check_epoch()
            graph, out = self._graphs[key]
            self._replayer.replay(graph)
            self.stats.replays += 1
        else:
            out = self._forward(bsz, length)
            self.stats.eager_steps += 1
        self.model.prefill_outputs([(item.slot, item.last) for item in items], out[:len(items), -1])

    def _forward(self, bsz: int, length: int) -> torch.Tensor:
        d, width = self._dev, self._width(length)
        kv = PagedKVContext(self.k_cache, self.v_cache, self.block_size, d["tables"][:bsz * width].view(bsz, width),
                            d["lens"][:bsz], d["mapping"][:bsz * length].view(bsz, length))
        return self.model.prefill_forward(self._x[:bsz * length].view(bsz, length, -1),
                                          d["positions"][:bsz * length].view(bsz, length), kv)

    # ---- CUDA graphs ------------------------------------------------------------------------------------------
    def _check_epoch(self) -> None:
        epoch = getattr(self.model, "graph_epoch", 0)
        if epoch != self._epoch:
            self._graphs.clear()
            self._epoch = epoch

    def _pad_only(self) -> None:
        """Every row padding (scratch page only): what warm-up and capture run on, so no request's KV is touched."""
        d = self._dev
        d["positions"].zero_()
        d["mapping"].fill_(self.scratch_slot)
        d["tables"].fill_(-1)
        d["lens"].fill_(1)
        self._x.zero_()

    def capture(self) -> float:
        """Capture every shape up front (engine startup); returns the seconds spent. A graph per shape: the whole
        grid is captured at start because a capture while serving would stall the running streams."""
        if not self.cuda_graphs:
            return 0.0
        if not self._buffers_made:
            self._make_buffers()
        self._check_epoch()
        started = time.perf_counter()
        side = torch.cuda.Stream()
        for key in sorted(self.shapes, key=lambda k: -k[0] * k[1]):      # largest first: the pool fits them all
            if key in self._graphs:
                continue
            bsz, length = key
            width = self._width(length)
            self._pad_only()
            d = self._dev
            d["tables"][:bsz * width].view(bsz, width)[:, 0] = self.scratch_block
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                self._forward(bsz, length)          # warm-up: lazy initialisation, kernel compilation
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(graph, pool=self._pool):
                out = self._forward(bsz, length)
            self._graphs[key] = (graph, out)
            self.stats.graphs += 1
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        self.stats.capture_seconds += seconds
        return seconds
