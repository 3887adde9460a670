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
hashes only what is few (a text group's ids (their bytes), a special or codec row, a voice), and positions are
derived from those with the splitmix64 finalizer (a bijection of 64-bit words) in numpy: a text position is
mix(group ^ id * odd), distinct for distinct ids of one group; a reference frame mix(voice ^ i * odd); a position
mix(mix(text) * odd ^ codec). Equal parts give equal keys; unequal ones collide with probability ~2^-63. A burst of
prompts is keyed together (`position_keys_many`: a few list operations a prompt, two numpy passes for all; ~76 ->
~25 us a 143-position prompt on this project's CPU, benchmarks/results/cpu/2026-12-06-position-keys/).
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


def _group_key(ids_bytes) -> int:
    """A text group's 63-bit key from its ids' bytes (uint64 each): blake2b as content_key, without a repr."""
    return int.from_bytes(hashlib.blake2b(ids_bytes, digest_size=8, person=b"text ids").digest(), "little") >> 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 words (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _indexed(base: int, index: np.ndarray) -> list[int]:
    return _mix(np.uint64(base) ^ index.astype(np.uint64) * _ODD).tolist()


def position_keys(prompt: Prompt, voice_key: int | None = None, num_ref_frames: int = 0) -> list[int]:
    """voice_key: VoiceClonePrompt.key of a Base prompt's voice (its x-vector and its num_ref_frames frames)."""
    result = position_keys_many([(prompt, voice_key, num_ref_frames)])[0]
    if isinstance(result, Exception):
        raise result
    return result


def position_keys_many(items: list[tuple[Prompt, int | None, int]]) -> list[list[int] | Exception]:
    """`position_keys` of a burst of (prompt, voice_key, num_ref_frames): each prompt's keys (the same values as
    alone) or its error in its place. Why batched: a prompt's ~150 keys one by one cost ~0.1-0.2 ms of the engine
    thread (numpy calls on tiny arrays, a tuple a position); here each prompt is a few list operations and the
    whole burst two numpy passes."""
    out: list = [None] * len(items)
    plans = {}
    for i, item in enumerate(items):
        try:
            plans[i] = _plan(*item)
        except (ValueError, AssertionError) as e:
            out[i] = e
    # The text groups' keys first (each position of a group is mix(group ^ id * odd)), all groups in one pass.
    groups = [g for plan in plans.values() for g in plan[0]]
    if groups:
        ids = []
        for g in groups:
            ids += g
        ids = np.array(ids, dtype=np.uint64)
        raw, ends = memoryview(ids.view(np.uint8)), np.cumsum([len(g) * 8 for g in groups]).tolist()
        bases = np.repeat(np.array([_group_key(raw[a:b]) for a, b in zip([0] + ends, ends)], dtype=np.uint64),
                          [len(g) for g in groups])
        flat = _mix(bases ^ ids * _ODD).tolist()
    at, texts, codecs, spans = 0, [], [], {}
    for i, (groups, parts, length) in plans.items():
        keys = []
        for g in groups:
            keys.append(flat[at:at + len(g)])
            at += len(g)
        text, codec = parts(keys)
        if len(text) != length or len(codec) != length:
            out[i] = AssertionError(f"position keys cover {len(text)} text / {len(codec)} codec positions, the "
                                    f"prompt has {length}")
            continue
        spans[i] = (len(texts), len(texts) + length)
        texts += text
        codecs += codec
    if spans:
        text, codec = np.array(texts, dtype=np.uint64), np.array(codecs, dtype=np.uint64)
        every = (_mix(_mix(text) * _ODD ^ codec) >> np.uint64(1)).tolist()
        for i, (a, b) in spans.items():
            out[i] = every[a:b]
    return out


def _plan(prompt: Prompt, voice_key: int | None, num_ref_frames: int):
    """A prompt's text groups (lists of ids) and a function of their keys -> its positions' (text parts, codec
    parts) as two lists, in build_prompt's block order; and the prompt's length, which both lists must have."""
    bos, eos, pad = (_part_key(("S", name)) for name in ("bos", "eos", "pad"))
    codec_ids = prompt.codec_ids
    if voice_key is None and (None in codec_ids or prompt.layout.startswith("icl")):
        # Without it every voice would get the same keys: another voice's cached prompt would be served.
        raise ValueError("a prompt with a voice (x-vector or reference frames) needs its voice_key")
    layout = prompt.layout
    if layout not in ("non_streaming", "streaming", "icl_streaming", "icl_non_streaming"):
        raise ValueError(f"unknown prompt layout {layout!r}")
    c_pad, c_bos = _part_key(("C", codec_ids[-2])), _part_key(("C", codec_ids[-1]))
    x_key = _part_key(("X", voice_key))
    prefix = [_part_key(("C", c)) if c is not None else x_key for c in codec_ids[:-1]]   # codec_bos: text block
    body = prompt.text_ids[ROLE_LEN:-TEXT_TAIL_LEN]
    groups = ([prompt.instruct_ids] if prompt.instruct_ids else []) + [prompt.text_ids[:ROLE_LEN]]
    if layout == "non_streaming":
        groups.append(body)
    elif layout == "streaming":
        groups.append(body[:1])
    else:
        ref_body = prompt.ref_ids[ROLE_LEN:-REF_TAIL_LEN]
        groups.append(ref_body + body)
        frames = _indexed(_part_key(("F", voice_key)), np.arange(num_ref_frames))

    def parts(keys: list[list[int]]) -> tuple[list[int], list[int]]:
        text: list[int] = []
        for g in keys[:-2]:                                 # the instruction: text only
            text += g
        text += keys[-2]                                    # the role
        codec = [_NONE] * len(text) + prefix
        text += [pad] * (len(prefix) - 1) + [bos]
        last = keys[-1]
        if layout == "non_streaming":
            text += last + [eos, pad]
            codec += [c_pad] * (len(last) + 1) + [c_bos]
        elif layout == "streaming":
            text += last[:1]
            codec.append(c_bos)
        else:
            text_seq = last + [eos]
            codec_seq = [c_bos] + frames
            if layout == "icl_non_streaming":
                text += text_seq + [pad] * len(codec_seq)
                codec += [c_pad] * len(text_seq) + codec_seq
            else:
                text += (text_seq + [pad] * len(codec_seq))[:len(codec_seq)]
                codec += codec_seq
        return text, codec

    return groups, parts, prompt.length
