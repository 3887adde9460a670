"""Continuous batching for TTS: every step decodes one position for each running sequence and spends the rest
of the token budget on (chunked) prefills.

The engine's loop:

    out = scheduler.schedule()            # commits the step: blocks, positions and frame counts advance now
    run out.prefill chunks in order, then out.decode as one batch   (see block_manager's ordering rule)
    scheduler.finish(seq)                 # when the model says a sequence is done (may be a step late)
    scheduler.abort(request_id)           # between steps

Positions per sequence are contiguous: a prefill chunk (seq, start, end, last) writes [start, end) and reads
[0, end); a decode writes position `seq.num_computed - 1` (context length `seq.num_computed`).

Memory pressure: when the decodes cannot all get a position, the most recently arrived block holders (running or
prefilling) are preempted (blocks freed, slot and frames kept) and go back to the front of the queue; on
resumption they re-prefill prompt + fed-back frames (prompt blocks usually come straight from the prefix cache).
The oldest sequence is never preempted while others hold blocks, so the oldest always progresses; sequences that
could not fit even alone in the whole pool are rejected at `add`.

With `reserve_frames` > 0, admission also keeps room for growth: a sequence is admitted only when the free blocks
cover its prompt plus every block holder's growth up to `reserve_frames` more frames (each capped at its
max_frames), its own included. A pool too small for the whole batch then queues requests instead of admitting them
and preempting them later (a preemption re-prefills the prompt and the frames so far, and the request finishes late:
benchmarks/results/h200/2026-12-03-session18, call 2). Growth past the reservation is still met by preemption.
"""
from __future__ import annotations

import bisect
import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from .block_manager import BlockManager, blocks_for
from .sequence import SeqStatus, Sequence


@dataclass
class SchedulerConfig:
    max_num_seqs: int                      # sequences holding a model slot (running + prefilling + preempted)
    max_num_batched_tokens: int            # positions computed per step: decodes + prefill chunks
    prefill_chunk_size: int | None = None  # most prefill positions of one sequence per step (None: budget only)
    reserve_frames: int = 0                # admission keeps room for this many more frames a holder (0: none)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens <= self.max_num_seqs:
            # Otherwise a full decode batch could take the whole budget and starve prefills forever.
            raise ValueError("max_num_batched_tokens must exceed max_num_seqs")
        if self.prefill_chunk_size is not None and self.prefill_chunk_size < 1:
            raise ValueError("prefill_chunk_size must be >= 1")
        if self.reserve_frames < 0:
            raise ValueError("reserve_frames must be >= 0")


class PrefillChunk(NamedTuple):
    seq: Sequence
    start: int
    end: int
    is_last: bool          # the chunk completes the prefill: the model samples (or, resuming, restores) c0


class Rejection(NamedTuple):
    seq: Sequence
    reason: str


