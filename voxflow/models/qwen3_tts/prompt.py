"""Prompt builder for the Qwen3-TTS talker (spec section 3), for every task and layout.

The talker never sees token ids directly: every prompt position is the SUM of a text-side vector (projected
text embedding) and a codec-side vector (codec embedding, speaker row or x-vector). This module turns a request
into those summed vectors, exactly as the official `Qwen3TTSForConditionalGeneration.generate` does:

    [T(instruction ids)]?                                   optional, text only (CustomVoice 1.7B, VoiceDesign)
    T(<|im_start|> assistant \\n)                            the role, 3 text-only positions
    P+C(think/lang ids...), P+C(speaker)?, B+C(codec_pad)    the codec prefix; codec_bos is carried forward
    text block                                               depends on the layout (below)

and the `trailing_text` queue that the decode loop adds, one row per generated frame, to the next input.

Layouts (N text tokens t1..tN, E = T(tts_eos), P = T(tts_pad), B = T(tts_bos)):
    streaming      T(t1)+C(bos)                                   trailing [T(t2..tN), E]
    non-streaming  T(t1..tN)+C(pad), E+C(pad), P+C(bos)           trailing [P]
    ICL (Base with reference codes): text = [T(ref ids), T(t1..tN), E] (T1 rows),
        codec = [C(bos), S(ref frame 0..R-1)] (T2 = R+1 rows)
        non-streaming  text+C(pad), codec+P                       trailing [P]
        streaming      T1 > T2: text[:T2]+codec                   trailing text[T2:]
                       T1 <= T2: (text padded with P to T2)+codec trailing [P]

Ids are cut out of the chat template POSITIONALLY, as the official code does ([:3] role, [3:-5] text,
[3:-2] reference text), so voxflow reproduces its behaviour even on odd inputs (e.g. a text starting with a
newline merges into the role's "\\n" token there too).

The builder only needs an embedder with three methods (the Talker module provides them):
    embed_text(ids [N]) -> [N, H]      text_projection(text_embedding(ids))
    embed_codec(ids [N]) -> [N, H]     talker codec_embedding
    embed_frame(codes [T, 16]) -> [T, H]  codec_embedding(c0) + sum_g code_predictor.codec_embedding[g-1](c_g)
and, optionally, a `device` attribute (where id tensors are created; CPU otherwise), and `keeps_text_rows()` with
`text_rows(ids list)`: embed_text of host ids from rows kept per id (the Talker's on a GPU, text_rows.py).

Requests are checked and tokenized here; their embeddings are made by prompt_assembly.py. `build_prompts` builds a
burst of requests together (the engine's arrivals: one tokenizer call, a few tensor ops for all prompts), each prompt
bit for bit what `build_prompt` (the same path with one request) gives it.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable

import torch

from .config import TASKS, Qwen3TTSConfig
from .prompt_assembly import PromptTensors, TokenizedRequest, assemble

# Chat templates of the official wrapper (qwen_tts/inference/qwen3_tts_model.py).
ROLE_TEMPLATE = "<|im_start|>assistant\n"
TEXT_TEMPLATE = "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
REF_TEMPLATE = "<|im_start|>assistant\n{text}<|im_end|>\n"
INSTRUCT_TEMPLATE = "<|im_start|>user\n{text}<|im_end|>\n"
ROLE_LEN = 3          # "<|im_start|>", "assistant", "\n"
TEXT_TAIL_LEN = 5     # "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"
REF_TAIL_LEN = 2      # "<|im_end|>", "\n"

AUTO = "auto"

# Official wrapper defaults: generate_custom_voice / generate_voice_design use the non-streaming (training)
# layout, generate_voice_clone the streaming-text layout.
_DEFAULT_NON_STREAMING = {"custom_voice": True, "voice_design": True, "base": False}


@runtime_checkable
class PromptEmbedder(Protocol):
    def embed_text(self, ids: torch.Tensor) -> torch.Tensor: ...
    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor: ...
    def embed_frame(self, codes: torch.Tensor) -> torch.Tensor: ...


class TextEncoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


class PromptError(ValueError):
    """The request cannot be turned into a prompt for this model (bad speaker, language, missing input...)."""


@dataclass
class PromptRequest:
    text: str
    task: Optional[str] = None                 # custom_voice | voice_design | base; None = the model's own task
    language: Optional[str] = None             # None = "auto"; case-insensitive
    speaker: Optional[str] = None              # CustomVoice built-in speaker; case-insensitive
    instruction: Optional[str] = None          # CustomVoice (1.7B) style, VoiceDesign voice description
    non_streaming_mode: Optional[bool] = None  # None = the official default for the task
    x_vector: Optional[torch.Tensor] = None    # Base: speaker embedding [H]
    ref_text: Optional[str] = None             # Base ICL: transcript of the reference audio
    ref_codes: Optional[torch.Tensor] = None   # Base ICL: reference codec frames [R, 16]
    ref_codes_checked: bool = False            # ref_codes known to lie in the codebook (see the range check)


@dataclass
class Prompt:
    inputs_embeds: torch.Tensor        # [P, H] talker prompt
    trailing_text: torch.Tensor        # [N, H] added one row per decode step, then tts_pad_embed forever
    tts_pad_embed: torch.Tensor        # [H]
    layout: str                        # streaming | non_streaming | icl_streaming | icl_non_streaming
    text_ids: list[int]                # the whole chat-template ids of the text
    instruct_ids: Optional[list[int]]  # None when there is no instruction (or it was dropped)
    ref_ids: Optional[list[int]]       # ICL only: the whole chat-template ids of the reference text
    codec_ids: list[Optional[int]]     # codec prefix, None marking the speaker slot when it holds an x-vector
    language: str                      # resolved, lower-case
    speaker: Optional[str]             # resolved, lower-case
    instruction_dropped: bool = False  # CustomVoice 0.6B: the official wrapper ignores instructions
    extras: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.inputs_embeds.shape[0])


# ---------------------------------------------------------------------------------------------------------
# Capabilities


def supported_speakers(config: Qwen3TTSConfig) -> list[str]:
    """Built-in speakers (lower-case, sorted); empty for models without speakers."""
    return sorted(config.talker.spk_id)


def supported_languages(config: Qwen3TTSConfig) -> list[str]:
    """"auto" followed by the model's languages, dialect entries excluded (they are reached via speakers)."""
    return [AUTO] + sorted(k for k in config.talker.codec_language_id if "dialect" not in k)


