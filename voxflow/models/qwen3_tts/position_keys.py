"""Content keys of prompt positions, for prefix caching: one 64-bit hash per talker prompt position, derived
from everything that determines that position's embedding, so that equal keys imply equal embeddings.

A prompt position is the sum of a text part and a codec part (prompt.py). The keys describe them as:
    text part   ("T", group, id): a text id embedded in a call over the ids `group` (build_prompt embeds
                text in groups — instruction, role, text body — and a GEMM's rounding can depend on its row
                count, so the group is part of the identity; the fixed special rows are ("S", name))
    codec part  ("C", id) a codec-table row, ("X", voice key) the x-vector, ("F", voice key, i) reference frame i
                (the voice key is VoiceClonePrompt.key, a hash of the host data the voice was computed from: the
                tensors themselves live on the device and reading them back would stall the host)
The layout walk below mirrors build_prompt block by block; `position_keys` checks the count against the
prompt's length. Keys are in [0, 2^63) so that they fit an int64 tensor.

Speed: a prompt build runs on the engine thread for every request (a wave of 16-64 arrivals is built back to back
before their prefill), and one blake2b of repr() per position cost ~0.7 ms a 150-position prompt. So blake2b
hashes only what is few (a text group's ids, a special or codec row, a voice), and positions are derived from
those with the splitmix64 finalizer (a bijection of 64-bit words) in numpy: a text position is
mix(group ^ id * odd), distinct for distinct ids of one group; a reference frame mix(voice ^ i * odd); a position
mix(mix(text) * odd ^ codec). Equal parts give equal keys; unequal ones collide with probability ~2^-63.
"""
from __future__ import annotations

import functools
import hashlib

import numpy as np

from .prompt import REF_TAIL_LEN, ROLE_LEN, TEXT_TAIL_LEN, Prompt

_ODD = np.uint64(0x9E3779B97F4A7C15)
_NONE = 0x2545F4914F6CDD1D            # the part of a position that has no codec row (text-only blocks)


def content_key(obj) -> int:
    """A 63-bit content hash of repr(obj) (fits an int64)."""
    return int.from_bytes(hashlib.blake2b(repr(obj).encode(), digest_size=8).digest(), "little") >> 1


_part_key = functools.lru_cache(maxsize=4096)(content_key)   # special rows, codec rows, voices: few, repeated


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 words (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _indexed(base: int, index: np.ndarray) -> list[int]:
    return _mix(np.uint64(base) ^ index.astype(np.uint64) * _ODD).tolist()


def _text(ids: list[int]) -> list[int]:
    """Keys of text ids embedded in one call (the group is part of their identity, see above)."""
    return _indexed(content_key(("T", tuple(ids))), np.asarray(ids, dtype=np.int64))


def position_keys(prompt: Prompt, voice_key: int | None = None, num_ref_frames: int = 0) -> list[int]:
    """voice_key: VoiceClonePrompt.key of a Base prompt's voice (its x-vector and its num_ref_frames frames)."""
    bos, eos, pad = (_part_key(("S", name)) for name in ("bos", "eos", "pad"))
    codec_ids = prompt.codec_ids
    if voice_key is None and (None in codec_ids or prompt.layout.startswith("icl")):
        # Without it every voice would get the same keys: another voice's cached prompt would be served.
        raise ValueError("a prompt with a voice (x-vector or reference frames) needs its voice_key")
    c_pad, c_bos = _part_key(("C", codec_ids[-2])), _part_key(("C", codec_ids[-1]))
    x_key = _part_key(("X", voice_key))

    # (text part, codec part) per position, in build_prompt's block order.
    rows: list[tuple] = []
    if prompt.instruct_ids:
        rows += [(t, _NONE) for t in _text(prompt.instruct_ids)]
    rows += [(t, _NONE) for t in _text(prompt.text_ids[:ROLE_LEN])]
    prefix = [_part_key(("C", c)) if c is not None else x_key for c in codec_ids[:-1]]   # codec_bos: text block
    rows += [(pad, c) for c in prefix[:-1]] + [(bos, prefix[-1])]

    body = prompt.text_ids[ROLE_LEN:-TEXT_TAIL_LEN]
    layout = prompt.layout
    if layout == "non_streaming":
        rows += [(t, c_pad) for t in _text(body) + [eos]] + [(pad, c_bos)]
    elif layout == "streaming":
        rows += [(_text(body[:1])[0], c_bos)]
    elif layout in ("icl_streaming", "icl_non_streaming"):
        ref_body = prompt.ref_ids[ROLE_LEN:-REF_TAIL_LEN]
        text_seq = _text(ref_body + body) + [eos]
        codec_seq = [c_bos] + _indexed(_part_key(("F", voice_key)), np.arange(num_ref_frames))
        if layout == "icl_non_streaming":
            rows += [(t, c_pad) for t in text_seq] + [(pad, c) for c in codec_seq]
        else:
            text_seq = (text_seq + [pad] * len(codec_seq))[:len(codec_seq)]
            rows += list(zip(text_seq, codec_seq))
    else:
        raise ValueError(f"unknown prompt layout {layout!r}")

    if len(rows) != prompt.length:
        raise AssertionError(f"position keys cover {len(rows)} positions, the prompt has {prompt.length}")
    text, codec = np.array(rows, dtype=np.uint64).reshape(-1, 2).T
    return (_mix(_mix(text) * _ODD ^ codec) >> np.uint64(1)).tolist()
