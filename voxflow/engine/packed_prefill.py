"""Packed prefill: a step's prompt chunks as ONE row of tokens, no padding between them, replayed from CUDA graphs.

Why: the padded prefill graphs (prefill_runner.py) hold a chunk per batch row, left-padded to a length bucket, and
cut a wave of prompts of mixed lengths into several replays: the H200 c=16 wave of 16 prompts (1,862 positions)
computed ~1.5-1.9x its positions and its prefill held the first frames back by ~45 ms. Packed, the chunks lie end to
end in T rows (T a token bucket), every GEMM runs once over all of them, and the only padding is up to T.

How: token t is a row of its own, shaped like a decode row (one query): its position, its KV slot, its context
length (position + 1: causal) and its chunk's block table. Each layer writes the K/V of ALL rows first
(`PagedKVContext.rows_share_sequences`: a row reads the K/V that earlier rows of its sequence wrote in the same
layer, so a fused write-then-read per row would race), then attends by query tiles of a chunk
(kernels/paged_prefill_attention.py: a tile of TILE_ROWS rows, 32 by default, reads each key page once; on a CPU
the reference path reads row by row). A chunk after a cached prefix reads the prefix from its pages; a chunk reading
pages that an earlier chunk of the same run writes reads them after that layer's writes. Runs keep the scheduler's order
(prefill_dispatch._packed), so a later run may read what an earlier one wrote.

Shapes: (T, W) for T in PACKED_TOKENS within the step's token budget and W (pages) a power of two up to the longest
context a request may have; a step no shape holds is cut into several runs, and a chunk none holds alone runs
eagerly. On a CPU the same packed forward runs eagerly (tests). The engine builds this runner only where the tiled
kernel runs (or on a CPU): the reference path's per-row gathers at these shapes would take GBs on a GPU.
"""
from __future__ import annotations

import numpy as np
import torch

from ..kernels.prefill_tiles import PrefillTiles, make_tiles, max_tiles
from .graph_runner import width_bucket
from .model_api import PagedKVContext
from .prefill_runner import GraphedPrefill, PrefillItem

# Packed step sizes (positions): powers of two up to 1024, then 512 apart up to 4096, the step budget's default
# (EngineConfig.max_num_batched_tokens). A step replays the smallest that holds its chunks, so the gap between sizes is
# padding computed for nothing: 16 new prompts of ~180 positions (2.2-3.1k) ran the 4096 graph, 11-14 ms against
# 6.7 for a full 2048 one (H200 session 26 call 3, 1.7B; HTTP c=16 first packet p50 62 -> 82 ms).
PACKED_TOKENS = (64, 128, 256, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 6144, 8192)
MIN_WIDTH = 4                       # pages (64 positions at pages of 16): the narrowest table captured
# T rows x W pages x block_size bounds the long-context shapes (T = 2048 takes contexts up to 2,048 positions, T = 256
# up to 16,384): each is a graph holding [T, W] row tables, and the CPU reference path gathers T x W x block_size
# keys a layer. The tiled kernel itself reads a context once per tile of rows (32 by default) and could take more.
MAX_KEY_POSITIONS = 1 << 22


