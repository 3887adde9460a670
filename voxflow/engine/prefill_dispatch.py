"""How a step's prefill chunks run, in the scheduler's order (a chunk may reuse prefix pages an earlier chunk of the
same step computes: block_manager's ordering rule).

With the prefill runner (CUDA graphs, prefill_runner.py): the chunks are cut into runs of consecutive chunks, each
replayed from one graph, and a chunk no graph fits runs eagerly in its place; when no chunk reads a page another
one writes in this step, they go shortest first, so that similar lengths share a bucket. The cut is the cheapest
one (dynamic programming over the cut points): a graph costs its padded positions (batch x length bucket) plus a
fixed REPLAY_COST for its ~700 kernels. Filling each graph greedily instead, as before, padded a wave of 16 fresh
prompts of the bench set to 2.2x their positions, the cheapest cut to 1.5x (plus replays: 2.4x -> 1.9x at 128
positions a replay; simulated on the tiny BPE's prompt lengths). Without it: one eager talker forward for all
chunks when the model can (`prefill_batch`), else one forward per chunk. With the packed runner
(`EngineConfig.packed_prefill`, packed_prefill.py) the chunks run end to end, unpadded, usually in one replay.

A pair is (scheduler.PrefillChunk, the sequence's input embeddings from position 0).
"""
from __future__ import annotations

import torch

from .host_to_device import tensor_to, to_device
from .model_api import PagedKVContext
from .prefill_runner import PrefillItem

# The cost model of cheapest_runs, in padded prompt positions: a graph replay's fixed GPU time (its ~700 kernels)
# taken as 128 positions of work (an assumption: not measured yet), and an eager forward as far more (its launches
# cost ~35 ms of host time on an H200).
REPLAY_COST = 128
EAGER_COST = 100_000
EXACT_MAX_CHUNKS = 16          # more chunks in a step: graphs filled in turn (cheapest_runs)


