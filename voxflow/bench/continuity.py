"""A simulated real-time player over one stream's chunk arrivals (definitions: shared/reference/benchmarking.md §1).

The player starts at the first audio chunk (t0, plus an optional jitter buffer) and plays at `bytes_per_s`.
Before chunk i arrives at t_i it has wanted `(t_i - t0 - buffer) * bytes_per_s` bytes but holds only the bytes
of chunks 0..i-1: the shortfall is the deficit (vLLM-Omni `compute_continuity_stats`). A request *underruns*
when some chunk arrives after the audio before it has finished playing (deficit > 0); its worst deficit in
seconds is `max_underrun_s`. VoxServe's "streaming viability" is the same test per chunk with no buffer:
chunk i >= 1 is viable when the audio of chunks 0..i-1 lasts longer than t_i - t0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

EPS_S = 1e-9


@dataclass
class Continuity:
    max_underrun_s: float          # worst deficit (0 = never ran dry)
    underrun_chunks: int           # chunks that arrived after the player ran dry
    viable_chunk_share: float      # VoxServe: share of chunks i >= 1 that were viable (1.0 for 0/1 chunk streams)
    all_viable: bool
    first_underrun_chunk: int | None = None     # index of the first chunk that arrived after the player ran dry

    @property
    def underrun(self) -> bool:
        return self.max_underrun_s > EPS_S


def simulate_player(times_s: Sequence[float], nbytes: Sequence[int], bytes_per_s: float,
                    jitter_buffer_s: float = 0.0) -> Continuity:
    """times_s: arrival times of audio-bearing chunks (any common origin, non-decreasing); nbytes: audio bytes
    of each. Returns the worst deficit in seconds of audio and the viability of the chunks."""
    if len(times_s) != len(nbytes):
        raise ValueError("times_s and nbytes differ in length")
    if bytes_per_s <= 0:
        raise ValueError("bytes_per_s must be > 0")
    if not times_s:
        return Continuity(0.0, 0, 1.0, True)
    t0 = times_s[0]
    received = 0
    worst = 0.0
    dry = viable = 0
    first = None
    for i, (t, n) in enumerate(zip(times_s, nbytes)):
        if i > 0:
            deficit = (t - t0 - jitter_buffer_s) * bytes_per_s - received
            if deficit > worst:
                worst = deficit
            if deficit > EPS_S * bytes_per_s:
                dry += 1
                if first is None:
                    first = i
            if received / bytes_per_s > t - t0:
                viable += 1
        received += n
    checked = len(times_s) - 1
    share = viable / checked if checked else 1.0
    return Continuity(max(0.0, worst) / bytes_per_s, dry, share, viable == checked, first)