@dataclass
class SchedulerOutput:
    decode: list[Sequence] = field(default_factory=list)
    prefill: list[PrefillChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)   # the engine detaches nothing: slots are kept
    rejected: list[Rejection] = field(default_factory=list)   # finished with an error, never ran

    @property
    def num_tokens(self) -> int:
        return len(self.decode) + sum(c.end - c.start for c in self.prefill)

    @property
    def is_empty(self) -> bool:
        return not (self.decode or self.prefill or self.preempted or self.rejected)


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.bm = block_manager
        self._waiting: deque[Sequence] = deque()       # never admitted, in arrival order of `add`
        self._preempted: list[Sequence] = []           # sorted by arrival; resumed before new admissions
        self._prefilling: list[Sequence] = []          # admitted, prefill chunks pending; admission order
        self._running: list[Sequence] = []             # decoding
        self._live: dict[str, Sequence] = {}
        self._rejected: list[Rejection] = []
        self._free_slots = list(range(config.max_num_seqs))   # min-heap: low slots first (compact batches)
        # Prompt positions of first admissions, and how many of them the prefix cache already held (a benchmark
        # that repeats prompts against one server measures cache hits: its report says how many).
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0

    # ---- metrics ----------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._preempted)

    @property
    def num_running(self) -> int:
        return len(self._running) + len(self._prefilling)

    @property
    def num_preempted(self) -> int:
        return len(self._preempted)

    def kv_usage(self) -> float:
        return self.bm.usage()

    def has_unfinished(self) -> bool:
        return bool(self._live or self._rejected)

    def get(self, request_id: str) -> Sequence | None:
        return self._live.get(request_id)

    # ---- requests in / out ------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if seq.request_id in self._live:
            raise ValueError(f"request {seq.request_id!r} is already scheduled")
        assert seq.status is SeqStatus.WAITING and not seq.block_table, seq
        reason = self._why_never_fits(seq)
        if reason:
            seq.status = SeqStatus.FINISHED
            self._rejected.append(Rejection(seq, reason))
            return
        self._live[seq.request_id] = seq
        self._waiting.append(seq)

    def _why_never_fits(self, seq: Sequence) -> str | None:
        if seq.prompt_len == 0:
            return "empty prompt"
        if seq.max_frames < 1:
            return f"max_frames must be >= 1, got {seq.max_frames}"
        # Everything it may ever hold must fit alone in the pool, or growing it could need itself preempted.
        need = blocks_for(seq.max_positions, self.bm.block_size)
        if need > self.bm.num_blocks:
            return (f"request needs up to {seq.max_positions} KV positions (prompt {seq.prompt_len} + "
                    f"{seq.max_frames} frames) but the cache holds {self.bm.max_positions()}; "
                    f"shorten the input or lower max_new_tokens")
        return None

    def abort(self, request_id: str) -> Sequence | None:
        """Drop a request in whatever state; its blocks and slot are free at once."""
        seq = self._live.get(request_id)
        if seq is not None:
            self._retire(seq)
        return seq

    def finish(self, seq: Sequence) -> None:
        """The model finished the sequence (whatever its state now, e.g. preempted since). Prompt blocks stay in
        the prefix cache."""
        if self._live.get(seq.request_id) is seq:
            self._retire(seq)

    def _retire(self, seq: Sequence) -> None:
        del self._live[seq.request_id]
        if seq.status is SeqStatus.WAITING:
            self._waiting.remove(seq)
        elif seq.status is SeqStatus.PREEMPTED:
            self._preempted.remove(seq)
        elif seq.status is SeqStatus.PREFILLING:
            self._prefilling.remove(seq)
        elif seq.status is SeqStatus.RUNNING:
            self._running.remove(seq)
        self.bm.free(seq)
        if seq.slot is not None:
            heapq.heappush(self._free_slots, seq.slot)
            seq.slot = None
        seq.status = SeqStatus.FINISHED

    # ---- one step ---------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(rejected=self._rejected)
        self._rejected = []
        self._schedule_decodes(out)
        # After a preemption the freed blocks are the decodes' margin: admitting now would just re-prefill a
        # sequence that the next block boundary preempts again.
        admit = not out.preempted
        self._schedule_prefills(out, self.config.max_num_batched_tokens - len(out.decode), admit)
        return out

    def _schedule_decodes(self, out: SchedulerOutput) -> None:
        # Sequences at max_frames wait for the engine's finish() and take no step.
        pending = sorted((s for s in self._running if s.num_frames < s.max_frames), key=lambda s: s.arrival)
        pending.reverse()                        # pop() yields the oldest first
        while pending:
            seq = pending.pop()
            while not self.bm.can_append((seq,)):
                # Newest block holder goes first; `seq` itself if it is the newest.
                victim = max([seq, *pending, *self._prefilling], key=lambda s: s.arrival)
                if victim in pending:
                    pending.remove(victim)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                self.bm.append_slot(seq)
                self.bm.mark_computed(seq, seq.num_computed + 1)
                seq.num_frames += 1
                out.decode.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        if seq.status is SeqStatus.RUNNING:
            self._running.remove(seq)
        else:
            self._prefilling.remove(seq)
        self.bm.free(seq)
        seq.status = SeqStatus.PREEMPTED
        seq.num_prefill_target = seq.prompt_len + seq.num_frames
        seq.num_preemptions += 1
        bisect.insort(self._preempted, seq, key=lambda s: s.arrival)

    def _schedule_prefills(self, out: SchedulerOutput, budget: int, admit: bool) -> None:
        for seq in sorted(self._prefilling, key=lambda s: s.arrival):
            if budget <= 0:
                return
            budget -= self._prefill_chunk(seq, budget, out)
        if not admit:
            return
        # Blocks kept for the holders' growth (reserve_frames; 0 without a reservation, not summed then).
        reserved = sum(map(self._growth_blocks, (*self._running, *self._prefilling))) \
            if self.config.reserve_frames else 0
        # Admissions in order; stop at the first that cannot go (no skipping: big prompts are not starved).
        for queue in (self._preempted, self._waiting):
            while queue and budget > 0:
                seq = queue[0]
                if seq.slot is None and not self._free_slots:
                    return
                # Its prompt's blocks (bm.can_allocate's test) plus every reservation, its own included.
                growth = self._growth_blocks(seq, admitted=False)
                if reserved + growth + self.bm.allocation_cost(seq) > self.bm.num_free_blocks:
                    return
                reserved += growth
                first = queue is self._waiting
                if first:
                    self._waiting.popleft()
                else:
                    self._preempted.pop(0)
                cached = self.bm.allocate(seq)
                if first:
                    self.prompt_tokens += seq.prompt_len
                    self.prompt_tokens_cached += cached          # (cache hits stop before the prompt's end)
                if seq.slot is None:
                    seq.slot = heapq.heappop(self._free_slots)
                seq.status = SeqStatus.PREFILLING
                self._prefilling.append(seq)
                budget -= self._prefill_chunk(seq, budget, out)

    def _growth_blocks(self, seq: Sequence, admitted: bool = True) -> int:
        """Blocks beyond what `seq` holds (or, not yet admitted, what its prefill target takes) that its next
        `reserve_frames` frames may need, capped at its max_frames."""
        if not self.config.reserve_frames:
            return 0
        frames = min(seq.max_frames, seq.num_frames + self.config.reserve_frames)
        held = len(seq.block_table) if admitted else blocks_for(seq.num_prefill_target, self.bm.block_size)
        return max(0, blocks_for(seq.prompt_len + frames, self.bm.block_size) - held)

    def _prefill_chunk(self, seq: Sequence, budget: int, out: SchedulerOutput) -> int:
        size = min(seq.num_prefill_remaining, budget, self.config.prefill_chunk_size or budget)
        start, end = seq.num_computed, seq.num_computed + size
        self.bm.mark_computed(seq, end)
        last = end == seq.num_prefill_target
        out.prefill.append(PrefillChunk(seq, start, end, last))
        if last:
            seq.status = SeqStatus.RUNNING
            self._prefilling.remove(seq)
            self._running.append(seq)
        return size
