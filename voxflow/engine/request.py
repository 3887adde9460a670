"""What goes into the engine (a speech request) and what comes out (audio chunks, then one final record).

These are plain data: they cross the process boundary between the API server and the engine process
(msgpack), so they hold no tensors; PCM travels as bytes.
"""
from __future__ import annotations

import enum
import itertools
import math
import numbers
import time
import uuid
from dataclasses import dataclass, field

TASKS = ("custom_voice", "voice_design", "voice_clone")

# Bounds of the numeric options (check_options; the API's body model uses the same ones). Values past them mean
# nothing more than the bound itself, but they must not reach the model's int64 / float32 tensors: there a top_k of
# 2**63 raised inside the engine step and killed the engine process (an audit's one-request denial of service).
TOP_K_MAX = 2 ** 31 - 1            # any vocabulary is smaller; fits int32 kernel arguments
MAX_NEW_TOKENS_MAX = 2 ** 31 - 1   # the engine's max_model_len caps it far lower (add_requests)
CHUNK_FRAMES_MAX = 4096            # codec frames per chunk: 5.5 min at 12.5 Hz (larger: one chunk at the end)
SEED_MIN, SEED_MAX = -2 ** 63, 2 ** 64 - 1      # any 64-bit value, signed or not (torch's manual_seed range)
FLOAT_MAX = 3.4028234663852886e38  # float32's largest finite value: sampling floats live in float32 tensors


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


def _check_int(name: str, value, lo: int, hi: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer (got {type(value).__name__})")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi} (got {value})")


def _check_float(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number (got {type(value).__name__})")
    if not (math.isfinite(value) and abs(value) <= FLOAT_MAX):
        raise ValueError(f"{name} must be a finite number (got {value})")


def check_options(request: SpeechRequest) -> None:
    """ValueError (naming the field, as the API's 400 does) unless the request's numeric sampling / streaming
    options are of their type and within the bounds above. The engine checks every request it is given (the API
    checks them too, but the engine is also a library and the CLI's), so a bad value fails that request alone
    instead of raising inside a step. Model-specific rules (temperature > 0 when sampling, ...) are the model's."""
    s, st = request.sampling, request.streaming
    _check_int("seed", s.seed, SEED_MIN, SEED_MAX)
    _check_int("top_k", s.top_k, 0, TOP_K_MAX)
    _check_int("max_new_tokens", s.max_new_tokens, 1, MAX_NEW_TOKENS_MAX)
    for name in ("temperature", "top_p", "repetition_penalty"):
        _check_float(name, getattr(s, name))
    _check_int("initial_chunk_frames", st.initial_chunk_frames, 0, CHUNK_FRAMES_MAX)   # 0: as 1, as before
    _check_int("chunk_frames", st.chunk_frames, 0, CHUNK_FRAMES_MAX)


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
                                    # engine, seconds (live_request.TTFP_PARTS; the API's Server-Timing header shows it)


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
    ttfp_parts: dict | None = None         # where its first-audio latency went, seconds (live_request.TTFP_PARTS)


_counter = itertools.count()


def next_arrival() -> int:
    """Monotonic arrival order (ties in time are broken by this)."""
    return next(_counter)
