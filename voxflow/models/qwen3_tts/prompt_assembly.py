"""The embedding half of prompt.build_prompts: the prompts of many checked, tokenized requests in a few tensor ops.

Every prompt position is a text-side row plus a codec-side row, and every trailing-text row a text-side row
(prompt.py's layouts). So the rows a batch of prompts uses are stacked into two sources,

    text source   the fixed rows (tts_bos/eos/pad, role) of each language / speaker in the batch, then the
                  requests' text rows: ONE gather from the rows the Talker keeps per token id (text_rows.py) for
                  all requests, or each request's grouped projections where no rows are kept (the CPU default)
    codec source  a row of -0.0, the codec prefix rows of each language / speaker, x-vectors, reference frames

and each request's positions become two index lists into them: all prompts and their trailing text are then ONE
upload of the indices, two gathers and one add ([sum P, H]), and a request's tensors are views of those.
Building request by request cost ~15-20 small GPU ops each (cats, adds, uploads), ~0.9 ms of engine-thread time a
request on an H200, paid 44-64 times in a row when a wave of requests arrives (session-16 step trace).

Bit for bit what the per-request build gave: a gather copies rows, a text-only position adds the -0.0 row (x + -0.0
is x for every x, signed zeros and NaN included) and a summed one adds the same two rows, and the grouping of the
projection calls is the per-request build's (a matmul's rounding may depend on its row count). Where rows are kept
per id, ids new to the table are projected in one call for the batch: equal to a per-request projection up to
summation order, as text_rows.py already accepts; ids already kept read the same rows either way.

A request's tensors are views of the batch's two (the prompt embeddings, the trailing text): their storage lives as
long as the longest-lived of its requests (a wave of 64 prompts of ~60 positions at H=2048 in bf16: ~16 MB).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

import torch

from ...engine.host_to_device import tensor_to, to_device


@dataclass
class TokenizedRequest:
    """A request checked and tokenized by prompt.py: everything its prompt's rows depend on."""
    task: str
    language: str
    speaker: Optional[str]
    non_streaming: bool
    think: list[int]                       # codec_think_ids(language, speaker)
    role_ids: list[int]
    body_ids: list[int]
    instruct_ids: Optional[list[int]]
    ref_body: list[int]                    # ICL only (else empty)
    x_vector: Optional[torch.Tensor]       # base only
    ref_codes: Optional[torch.Tensor]      # ICL only


@dataclass
class PromptTensors:
    """A request's prompt tensors (views of the batch's) and what its layout made of it."""
    inputs_embeds: torch.Tensor
    trailing_text: torch.Tensor
    tts_pad_embed: torch.Tensor
    layout: str
    codec_ids: list[Optional[int]]


class _IdsOnDevice:
    """Token-id lists uploaded together; `of(ids)` is a device view of an uploaded list equal to `ids`, or of a
    contiguous piece of one (e.g. body_ids[1:]), found by value. Anything else is uploaded on its own."""

    def __init__(self, device, lists: list[list[int]]):
        self.device = device
        self.lists = [list(x) for x in lists]
        self.starts, at = [], 0
        for x in self.lists:
            self.starts.append(at)
            at += len(x)
        flat = [i for x in self.lists for i in x]
        self.flat = tensor_to(flat, device) if flat else None

    def of(self, ids: list[int]) -> torch.Tensor:
        ids = list(ids)
        n = len(ids)
        for x, start in zip(self.lists, self.starts):
            for offset in (0, len(x) - n):               # a prefix or a suffix of an uploaded list
                if n and 0 <= offset and x[offset: offset + n] == ids:
                    return self.flat[start + offset: start + offset + n]
        return tensor_to(ids, self.device)


def _cached_constants(embedder, key: tuple, make):
    """make() (embeddings of fixed id lists), kept in `embedder.prompt_constants` (a dict) under `key` and the
    embedder's `weights_version()`, when the embedder has both; else made every time. The same computation on the
    same ids: the same values as making them afresh."""
    cache = getattr(embedder, "prompt_constants", None)
    if cache is None or not hasattr(embedder, "weights_version"):
        return make()
    full = (key, embedder.weights_version())
    value = cache.get(full)
    if value is None:
        if len(cache) >= 256:             # languages x speakers is small; bound it anyway
            cache.clear()
        value = cache[full] = make()
    return value


class _Stack:
    """Row blocks to be concatenated into one source tensor; `add` says where a block's first row will be."""

    def __init__(self):
        self.blocks: list[torch.Tensor] = []
        self.rows = 0

    def add(self, block: torch.Tensor) -> int:
        start = self.rows
        self.blocks.append(block)
        self.rows += block.shape[0]
        return start

    def tensor(self) -> torch.Tensor:
        return self.blocks[0] if len(self.blocks) == 1 else torch.cat(self.blocks, dim=0)


@dataclass
class _Fixed:
    """One language / speaker's fixed rows: where they sit in the two sources."""
    t_special: torch.Tensor     # [3, H] tts_bos, tts_eos, tts_pad (tts_pad_embed is a view of it, as before)
    special: int                # text-source row of tts_bos (eos +1, pad +2)
    role: int                   # text-source row of the role's first id (3 rows)
    think: int                  # codec-source row of the think ids, then codec_pad, codec_bos
    spk: Optional[int]          # codec-source row of the speaker, if any


