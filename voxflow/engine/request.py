"""What goes into the engine (a speech request) and what comes out (audio chunks, then one final record).

These are plain data: they cross the process boundary between the API server and the engine process
(msgpack), so they hold no tensors; PCM travels as bytes.
"""
from __future__ import annotations

import enum
import itertools
import time
import uuid
from dataclasses import dataclass, field

TASKS = ("custom_voice", "voice_design", "voice_clone")


@dataclass
class SamplingOptions:
    """Per-request sampling. None = the model's default (generation_config.json)."""
    seed: int | None = None
    greedy: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    ignore_eos: bool = False          # fixed-length mode for benchmarks with random weights


@dataclass
class StreamingOptions:
    stream: bool = True                        # False: decode the whole utterance in the fewest passes
    initial_chunk_frames: int | None = None    # None = chosen by the engine from current load
    chunk_frames: int | None = None            # None = the engine's configured regular chunk


@dataclass
class SpeechRequest:
    text: str
    task: str | None = None                    # custom_voice | voice_design | voice_clone; None = model's own
    voice: str | None = None                   # preset speaker, or the name of a stored (uploaded) voice
    instructions: str | None = None
    language: str | None = None                # None / "auto" = automatic
    ref_audio: bytes | None = None             # voice clone: float32 mono PCM at the model's rate (little-endian)
    ref_text: str | None = None
    x_vector_only: bool = False
    voice_clone_prompt: dict | None = None     # voice clone: a stored voice's prompt (TTSModel.make_voice), no
                                               # per-request encoding; used instead of ref_audio
    non_streaming_mode: bool | None = None     # prompt layout (model specific); None = model default
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    streaming: StreamingOptions = field(default_factory=StreamingOptions)
    pcm_format: str = "f32"                    # "f32" or "s16" for the chunks' PCM bytes
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


class FinishReason(str, enum.Enum):
    EOS = "eos"
    LENGTH = "length"
    ABORTED = "aborted"
    ERROR = "error"


@dataclass
class AudioChunk:
    request_id: str
    index: int                     # 0, 1, 2, ... per request
    pcm: bytes                     # mono PCM at `sample_rate`, format per request (f32 or s16 little-endian)
    sample_rate: int
    num_samples: int
    first_frame: int               # codec frames covered: [first_frame, first_frame + num_frames)
    num_frames: int
    emitted_at: float = field(default_factory=time.monotonic)
    ttfp_parts: dict | None = None  # a request's first chunk only: where its first-audio latency went inside the
                                    # engine, seconds (engine.TTFP_PARTS; the API's Server-Timing header shows it)


@dataclass
class Usage:
    prompt_tokens: int = 0
    frames: int = 0
    audio_seconds: float = 0.0


@dataclass
class FinalRecord:
    request_id: str
    reason: FinishReason
    usage: Usage = field(default_factory=Usage)
    error: str | None = None
    error_kind: str | None = None          # with ERROR: "invalid_request" (bad input: HTTP 400), "overloaded"
                                           # (queue full: 429/503), "engine_died", "internal"
    arrived_at: float = 0.0
    first_chunk_at: float | None = None
    finished_at: float = field(default_factory=time.monotonic)
    ttfp_parts: dict | None = None         # where its first-audio latency went, seconds (engine.TTFP_PARTS)


_counter = itertools.count()


def next_arrival() -> int:
    """Monotonic arrival order (ties in time are broken by this)."""
    return next(_counter)