def default_non_streaming_mode(task: str) -> bool:
    """The official wrapper's default: True for custom_voice / voice_design, False for base."""
    if task not in _DEFAULT_NON_STREAMING:
        raise PromptError(f"unknown task {task!r}; expected one of {list(TASKS)}")
    return _DEFAULT_NON_STREAMING[task]


# ---------------------------------------------------------------------------------------------------------
# Request validation


def resolve_language(config: Qwen3TTSConfig, language: Optional[str]) -> str:
    lang = AUTO if language is None or language == "" else str(language).strip().lower()
    if lang not in supported_languages(config):
        raise PromptError(f"unsupported language {language!r}; supported: {', '.join(supported_languages(config))}")
    return lang


def resolve_speaker(config: Qwen3TTSConfig, task: str, speaker: Optional[str]) -> Optional[str]:
    speakers = supported_speakers(config)
    if speaker is None or speaker == "":
        if task == "custom_voice":
            raise PromptError("custom_voice needs a speaker; available: " + ", ".join(speakers))
        return None
    if task != "custom_voice" or not speakers:
        raise PromptError(f"a speaker ({speaker!r}) was given, but this {task} model has no built-in speakers"
                          + (" (Base clones a voice from reference audio)" if task == "base" else ""))
    spk = str(speaker).strip().lower()
    if spk not in config.talker.spk_id:
        raise PromptError(f"unknown speaker {speaker!r}; available: {', '.join(speakers)}")
    return spk


