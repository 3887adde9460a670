"""Prompt prefill at static shapes, replayed from CUDA graphs: one per (batch, query length, context width) bucket.

Why: run eagerly, a 28-layer talker prefill is ~700 kernel launches and ~35 ms of host time on an H200 for ~2 ms
of GPU work (measured: benchmarks/results/h200/2026-12-01-session4/prefill_run3.txt), and that host time is most of
a lone request's first-packet latency. Replayed from a graph it is one launch.

`PrefillRunner.plan(chunks)` picks the cheapest graph that holds some prefill chunks (start, end) (prefill_dispatch.py
decides which chunks of a step share a graph, through `plan_for`): each chunk's
new positions [start, end) are the queries (at most `L` of them), attending to the row's whole context [0, end)
read from the pages (at most `W` pages). That covers whole prompts and the new part of a prefix-cache hit alike,
so the cached part is never computed again (voice-clone prompts share long reference prefixes), and a prompt's
later chunks. Anything longer runs the model's eager path. Shapes: every (B, L) with B x L within the step's token
budget at the width L needs, plus wider contexts (W up to 1024 positions) for short query lengths.

`run(key, items)` left-pads each chunk to the length bucket and the batch to the batch bucket, exactly as
the model's batched prefill does (padding positions write their K/V into the engine's scratch page and are never
part of any context; padding rows are all scratch), writes the inputs into static buffers, replays the graph (or,
on a CPU, runs the same padded forward eagerly so that tests exercise it), and hands each row's last hidden state
to `model.prefill_outputs` (the first c0 draw: host bookkeeping, outside the graph).

The model provides `prefill_input_spec() -> (hidden, dtype)`, `prefill_forward(x [B, L, H], positions [B, L],
kv) -> hidden [B, L, H]` (capturable: device tensors only) and `prefill_outputs(rows, last_hidden)`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .graph_runner import RunnerStats, warm_then_capture, warm_up_stream, width_bucket
from .model_api import PagedKVContext

# B x L within the step's token budget (4096 by default: 512 for up to 8 prompts, 2048 for two).
PREFILL_LENGTHS = (32, 64, 128, 256, 512, 1024, 2048)
PREFILL_BATCHES = (1, 2, 4, 8, 16, 32, 64)
# Wider contexts for short query lengths (prefix-cache hits: a short new part after a long cached prefix), in
# positions, with at most SUFFIX_MAX_KEYS gathered key positions per shape (B x context: bounds the graph's memory).
SUFFIX_LENGTHS = (32, 64, 128)
SUFFIX_CONTEXTS = (256, 512, 1024)
SUFFIX_MAX_KEYS = 16384


@dataclass
class PrefillItem:
    slot: int
    embeds: torch.Tensor          # [>= end, H] the sequence's input embeddings from position 0
    start: int                    # the chunk: positions [start, end) are new; [0, start) are already in the pages
    end: int
    block_table: list[int]
    slot_mapping: list[int]       # end - start flat KV slots, for positions [start, end)
    last: bool                    # the prompt's last chunk (the first c0 is drawn after it)


class GraphedPrefill:
    """What the padded runner (below) and the packed one (packed_prefill.py) share: the model's prefill over static
    device buffers, one CUDA graph per shape in one memory pool, all captured at startup (a capture while serving
    would stall the running streams), or the same forward eagerly on a CPU (tests).

    A subclass sets `shapes` and provides `_make_buffers()`, `_forward(*key)` (capturable), `_pad_only(key)` (the
    buffers as all-padding rows: what warm-up and capture run on, so no request's KV is touched) and
    `_capture_order(key)` (largest first: the shared pool then fits all the others).

    `_forward` returns only the hidden states `prefill_outputs` reads (one row per chunk), made inside the graph:
    a graph's output stays allocated for as long as the graph lives, while everything else it computes is scratch
    memory shared by all the graphs. Returning the whole [T, H] hidden state kept one per graph, 205 MiB for the
    0.6B engine's 74 packed-prefill graphs (H200 session 28 call 5's allocation probe)."""
    shapes: list[tuple]

    def __init__(self, model, k_cache, v_cache, block_size: int, scratch_block: int, cuda_graphs: bool):
        self.model = model
        self.k_cache, self.v_cache = k_cache, v_cache
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.scratch_slot = scratch_block * block_size
        self.device = torch.device(model.device)
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.stats = RunnerStats()
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # No `graph_epoch` check here (unlike the decode graphs): `prefill_forward` reads only this runner's
        # buffers, the KV pool and the weights, never the per-slot decode buffers whose reallocation bumps the epoch.
        # Dropping these graphs then (a request with a long text grows the slot buffers) crashed a replay planned
        # just before, and left every later prefill eager.
        self._pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self._buffers_made = False

    def _buffers(self) -> dict[str, torch.Tensor]:
        if not self._buffers_made:
            self._make_buffers()
            self._buffers_made = True
        return self._dev

    def _replay(self, key: tuple) -> torch.Tensor:
        """The prefill of shape `key` over the buffers as they are now: its graph, or eagerly on a CPU."""
        if self.cuda_graphs:
            graph, out = self._graphs[key]
            graph.replay()
            self.stats.replays += 1
            return out
        self.stats.eager_steps += 1
        return self._forward(*key)

    def capture(self) -> float:
        """Capture every shape up front (engine startup); returns the seconds spent."""
        if not self.cuda_graphs:
            return 0.0
        self._buffers()
        started = time.perf_counter()
        side = warm_up_stream(self.device)
        for key in sorted(self.shapes, key=self._capture_order):
            if key in self._graphs:
                continue
            self._pad_only(key)
            self._graphs[key] = warm_then_capture(lambda key=key: self._forward(*key), self._pool, side)
            self.stats.graphs += 1
        self._captured()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        self.stats.capture_seconds += seconds
        return seconds

    def _captured(self) -> None:
        """After a capture (the set of graphs changed)."""


class PrefillRunner(GraphedPrefill):
    def __init__(self, model, k_cache, v_cache, block_size: int, scratch_block: int, max_tokens: int,
                 max_batch: int, cuda_graphs: bool):
        super().__init__(model, k_cache, v_cache, block_size, scratch_block, cuda_graphs)
        # Shapes: B x L within the step's token budget (the scheduler never gives more), B within the model slots.
        batches = [b for b in PREFILL_BATCHES if b <= max(max_batch, 1)]
        shapes = {(b, n, self._width(n)) for n in PREFILL_LENGTHS for b in batches if b * n <= max_tokens}
        shapes |= {(b, n, self._width(c)) for n in SUFFIX_LENGTHS for c in SUFFIX_CONTEXTS for b in batches
                   if b * n <= max_tokens and b * c <= SUFFIX_MAX_KEYS and c > n}
        # Cheapest first (computed positions, then gathered context): plan() takes the first that fits.
        self.shapes = sorted(shapes, key=lambda k: (k[0] * k[1], k[2], k[1]))
        self._plans: dict[tuple[int, int, int], tuple[int, int, int] | None] = {}     # plan_for's answers

    def _make_buffers(self) -> None:
        tokens = max(b * n for b, n, _ in self.shapes)
        rows = max(b for b, _, _ in self.shapes)
        hidden, dtype = self.model.prefill_input_spec()
        sizes = {"positions": tokens, "mapping": tokens, "tables": max(b * w for b, _, w in self.shapes),
                 "lens": rows}
        self._dev = {k: torch.zeros(n, dtype=torch.long, device=self.device) for k, n in sizes.items()}
        self._x = torch.zeros(tokens, hidden, dtype=dtype, device=self.device)

    def _width(self, length: int) -> int:
        return width_bucket(-(-length // self.block_size))

    # ---- which chunks fit -------------------------------------------------------------------------------------
    def plan(self, chunks: list[tuple[int, int]]) -> tuple[int, int, int] | None:
        """chunks: (start, end) of each -> the cheapest (batch, length, width) bucket that holds them, or None (run
        them eagerly)."""
        return self.plan_for(len(chunks), max(end - start for start, end in chunks), max(end for _, end in chunks))

    def plan_for(self, count: int, queries: int, context: int) -> tuple[int, int, int] | None:
        """`plan` for `count` chunks of at most `queries` new positions and `context` positions in all
        (memoised: the dispatcher asks for many candidate groups a step)."""
        pages = -(-context // self.block_size)
        memo_key = (count, queries, pages)
        if memo_key not in self._plans:
            if len(self._plans) >= 65536:             # exact values, not buckets: bound it
                self._plans.clear()
            self._plans[memo_key] = next(
                (key for key in self.shapes if key[0] >= count and key[1] >= queries and key[2] >= pages
                 and not (self.cuda_graphs and key not in self._graphs)), None)
        return self._plans[memo_key]

    # ---- one prefill --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, key: tuple[int, int, int], items: list[PrefillItem]) -> None:
        """Prefill the chunks with the graph of `key` (from `plan`)."""
        self._buffers()
        bsz, length, width = key
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
            n = item.end - item.start
            pos[i, length - n:] = range(item.start, item.end)
            mp[i, length - n:] = item.slot_mapping
            # Only the pages of positions [0, end): a prompt's first chunk already holds all of its pages.
            pages = item.block_table[:width]
            tb[i, :len(pages)] = pages
            ln[i] = item.end
            x[i, length - n:].copy_(item.embeds[item.start:item.end])
        for name, buf in self._dev.items():                 # only the prefix this shape reads
            buf[:used[name]].copy_(host[name], non_blocking=True)
        out = self._replay(key)
        self.model.prefill_outputs([(item.slot, item.last) for item in items], out[:len(items)])

    def _forward(self, bsz: int, length: int, width: int) -> torch.Tensor:
        """Each row's last position's hidden state [B, H] (its own tensor: the class docstring's output rule)."""
        d = self._dev
        kv = PagedKVContext(self.k_cache, self.v_cache, self.block_size, d["tables"][:bsz * width].view(bsz, width),
                            d["lens"][:bsz], d["mapping"][:bsz * length].view(bsz, length))
        hidden = self.model.prefill_forward(self._x[:bsz * length].view(bsz, length, -1),
                                            d["positions"][:bsz * length].view(bsz, length), kv)
        return hidden[:, -1].clone()

    # ---- CUDA graphs ------------------------------------------------------------------------------------------
    def _pad_only(self, key: tuple[int, int, int]) -> None:
        d = self._dev
        d["positions"].zero_()
        d["mapping"].fill_(self.scratch_slot)
        d["tables"].fill_(-1)
        d["lens"].fill_(1)
        self._x.zero_()
        bsz, _, width = key
        d["tables"][:bsz * width].view(bsz, width)[:, 0] = self.scratch_block

    @staticmethod
    def _capture_order(key: tuple[int, int, int]) -> tuple[int, int]:
        return -key[0] * key[1], -key[0] * key[2]              # positions, then gathered context

    def _captured(self) -> None:
        self._plans.clear()                       # plan_for's answers depend on which graphs exist
