"""msgpack (de)serialisation of what crosses the API <-> engine-process boundary. No pickle on the wire.

A message is one msgpack frame: a list whose first item names its kind (see `process.py` for the kinds).
Dataclasses travel as dicts keyed by field name, so a field the other side does not know fails loudly
(`cls(**d)`) instead of shifting positions silently; PCM and reference audio travel as msgpack `bin`; an int
too large for msgpack as an ext type (`_BIG_INT`), so that every int arrives as the int it was.
Both sides run the same voxflow checkout, so there is no versioning.

Timestamps (`emitted_at`, `finished_at`, ...) are `time.monotonic()` of the engine process: on Linux that is
CLOCK_MONOTONIC, one clock for the whole host, so they compare directly with the API process's own.
"""
from __future__ import annotations

import dataclasses
import enum
import numbers
from typing import Any

import msgpack

from .request import (AudioChunk, FinalRecord, FinishReason, SamplingOptions, SpeechRequest, StreamingOptions,
                      Usage)

# Nested dataclass / enum fields, rebuilt on decode (everything else is a msgpack primitive already).
_NESTED: dict[type, dict[str, type]] = {
    SpeechRequest: {"sampling": SamplingOptions, "streaming": StreamingOptions},
    FinalRecord: {"usage": Usage, "reason": FinishReason},
}
_CHUNK, _FINAL = "c", "f"
# msgpack ext type of an int outside msgpack's own range [-2**63, 2**64): its two's-complement bytes, big-endian.
_BIG_INT = 1


def _to_dict(obj: Any) -> dict:
    """Shallow field dict; nested dataclasses become dicts, enums their value (no deep copy of PCM bytes,
    unlike dataclasses.asdict)."""
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            v = _to_dict(v)
        elif isinstance(v, enum.Enum):
            v = v.value
        out[f.name] = v
    return out


def _from_dict(cls: type, d: dict) -> Any:
    for name, sub in _NESTED.get(cls, {}).items():
        if name in d:
            d[name] = sub(d[name]) if issubclass(sub, enum.Enum) else _from_dict(sub, d[name])
    return cls(**d)


def encode_request(request: SpeechRequest) -> dict:
    return _to_dict(request)


def decode_request(d: dict) -> SpeechRequest:
    return _from_dict(SpeechRequest, d)


def encode_output(out: AudioChunk | FinalRecord) -> list:
    if isinstance(out, AudioChunk):
        return [_CHUNK, _to_dict(out)]
    if isinstance(out, FinalRecord):
        return [_FINAL, _to_dict(out)]
    raise TypeError(f"not an engine output: {type(out).__name__}")


def decode_output(item: list) -> AudioChunk | FinalRecord:
    tag, d = item
    if tag == _CHUNK:
        return AudioChunk(**d)
    if tag == _FINAL:
        return _from_dict(FinalRecord, d)
    raise ValueError(f"unknown output tag {tag!r}")


def _fallback(obj: Any) -> Any:
    # An int msgpack cannot hold (e.g. a request's top_k of 2**70), or a numpy int, arrives as the same int: it
    # used to become its repr, a string that then failed inside the engine's step and killed the engine process;
    # as an int the engine's own checks (request.check_options) refuse it, failing that request alone.
    if isinstance(obj, numbers.Integral):
        obj = int(obj)
        if -2 ** 63 <= obj < 2 ** 64:       # a numpy int: a plain one fits msgpack
            return obj
        return msgpack.ExtType(_BIG_INT, obj.to_bytes(obj.bit_length() // 8 + 1, "big", signed=True))
    # Otherwise only free-form dicts (engine stats, ready info) get here: an odd value must not kill the engine.
    if isinstance(obj, enum.Enum):
        return obj.value
    return repr(obj)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _BIG_INT:
        return int.from_bytes(data, "big", signed=True)
    return msgpack.ExtType(code, data)             # (msgpack's own default)


def pack(message: list) -> bytes:
    return msgpack.packb(message, use_bin_type=True, default=_fallback)


def unpack(frame: bytes) -> list:
    # strict_map_key=False: stats dicts may be keyed by ints (e.g. per-batch-size counters).
    return msgpack.unpackb(frame, raw=False, strict_map_key=False, ext_hook=_ext_hook)
