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
"""
from __future__ import annotations

import hashlib

from .prompt import REF_TAIL_LEN, ROLE_LEN, TEXT_TAIL_LEN, Prompt


def content_key(obj) -> int:
    """A 63-bit content hash of repr(obj) (fits an int64)."""
    return int.from_bytes(hashlib.blake2b(repr(obj).encode(), digest_size=8).digest(), "little") >> 1


def _text(ids: list[int]) -> list[tuple]:
    group = content_key(tuple(ids))
    return [("T", group, int(i)) for i in ids]


def position_keys(prompt: Prompt, voice_key: int | None = None, num_ref_frames: int = 0) -> list[int]:
    """voice_key: VoiceClonePrompt.key of a Base prompt's voice (its x-vector and its num_ref_frames frames)."""
    bos, eos, pad = ("S", "bos"), ("S", "eos"), ("S", "pad")
    codec_ids = prompt.codec_ids
    c_pad, c_bos = ("C", codec_ids[-2]), ("C", codec_ids[-1])
    x_key = ("X", voice_key) if voice_key is not None else None

    # (text part, codec part) per position, in build_prompt's block order.
    rows: list[tuple] = []
    if prompt.instruct_ids:
        rows += [(t, None) for t in _text(prompt.instruct_ids)]
    rows += [(t, None) for t in _text(prompt.text_ids[:ROLE_LEN])]
    prefix = [("C", c) if c is not None else x_key for c in codec_ids[:-1]]     # codec_bos moves to the text block
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
        codec_seq = [c_bos] + [("F", voice_key, i) for i in range(num_ref_frames)]
        if layout == "icl_non_streaming":
            rows += [(t, c_pad) for t in text_seq] + [(pad, c) for c in codec_seq]
        else:
            text_seq = (text_seq + [pad] * len(codec_seq))[:len(codec_seq)]
            rows += list(zip(text_seq, codec_seq))
    else:
        raise ValueError(f"unknown prompt layout {layout!r}")

    if len(rows) != prompt.length:
        raise AssertionError(f"position keys cover {len(rows)} positions, the prompt has {prompt.length}")
    return [content_key(r) for r in rows]