_NEG_ZERO: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def assemble(config, embedder, requests: list[TokenizedRequest]) -> list[PromptTensors]:
    """The prompts of `requests` (checked and tokenized), built together; see the module docstring."""
    device = getattr(embedder, "device", None) or torch.device("cpu")
    tc = config.talker
    keeps = getattr(embedder, "keeps_text_rows", None)
    kept_rows = keeps is not None and keeps()
    texts, codecs = _Stack(), _Stack()

    # --- the fixed rows of each language / speaker in the batch (kept across builds by _cached_constants)
    special_ids = [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
    fixed: dict[tuple, _Fixed] = {}
    keys = []
    for r in requests:
        spk_ids = [tc.spk_id[r.speaker]] if r.speaker is not None else []
        key = (tuple(special_ids), tuple(r.role_ids), tuple(r.think), tc.codec_pad_id, tc.codec_bos_id, tuple(spk_ids))
        keys.append(key)
        if key not in fixed:
            fixed[key] = _place_fixed(embedder, device, kept_rows, key, spk_ids, texts, codecs)

    # --- every request's own text rows, then its voice rows, and the index lists of its positions
    groups = [_text_groups(r) for r in requests]
    starts = _text_rows(embedder, device, kept_rows, groups, texts)
    dtype = codecs.blocks[0].dtype
    t_idx: list[int] = []
    c_idx: list[int] = []
    trailing_idx: list[int] = []
    spans, shapes = [], []
    for r, key, group_starts in zip(requests, keys, starts):
        f = fixed[key]
        voice_row = frames_row = None
        if r.task == "base" and r.speaker is None:
            # The raw x-vector takes the speaker slot (no lookup), in the talker's dtype.
            voice_row = codecs.add(to_device(r.x_vector.reshape(1, tc.hidden_size), device, dtype))
        if r.ref_codes is not None:
            frames = embedder.embed_frame(to_device(r.ref_codes, device, torch.long))
            frames_row = codecs.add(frames.to(dtype))
        p0, q0 = len(t_idx), len(trailing_idx)
        layout, codec_ids = _positions(r, tc, f, group_starts, voice_row, frames_row, t_idx, c_idx, trailing_idx)
        spans.append((p0, len(t_idx), q0, len(trailing_idx)))
        shapes.append((layout, codec_ids, f.t_special))

    # --- all prompts at once: one upload of the indices, a gather of the positions' text rows and one of their
    # codec rows, an add, and a gather of the trailing text (its own tensor: a view of a gather that also held the
    # positions' rows would keep those alive as long as any request of the burst runs)
    text_src, codec_src = texts.tensor(), codecs.tensor()
    n, m = len(t_idx), len(trailing_idx)
    index = tensor_to(t_idx + trailing_idx + c_idx, text_src.device)
    embeds = text_src.index_select(0, index[:n]) + codec_src.index_select(0, index[n + m:])
    trailing = text_src.index_select(0, index[n:n + m])
    return [PromptTensors(embeds[p0:p1], trailing[q0:q1], t_special[2], layout, codec_ids)
            for (p0, p1, q0, q1), (layout, codec_ids, t_special) in zip(spans, shapes)]


def _place_fixed(embedder, device, kept_rows, key, spk_ids, texts: _Stack, codecs: _Stack) -> _Fixed:
    special_ids, role_ids, think = list(key[0]), list(key[1]), list(key[2])
    think_pad_bos = think + [key[3], key[4]]
    t_special, t_role, c_think_pad_bos, c_spk = _cached_constants(
        embedder, key, lambda: _make_constants(embedder, device, kept_rows, special_ids, role_ids, think_pad_bos,
                                               spk_ids))
    if not codecs.blocks:
        codecs.add(_neg_zero_row(embedder, c_think_pad_bos))          # row 0: the codec side of text-only rows
    return _Fixed(t_special, texts.add(t_special), texts.add(t_role), codecs.add(c_think_pad_bos),
                  codecs.add(c_spk) if c_spk is not None else None)


def _positions(r: TokenizedRequest, tc, f: _Fixed, group_starts: list[int], voice_row: Optional[int],
               frames_row: Optional[int], t_idx: list[int], c_idx: list[int], trailing_idx: list[int]):
    """Appends the request's positions (text row, codec row) and trailing text rows, in prompt.py's block order;
    returns (layout, codec_ids). Codec row 0 is the -0.0 row of text-only positions."""
    bos, eos, pad = f.special, f.special + 1, f.special + 2
    n_think = len(r.think)
    c_pad, c_bos = f.think + n_think, f.think + n_think + 1

    def put(text_rows, codec_rows):
        t_idx.extend(text_rows)
        c_idx.extend(codec_rows)

    g = 0
    if r.instruct_ids:                                               # instruction, text only
        put(range(group_starts[0], group_starts[0] + len(r.instruct_ids)), [0] * len(r.instruct_ids))
        g = 1
    put(range(f.role, f.role + len(r.role_ids)), [0] * len(r.role_ids))        # role, text only
    # codec prefix [think ids] [speaker | x-vector]? [codec_pad] under tts_pad ... tts_pad, tts_bos
    prefix = list(range(f.think, f.think + n_think))
    codec_ids: list[Optional[int]] = list(r.think)
    if f.spk is not None:
        prefix.append(f.spk)
        codec_ids.append(tc.spk_id[r.speaker])
    elif voice_row is not None:
        prefix.append(voice_row)
        codec_ids.append(None)
    prefix.append(c_pad)
    codec_ids += [tc.codec_pad_id, tc.codec_bos_id]
    put([pad] * (len(prefix) - 1) + [bos], prefix)

    start = group_starts[g]
    if r.ref_codes is not None:
        # text_seq = [T(ref + text), tts_eos] (T1 rows), codec_seq = [codec_bos, frames] (T2 rows)
        text_seq = list(range(start, start + len(r.ref_body) + len(r.body_ids))) + [eos]
        codec_seq = [c_bos] + list(range(frames_row, frames_row + r.ref_codes.shape[0]))
        t1, t2 = len(text_seq), len(codec_seq)
        if r.non_streaming:
            put(text_seq, [c_pad] * t1)
            put([pad] * t2, codec_seq)
            trailing_idx.append(pad)
            return "icl_non_streaming", codec_ids
        if t1 > t2:
            put(text_seq[:t2], codec_seq)
            trailing_idx.extend(text_seq[t2:])
        else:
            put(text_seq + [pad] * (t2 - t1), codec_seq)
            trailing_idx.append(pad)
        return "icl_streaming", codec_ids
    if r.non_streaming:
        body = list(range(start, start + len(r.body_ids))) + [eos]
        put(body + [pad], [c_pad] * len(body) + [c_bos])
        trailing_idx.append(pad)
        return "non_streaming", codec_ids
    put([start], [c_bos])                                            # streaming: the first text id only
    if len(r.body_ids) > 1:
        rest = group_starts[g + 1]
        trailing_idx.extend(range(rest, rest + len(r.body_ids) - 1))
    trailing_idx.append(eos)
    return "streaming", codec_ids


def _make_constants(embedder, device, kept_rows, special_ids, role_ids, think_pad_bos, spk_ids):
    """The fixed rows of one language / speaker, embedded exactly as the per-request build always did (the same
    calls on the same ids: a text call per list, or the kept rows)."""
    ids_on_device = _IdsOnDevice(device, [special_ids, role_ids, think_pad_bos, spk_ids])      # one upload

    def embed_text(ids):
        return embedder.text_rows(ids) if kept_rows else embedder.embed_text(ids_on_device.of(ids))

    return (embed_text(special_ids), embed_text(role_ids), embedder.embed_codec(ids_on_device.of(think_pad_bos)),
            embedder.embed_codec(ids_on_device.of(spk_ids)) if spk_ids else None)


def _neg_zero_row(embedder, like: torch.Tensor) -> torch.Tensor:
    """[1, H] of -0.0 in `like`'s dtype and device, made once per embedder (adding it leaves any value as it is)."""
    try:
        cache = _NEG_ZERO.setdefault(embedder, {})
    except TypeError:                   # not weak-referenceable: made every time
        cache = {}
    key = (like.dtype, like.device, like.shape[-1])
    if key not in cache:
        cache[key] = torch.full((1, like.shape[-1]), -0.0, dtype=like.dtype, device=like.device)
    return cache[key]


def _text_groups(r: TokenizedRequest) -> list[list[int]]:
    """The request's own text id lists, each embedded in one call (the official grouping, see module docstring):
    instruction?, then ICL: reference + text; non-streaming: text; streaming: first id, rest (if any)."""
    groups = [r.instruct_ids] if r.instruct_ids else []
    if r.ref_codes is not None:
        groups.append(r.ref_body + r.body_ids)
    elif r.non_streaming:
        groups.append(r.body_ids)
    else:
        groups += [r.body_ids[:1]] + ([r.body_ids[1:]] if len(r.body_ids) > 1 else [])
    return groups


def _text_rows(embedder, device, kept_rows, groups: list[list[list[int]]], texts: _Stack) -> list[list[int]]:
    """Adds every request's text rows to the text source; returns each group's first row there, per request."""
    if kept_rows:
        flat = [i for request_groups in groups for g in request_groups for i in g]
        at = texts.rows
        texts.add(embedder.text_rows(flat))           # one index upload and one gather for the whole batch
        starts = []
        for request_groups in groups:
            starts.append([])
            for g in request_groups:
                starts[-1].append(at)
                at += len(g)
        return starts
    starts = []
    for request_groups in groups:
        # The request's lists in one upload (a copy each cost a pinned block and a launch), sliced per call.
        on_device = _IdsOnDevice(device, request_groups)
        starts.append([texts.add(embedder.embed_text(on_device.of(g))) for g in request_groups])
    return starts