def codec_think_ids(config: Qwen3TTSConfig, language: str, speaker: Optional[str]) -> list[int]:
    """The language part of the codec prefix (before the speaker slot and codec_pad/codec_bos).

    Auto -> [nothink, think_bos, think_eos]; a language -> [think, think_bos, lang_id, think_eos].
    Dialect rule: with language chinese or auto, a dialect speaker (eric, dylan) switches to its dialect id.
    """
    t = config.talker
    lang_id = None if language == AUTO else t.codec_language_id[language]
    if speaker is not None and language in ("chinese", AUTO):
        dialect = t.spk_is_dialect.get(speaker, False)
        if dialect:  # False or a dialect language name
            key = str(dialect).lower()
            if key not in t.codec_language_id:
                raise PromptError(f"speaker {speaker!r} is marked as dialect {dialect!r}, which is not in "
                                  "talker_config.codec_language_id")
            lang_id = t.codec_language_id[key]
    if lang_id is None:
        return [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
    return [t.codec_think_id, t.codec_think_bos_id, lang_id, t.codec_think_eos_id]


_TEMPLATE_OK: "weakref.WeakKeyDictionary[TextEncoder, bool]" = weakref.WeakKeyDictionary()


def _check_template(tokenizer: TextEncoder) -> None:
    # The positional slicing below is only meaningful if the fixed parts have the lengths the official code assumes.
    # A tokenizer that passed is not asked again: two of a build's three encodes were this check (session-8 profile).
    try:
        if _TEMPLATE_OK.get(tokenizer):
            return
    except TypeError:                   # not weak-referenceable: checked every time
        pass
    role = tokenizer.encode(ROLE_TEMPLATE)
    tail = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n")
    if len(role) != ROLE_LEN or len(tail) != TEXT_TAIL_LEN:
        raise PromptError(f"tokenizer does not fit the Qwen3-TTS chat template: role -> {len(role)} ids "
                          f"(need {ROLE_LEN}), tail -> {len(tail)} ids (need {TEXT_TAIL_LEN})")
    try:
        _TEMPLATE_OK[tokenizer] = True
    except TypeError:
        pass


def _optional_str(value, name: str) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise PromptError(f"{name} must be a string, got {type(value).__name__}")
    return value if value != "" else None


# ---------------------------------------------------------------------------------------------------------
# Builder


def build_prompt(config: Qwen3TTSConfig, tokenizer: TextEncoder, embedder: PromptEmbedder,
                 request: PromptRequest) -> Prompt:
    """Build the talker prompt for one request (see the module docstring for the layouts)."""
    result = build_prompts(config, tokenizer, embedder, [request])[0]
    if isinstance(result, Exception):
        raise result
    return result


def build_prompts(config: Qwen3TTSConfig, tokenizer: TextEncoder, embedder: PromptEmbedder,
                  requests: list[PromptRequest]) -> list[Prompt | ValueError]:
    """Build the prompts of several requests together: one tokenizer call, and the embeddings of all of them in a
    few tensor ops (prompt_assembly.py) instead of ~15-20 per request; bit for bit each request's prompt built
    alone. A request that cannot be built gets the error build_prompt raises for it (a PromptError, a ValueError) in
    its place and does not affect the others."""
    results: list = [None] * len(requests)
    checked = {}
    for i, request in enumerate(requests):
        try:
            checked[i] = _check(config, request)
        except ValueError as e:         # a PromptError, or torch's own for a malformed tensor (e.g. a ragged x-vector)
            results[i] = e
    if checked:
        try:
            _check_template(tokenizer)
        except PromptError as e:
            for i in checked:
                results[i] = e
            checked = {}
    tokenized = {}
    for i, c, ids in _encode_isolating_errors(tokenizer, checked, results):
        try:
            tokenized[i] = _tokenized(config, c, *ids)
        except ValueError as e:
            results[i] = e
    for i, prompt in _assemble_isolating_errors(config, embedder, tokenized).items():
        results[i] = prompt
    return results


@dataclass
class _Checked:
    """A request that passed the checks that need no tokenizer."""
    task: str
    text: str
    language: str
    speaker: Optional[str]
    non_streaming: bool
    instruction: Optional[str]
    dropped: bool
    x_vector: Optional[torch.Tensor]
    ref_text: Optional[str]
    ref_codes: Optional[torch.Tensor]


def _check(config: Qwen3TTSConfig, request: PromptRequest) -> _Checked:
    """Everything about the request that can be checked before tokenizing it; PromptError if it cannot be built."""
    task = request.task or config.tts_model_type
    if task not in TASKS:
        raise PromptError(f"unknown task {task!r}; expected one of {list(TASKS)}")
    if task != config.tts_model_type:
        raise PromptError(f"this is a {config.tts_model_type} model; it cannot serve a {task} request")

    text = request.text
    if not isinstance(text, str) or text.strip() == "":
        raise PromptError("text is empty")
    language = resolve_language(config, request.language)
    speaker = resolve_speaker(config, task, request.speaker)
    non_streaming = default_non_streaming_mode(task) if request.non_streaming_mode is None \
        else bool(request.non_streaming_mode)

    # --- instruction: CustomVoice (dropped on 0.6B, as the official wrapper does), VoiceDesign (required)
    instruction = _optional_str(request.instruction, "instruction")
    dropped = False
    if task == "voice_design" and instruction is None:
        raise PromptError("voice_design needs an instruction (a description of the voice)")
    if task == "base" and instruction is not None:
        raise PromptError("base (voice clone) models take no instruction")
    if task == "custom_voice" and instruction is not None and not config.supports_instructions:
        instruction, dropped = None, True

    # --- Base: x-vector (always) and reference (ICL)
    x_vector = None if request.x_vector is None else torch.as_tensor(request.x_vector)
    ref_codes = None if request.ref_codes is None else torch.as_tensor(request.ref_codes)
    ref_text = _optional_str(request.ref_text, "ref_text")
    hidden = config.talker.hidden_size
    if task != "base":
        for name, value in (("x_vector", x_vector), ("ref_codes", ref_codes), ("ref_text", ref_text)):
            if value is not None:
                raise PromptError(f"{name} is only used by base (voice clone) models, not {task}")
    else:
        if x_vector is None:
            raise PromptError("base (voice clone) needs an x_vector (speaker embedding of the reference audio)")
        if x_vector.numel() != hidden:
            raise PromptError(f"x_vector must have {hidden} values (talker hidden size), got shape "
                              f"{tuple(x_vector.shape)}")
        if ref_codes is not None:
            _check_ref_codes(config, request, ref_codes, ref_text)
        elif ref_text is not None:
            raise PromptError("ref_text was given without ref_codes: pass the reference codes for in-context "
                              "cloning, or drop ref_text for x-vector-only cloning")
    return _Checked(task, text, language, speaker, non_streaming, instruction, dropped, x_vector, ref_text, ref_codes)


def _check_ref_codes(config: Qwen3TTSConfig, request: PromptRequest, ref_codes: torch.Tensor,
                     ref_text: Optional[str]) -> None:
    if ref_text is None:
        raise PromptError("in-context voice clone (ref_codes given) needs ref_text, the transcript of the "
                          "reference audio; for x-vector-only cloning drop ref_codes")
    groups = config.talker.num_code_groups
    if ref_codes.dim() != 2 or ref_codes.shape[1] != groups or ref_codes.shape[0] < 1:
        raise PromptError(f"ref_codes must have shape [R >= 1, {groups}], got {tuple(ref_codes.shape)}")
    if ref_codes.is_floating_point() or ref_codes.is_complex() or ref_codes.dtype == torch.bool:
        raise PromptError("ref_codes must be an integer tensor")
    codebook = config.talker.code_predictor.vocab_size if config.talker.code_predictor else 2048
    # Skipped for GPU codes already known good (the codec encoder's, or a stored voice's, checked on the host
    # as it loaded): reading a GPU tensor's range blocks until the decode step in flight ends.
    if (not ref_codes.is_cuda or not request.ref_codes_checked) and (
            int(ref_codes.min()) < 0 or int(ref_codes.max()) >= codebook):
        raise PromptError(f"ref_codes values must lie in [0, {codebook}), got "
                          f"[{int(ref_codes.min())}, {int(ref_codes.max())}]")


# From this many texts on, one `encode_batch` call (spread over the Rust tokenizer's threads) beats encoding them one by
# one; below, waking those threads costs more than it saves (a lone request with an instruction: 0.34 ms for the pair
# against 0.21 ms one by one, CPU profile of the bench prompts).
_ENCODE_BATCH_FROM = 8


def _encode_isolating_errors(tokenizer: TextEncoder, checked: dict[int, _Checked], results: list):
    """(index, checked request, its ids) of each request the tokenizer takes: all together, and when that raises a
    ValueError, one by one so that only the request it belongs to fails (its error into `results`)."""
    items = list(checked.items())
    try:
        return [(i, c, ids) for (i, c), ids in zip(items, _encode_all(tokenizer, [c for _, c in items]))]
    except ValueError as e:
        if len(items) == 1:
            results[items[0][0]] = e
            return []
    out = []
    for i, c in items:
        try:
            out.append((i, c, _encode_all(tokenizer, [c])[0]))
        except ValueError as e:
            results[i] = e
    return out


def _encode_all(tokenizer: TextEncoder, checked: list[_Checked]) -> list[tuple]:
    """(text ids, instruction ids or None, reference ids or None) of each request: the chat templates of a burst of
    them in one `encode_batch` call where the tokenizer has one."""
    texts, where = [], []
    for c in checked:
        parts = [TEXT_TEMPLATE.format(text=c.text)]
        if c.instruction:
            parts.append(INSTRUCT_TEMPLATE.format(text=c.instruction))
        if c.ref_codes is not None:
            parts.append(REF_TEMPLATE.format(text=c.ref_text))
        where.append(len(texts))
        texts += parts
    batch = getattr(tokenizer, "encode_batch", None)
    use_batch = batch is not None and len(texts) >= _ENCODE_BATCH_FROM
    ids = batch(texts) if use_batch else [tokenizer.encode(t) for t in texts]
    out = []
    for c, at in zip(checked, where):
        text_ids = list(ids[at])
        at += 1
        instruct_ids = list(ids[at]) if c.instruction else None
        at += bool(c.instruction)
        ref_ids = list(ids[at]) if c.ref_codes is not None else None
        out.append((text_ids, instruct_ids, ref_ids))
    return out


@dataclass
class _Tokenized:
    checked: _Checked
    text_ids: list[int]
    instruct_ids: Optional[list[int]]
    ref_ids: Optional[list[int]]
    rows: TokenizedRequest              # what prompt_assembly needs


def _tokenized(config: Qwen3TTSConfig, c: _Checked, text_ids: list[int], instruct_ids: Optional[list[int]],
               ref_ids: Optional[list[int]]) -> _Tokenized:
    # Token ids are cut positionally, exactly as the official code does.
    role_ids, body_ids = text_ids[:ROLE_LEN], text_ids[ROLE_LEN:-TEXT_TAIL_LEN]
    if not body_ids:
        raise PromptError("text is empty after tokenization")
    ref_body = ref_ids[ROLE_LEN:-REF_TAIL_LEN] if ref_ids is not None else []
    think = codec_think_ids(config, c.language, c.speaker)
    rows = TokenizedRequest(c.task, c.language, c.speaker, c.non_streaming, think, role_ids, body_ids, instruct_ids,
                            ref_body, c.x_vector, c.ref_codes)
    return _Tokenized(c, text_ids, instruct_ids, ref_ids, rows)


def _assemble_isolating_errors(config: Qwen3TTSConfig, embedder: PromptEmbedder,
                               tokenized: dict[int, _Tokenized]) -> dict[int, Prompt | ValueError]:
    """The prompts, built together; when that raises a ValueError (e.g. a token id outside the embedding table),
    each request is built alone so that only the requests it belongs to fail."""
    if not tokenized:
        return {}
    items = list(tokenized.items())
    try:
        tensors = assemble(config, embedder, [t.rows for _, t in items])
    except ValueError as e:
        if len(items) == 1:
            return {items[0][0]: e}
        out = {}
        for i, t in items:
            out.update(_assemble_isolating_errors(config, embedder, {i: t}))
        return out
    return {i: _prompt(t, p) for (i, t), p in zip(items, tensors)}


def _prompt(t: _Tokenized, p: PromptTensors) -> Prompt:
    c = t.checked
    return Prompt(inputs_embeds=p.inputs_embeds, trailing_text=p.trailing_text, tts_pad_embed=p.tts_pad_embed,
                  layout=p.layout, text_ids=t.text_ids, instruct_ids=t.instruct_ids, ref_ids=t.ref_ids,
                  codec_ids=p.codec_ids, language=c.language, speaker=c.speaker, instruction_dropped=c.dropped)