class PackedPrefillRunner(GraphedPrefill):
    packed = True

    def __init__(self, model, k_cache, v_cache, block_size: int, scratch_block: int, max_tokens: int,
                 max_chunks: int, max_width: int, cuda_graphs: bool):
        super().__init__(model, k_cache, v_cache, block_size, scratch_block, cuda_graphs)
        top = next((t for t in PACKED_TOKENS if t >= max_tokens), 1 << (max_tokens - 1).bit_length())
        tokens = [t for t in PACKED_TOKENS if t < top] + [top]
        widths = []
        w = MIN_WIDTH
        while w < max_width:
            widths.append(w)
            w *= 2
        widths.append(width_bucket(max(max_width, 1)))
        self.shapes = sorted({(t, w) for t in tokens for w in widths if t * w * block_size <= MAX_KEY_POSITIONS}
                             | {(t, widths[0]) for t in tokens})
        self.max_chunks = max_chunks + 1                  # + the padding rows' scratch chunk

    def _make_buffers(self) -> None:
        tokens = max(t for t, _ in self.shapes)
        width = max(w for _, w in self.shapes)
        hidden, dtype = self.model.prefill_input_spec()
        zeros = lambda *shape: torch.zeros(shape, dtype=torch.long, device=self.device)    # noqa: E731
        self._dev = {"positions": zeros(tokens), "mapping": zeros(tokens), "lens": zeros(tokens),
                     "chunk_of": zeros(tokens), "tables": zeros(self.max_chunks * width),
                     "tiles": zeros(4 * max_tiles(tokens, self.max_chunks)),
                     "last": zeros(self.max_chunks)}              # each chunk's last row (padding: row 0)
        self._x = torch.zeros(tokens, hidden, dtype=dtype, device=self.device)

    # ---- which steps fit ---------------------------------------------------------------------------------------
    def plan(self, spans: list[tuple[int, int]]) -> tuple[int, int] | None:
        """(start, end) of each chunk -> the smallest (T, W) that holds them all, or None (too many or too long)."""
        if not spans or len(spans) >= self.max_chunks:
            return None
        total = sum(end - start for start, end in spans)
        pages = -(-max(end for _, end in spans) // self.block_size)
        return next(((t, w) for t, w in self.shapes if t >= total and w >= pages
                     and not (self.cuda_graphs and (t, w) not in self._graphs)), None)

    # ---- one prefill --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, key: tuple[int, int], items: list[PrefillItem]) -> None:
        """Prefill these chunks as one packed row of `key` = (T, W) from `plan`."""
        d = self._buffers()
        tokens, width = key
        cuda = self.device.type == "cuda"
        # Fresh pinned staging per run (the caching host allocator reuses a block only after its copies ran).
        host = {k: torch.empty(tokens, dtype=torch.long, pin_memory=cuda)
                for k in ("positions", "mapping", "lens", "chunk_of")}
        host["tables"] = torch.empty((len(items) + 1, width), dtype=torch.long, pin_memory=cuda)
        host["tiles"] = torch.empty((4, max_tiles(tokens, self.max_chunks)), dtype=torch.long, pin_memory=cuda)
        host["last"] = torch.zeros(self.max_chunks, dtype=torch.long, pin_memory=cuda)
        make_tiles([(item.start, item.end) for item in items], host["tiles"].numpy())
        pos, mp, ln, of = (host[k].numpy() for k in ("positions", "mapping", "lens", "chunk_of"))
        tb = host["tables"].numpy()
        tb.fill(-1)
        pad = len(items)                                  # the padding rows' chunk: the scratch page only
        tb[pad, 0] = self.scratch_block
        pos.fill(0)
        mp.fill(self.scratch_slot)
        ln.fill(1)
        of.fill(pad)
        x = self._x
        at, last = 0, host["last"].numpy()
        for i, item in enumerate(items):
            n = item.end - item.start
            pos[at: at + n] = np.arange(item.start, item.end)
            mp[at: at + n] = item.slot_mapping
            ln[at: at + n] = np.arange(item.start + 1, item.end + 1)     # causal: up to and including itself
            of[at: at + n] = i
            pages = item.block_table[:width]
            tb[i, :len(pages)] = pages
            at += n
            last[i] = at - 1
        # The chunks' input rows end to end: one concatenation (a copy per chunk was a launch each on the engine
        # thread, 31 of them in a wave's first step at c=64)
        torch.cat([item.embeds[item.start:item.end] for item in items], out=x[:at])
        if at < tokens:
            x[at:tokens].zero_()
        for name in ("positions", "mapping", "lens", "chunk_of"):
            d[name][:tokens].copy_(host[name], non_blocking=True)
        d["tables"][: (len(items) + 1) * width].copy_(host["tables"].view(-1), non_blocking=True)
        d["tiles"][: host["tiles"].numel()].copy_(host["tiles"].view(-1), non_blocking=True)
        d["last"].copy_(host["last"], non_blocking=True)
        out = self._replay(key)
        self.model.prefill_outputs([(item.slot, item.last) for item in items], out[:len(items)])

    def _forward(self, tokens: int, width: int) -> torch.Tensor:
        """Each chunk's last row's hidden state [max_chunks, H], gathered inside the graph (GraphedPrefill's
        output rule; rows past the step's chunks read row 0 and are not used)."""
        d = self._dev
        chunk_tables = d["tables"][: self.max_chunks * width].view(self.max_chunks, width)
        if self.device.type == "cuda":
            # The tiled kernel reads chunk tables only (the engine builds this runner on a GPU only with kernels
            # on): the per-row tables keep their shape for the view, as a free broadcast.
            tables = chunk_tables[:1].expand(tokens, width)
        else:
            tables = chunk_tables.index_select(0, d["chunk_of"][:tokens])              # [T, W]: each row's chunk's
        tiles = d["tiles"][: 4 * max_tiles(tokens, self.max_chunks)].view(4, -1)
        kv = PagedKVContext(self.k_cache, self.v_cache, self.block_size, tables, d["lens"][:tokens],
                            d["mapping"][:tokens].view(tokens, 1), rows_share_sequences=True,
                            prefill_tiles=(chunk_tables, PrefillTiles(*tiles)))
        hidden = self.model.prefill_forward(self._x[:tokens].view(tokens, 1, -1),
                                            d["positions"][:tokens].view(tokens, 1), kv)
        return hidden[:, 0].index_select(0, d["last"])

    # ---- CUDA graphs ------------------------------------------------------------------------------------------
    def _pad_only(self, key: tuple[int, int]) -> None:
        d = self._dev
        d["positions"].zero_()
        d["mapping"].fill_(self.scratch_slot)
        d["lens"].fill_(1)
        d["chunk_of"].zero_()
        d["tiles"].zero_()                            # no tile: the attention computes nothing
        d["tables"].fill_(-1)
        d["tables"][0] = self.scratch_block           # chunk 0's table (row 0 of any width): the scratch page
        d["last"].zero_()
        self._x.zero_()

    @staticmethod
    def _capture_order(key: tuple[int, int]) -> tuple[int, int]:
        return -key[0], -key[1]
