"""Engine-side state of one request while the scheduler and the block manager handle it.

Positions: a sequence's KV cache holds its P prompt positions, then one position per frame fed back (every decode
call completes one frame and feeds it back as the next position). So while decoding,
`num_computed == prompt_len + num_frames`, and a sequence never holds more than `prompt_len + max_frames` positions.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .request import next_arrival


class SeqStatus(enum.Enum):
    WAITING = "waiting"          # never admitted; holds no blocks and no slot
    PREFILLING = "prefilling"    # holds blocks for its whole prefill target; chunks still to run
    RUNNING = "running"          # prefill done; one decode step (one position, one frame) per engine step
    PREEMPTED = "preempted"      # blocks given back, slot and frames kept; re-prefills P + frames on resumption
    FINISHED = "finished"        # finished, aborted or rejected; holds nothing


@dataclass(eq=False)  # identity semantics: a sequence is a live object, two are never "equal"
class Sequence:
    request_id: str
    position_keys: list[int]          # P content keys (model-provided): equal key prefixes <=> equal KV prefixes
    max_frames: int
    arrival: int = field(default_factory=next_arrival)
    payload: Any = None               # the engine's own per-request data (e.g. the PreparedRequest)

    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0             # positions whose KV is (or, once this step runs, will be) in the cache
    num_prefill_target: int = 0       # positions to prefill: P, or P + frames fed back after a preemption
    num_frames: int = 0               # frames produced (== frames fed back into the KV cache)
    block_table: list[int] = field(default_factory=list)
    slot: int | None = None           # the model's persistent slot; kept across preemptions
    num_cached: int = 0               # positions reused from the prefix cache at the last admission
    num_preemptions: int = 0          # > 0: the engine must re-prefill with the model's resume embeddings
    block_hashes: list[bytes] = field(default_factory=list)  # hashes of full prompt blocks (block manager's)

    def __post_init__(self) -> None:
        self.position_keys = list(self.position_keys)
        self.num_prefill_target = len(self.position_keys)

    @classmethod
    def from_prepared(cls, prepared: Any) -> "Sequence":
        """From a `model_api.PreparedRequest` (kept as the payload)."""
        return cls(prepared.request_id, prepared.position_keys, prepared.max_frames, payload=prepared)

    @property
    def prompt_len(self) -> int:
        return len(self.position_keys)

    @property
    def max_positions(self) -> int:
        """The most positions this sequence can ever hold in the KV cache."""
        return self.prompt_len + self.max_frames

    @property
    def num_prefill_remaining(self) -> int:
        return self.num_prefill_target - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, P={self.prompt_len}, "
                f"computed={self.num_computed}/{self.num_prefill_target}, frames={self.num_frames}/"
                f"{self.max_frames}, blocks={len(self.block_table)}, slot={self.slot})")
