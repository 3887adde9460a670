"""The engine's bookkeeping of one request while it lives (`EngineCore.live`), and the split of its first-audio
latency that its marks give."""
from __future__ import annotations

from dataclasses import dataclass, field

from .model_api import PreparedRequest
from .request import FinishReason, SpeechRequest
from .sequence import Sequence

# First-audio latency, in order: building the prompt (tokenizer, voice, embeddings: before the request is queued; a
# burst's requests are built together, each waits for the whole batched build, add_requests),
# waiting + prefill (until the host has launched its last prefill chunk), until its first frame is read back (the
# first decode step(s), with the prefill's GPU work), until its first PCM chunk is out (the codec).
TTFP_PARTS = ("prepare", "queue_and_prefill", "first_frame", "first_chunk")


@dataclass(eq=False)
class LiveRequest:
    """Engine-side bookkeeping of one request."""
    request: SpeechRequest
    prepared: PreparedRequest
    seq: Sequence
    arrived_at: float
    attached: bool = False
    talker_done: bool = False          # its last frame is known; KV blocks and slot given back
    frames_out: int = 0
    samples_out: int = 0
    chunks_out: int = 0
    first_chunk_at: float | None = None
    prepare_seconds: float = 0.0
    prefilled_at: float | None = None      # the host finished launching its last prefill chunk
    first_frame_at: float | None = None    # its first frame was read back (or its first chunk came first)
    last_frame_queued: bool = False        # its last frame by length went to the codec with its step
    finish_reason: FinishReason | None = None
    extra: dict = field(default_factory=dict)


def ttfp_parts_of(live: LiveRequest) -> dict | None:
    """This request's first-audio latency split into TTFP_PARTS, seconds (host clock; the GPU's work shows up in the
    part whose host wait covered it; a request preempted before its first audio counts from its first try). None
    before its first audio."""
    marks = (live.arrived_at, live.prefilled_at, live.first_frame_at, live.first_chunk_at)
    if any(m is None for m in marks):
        return None
    parts = (live.prepare_seconds, marks[1] - marks[0], marks[2] - marks[1], marks[3] - marks[2])
    return {name: max(0.0, value) for name, value in zip(TTFP_PARTS, parts)}