class PrefillDispatch:
    def __init__(self, model, k_cache, v_cache, block_manager, block_size: int, scratch_slot: int, runner,
                 batch_prefill: bool):
        self.model, self.k_cache, self.v_cache = model, k_cache, v_cache
        self.block_manager, self.block_size, self.scratch_slot = block_manager, block_size, scratch_slot
        self.runner, self.batch_prefill = runner, batch_prefill
        self.graph_runs = self.eager_runs = 0        # graph replays and eager forwards so far (the step trace's)

    def run(self, pairs) -> None:
        if getattr(self.runner, "packed", False):
            self._packed(pairs)
        elif self.runner is not None and (len(pairs) == 1 or self.batch_prefill):
            self._through_graphs(pairs)
        elif len(pairs) > 1 and self.batch_prefill and hasattr(self.model, "prefill_batch"):
            self._eager_batch(pairs)
        else:
            for pair in pairs:
                self._eager(*pair)

    def _through_graphs(self, pairs) -> None:
        """Runs of consecutive chunks, each replayed from one graph (a wave of prompts of mixed lengths needs
        short-prompt graphs and long-prompt ones: no single bucket fits the step's budget)."""
        if self.independent([c for c, _ in pairs]):
            pairs = sorted(pairs, key=lambda p: p[0].end - p[0].start)     # similar lengths share a bucket
        self._run(pairs, self.cheapest_runs([(c.start, c.end) for c, _ in pairs]))

    def _packed(self, pairs) -> None:
        """The step's chunks end to end in packed runs (packed_prefill.py), in the scheduler's order: one run when
        a shape holds them all (the usual case: the step's token budget is the largest T), else each run grown while
        one does; a chunk that no shape holds alone runs eagerly."""
        self._run(pairs, self._filled_runs([(c.start, c.end) for c, _ in pairs]))

    def _run(self, pairs, runs: list[tuple[tuple | None, list[int]]]) -> None:
        for key, group in runs:
            if key is None:
                self._eager(*pairs[group[0]])
            else:
                self._graph(key, [pairs[i] for i in group])

    def cheapest_runs(self, spans: list[tuple[int, int]]) -> list[tuple[tuple | None, list[int]]]:
        """(start, end) chunks in order -> runs of consecutive chunk indices, each with the graph that holds it
        (None: one chunk that no graph holds, run eagerly), of least total cost (see the module docstring).

        The search is quadratic in Python (~4.6 ms for 64 chunks on this CPU, 0.14 ms for 16): past
        EXACT_MAX_CHUNKS each graph is filled in turn instead. A step holds that many chunks only when they are
        short (the token budget is shared: prefix-cache hits), and short chunks of one length bucket lose little
        to a greedy fill."""
        n = len(spans)
        if n > EXACT_MAX_CHUNKS:
            return self._filled_runs(spans)
        best = [0.0] + [float("inf")] * n             # best[j]: cheapest way to run spans[:j]
        choice: list[tuple[int, tuple | None]] = [(0, None)] * (n + 1)
        for j in range(1, n + 1):
            queries = context = 0
            for i in range(j - 1, -1, -1):            # the last run is spans[i:j], grown leftwards
                start, end = spans[i]
                queries, context = max(queries, end - start), max(context, end)
                key = self.runner.plan_for(j - i, queries, context)
                if key is None:
                    if i == j - 1:                    # alone and still too large: eagerly
                        cost = best[i] + EAGER_COST + (end - start)
                        if cost < best[j]:
                            best[j], choice[j] = cost, (i, None)
                    break                             # a larger run only needs a larger graph
                cost = best[i] + key[0] * key[1] + REPLAY_COST
                if cost < best[j]:
                    best[j], choice[j] = cost, (i, key)
        runs = []
        j = n
        while j > 0:
            i, key = choice[j]
            runs.append((key, list(range(i, j))))
            j = i
        return runs[::-1]

    def _filled_runs(self, spans: list[tuple[int, int]]) -> list[tuple[tuple | None, list[int]]]:
        """Runs made by growing each one while the runner has a graph that holds it (None: a chunk none holds)."""
        runs: list[tuple[tuple | None, list[int]]] = []
        for i, span in enumerate(spans):
            if runs and runs[-1][0] is not None:
                group = runs[-1][1] + [i]
                grown = self.runner.plan([spans[j] for j in group])
                if grown is not None:
                    runs[-1] = (grown, group)
                    continue
            runs.append((self.runner.plan([span]), [i]))
        return runs

    def independent(self, chunks) -> bool:
        """No chunk reads a page (of its cached prefix) that an earlier chunk of this step writes: any order works."""
        bs, written = self.block_size, set()
        for c in chunks:
            table = c.seq.block_table
            if c.start and not written.isdisjoint(table[: -(-c.start // bs)]):
                return False
            written.update(table[c.start // bs: -(-c.end // bs)])
        return True

    def _graph(self, key, pairs) -> None:
        self.graph_runs += 1
        bm = self.block_manager
        self.runner.run(key, [
            PrefillItem(c.seq.slot, e, c.start, c.end, c.seq.block_table, bm.slot_mapping(c.seq, c.start, c.end),
                        c.is_last) for c, e in pairs])

    def _eager_batch(self, pairs) -> None:
        self.eager_runs += 1
        bm = self.block_manager
        chunks = [c for c, _ in pairs]
        size = max(c.end - c.start for c in chunks)
        # Left padding of shorter chunks writes its (unused) K/V into the scratch page.
        mapping = [[self.scratch_slot] * (size - (c.end - c.start)) + bm.slot_mapping(c.seq, c.start, c.end)
                   for c in chunks]
        kv = self._kv([c.seq.block_table for c in chunks], [c.end for c in chunks], mapping)
        self.model.prefill_batch([(c.seq.slot, e[c.start:c.end], c.start, c.is_last) for c, e in pairs], kv)

    def _eager(self, c, e) -> None:
        self.eager_runs += 1
        kv = self._kv([c.seq.block_table], [c.end], [self.block_manager.slot_mapping(c.seq, c.start, c.end)])
        self.model.prefill(c.seq.slot, e[c.start:c.end], c.start, kv, c.is_last)

    def _kv(self, block_tables: list[list[int]], context_lens: list[int], slot_mapping: list[list[int]]):
        # Table width rounded up to a power of two: a few static shapes instead of one per block boundary.
        width = max(len(t) for t in block_tables)
        width = 1 << (width - 1).bit_length()
        tables = torch.full((len(block_tables), width), -1, dtype=torch.long)
        for i, t in enumerate(block_tables):
            tables[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        device = self.model.device
        # Non-blocking copies: a blocking one would wait for the decode step in flight (host_to_device.py).
        return PagedKVContext(self.k_cache, self.v_cache, self.block_size, to_device(tables, device),
                              tensor_to(context_lens, device), tensor_to(slot_mapping, device))
