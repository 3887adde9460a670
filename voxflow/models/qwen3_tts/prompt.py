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
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable

import torch

from ...engine.host_to_device import tensor_to, to_device
from .config import TASKS, Qwen3TTSConfig

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


# ---------------------------------------------------------------------------------------------------------
# Builder


def build_prompt(config: Qwen3TTSConfig, tokenizer: TextEncoder, embedder: PromptEmbedder,
                 request: PromptRequest) -> Prompt:
    """Build the talker prompt for one request (see the module docstring for the layouts)."""
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
        elif ref_text is not None:
            raise PromptError("ref_text was given without ref_codes: pass the reference codes for in-context "
                              "cloning, or drop ref_text for x-vector-only cloning")

    # --- token ids (positional slicing, exactly as the official code)
    _check_template(tokenizer)
    text_ids = list(tokenizer.encode(TEXT_TEMPLATE.format(text=text)))
    role_ids, body_ids = text_ids[:ROLE_LEN], text_ids[ROLE_LEN:-TEXT_TAIL_LEN]
    if not body_ids:
        raise PromptError("text is empty after tokenization")
    instruct_ids = list(tokenizer.encode(INSTRUCT_TEMPLATE.format(text=instruction))) if instruction else None
    icl = ref_codes is not None
    ref_ids = list(tokenizer.encode(REF_TEMPLATE.format(text=ref_text))) if icl else None
    ref_body = ref_ids[ROLE_LEN:-REF_TAIL_LEN] if icl else []

    # --- text embeddings. The calls are grouped as in the official code (instruction / specials / role / text
    # pieces): a matmul's rounding can depend on how many rows it is given, and matching the grouping keeps the
    # prompt bit-identical to the official one on CPU fp32.
    device = getattr(embedder, "device", None) or torch.device("cpu")
    tc = config.talker
    think = codec_think_ids(config, language, speaker)
    # Text rows kept per token id by the Talker on a GPU (text_rows.py): gathered from host ids, so only the
    # codec-side ids go to the device then.
    keeps = getattr(embedder, "keeps_text_rows", None)
    kept_rows = keeps is not None and keeps()
    text_lists = [] if kept_rows else [
        instruct_ids or [], [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id], role_ids,
        ref_body + body_ids, body_ids]
    # Every id list this prompt embeds on the device goes there in ONE copy (a copy per list cost a pinned staging
    # block and a launch each); the embedding calls below take slices of it, grouped as before.
    ids_on_device = _IdsOnDevice(device, text_lists + [
        think + [tc.codec_pad_id, tc.codec_bos_id], [tc.spk_id[speaker]] if speaker is not None else []])

    def embed_text(ids: list[int]) -> torch.Tensor:
        return embedder.text_rows(ids) if kept_rows else embedder.embed_text(ids_on_device.of(ids))

    t_instr = embed_text(instruct_ids) if instruct_ids else None
    special = [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
    spk_ids = [tc.spk_id[speaker]] if speaker is not None else []

    def constants():
        # The same ids every time for this language / speaker: kept by the embedder when it offers a cache
        # (`prompt_constants`), so a request embeds only its own text.
        return (embed_text(special), embed_text(role_ids),
                embedder.embed_codec(ids_on_device.of(think + [tc.codec_pad_id, tc.codec_bos_id])),
                embedder.embed_codec(ids_on_device.of(spk_ids)) if spk_ids else None)

    t_special, t_role, c_think_pad_bos, c_spk = _cached_constants(
        embedder, (tuple(special), tuple(role_ids), tuple(think), tc.codec_pad_id, tc.codec_bos_id, tuple(spk_ids)),
        constants)
    tts_bos, tts_eos, tts_pad = t_special[0:1], t_special[1:2], t_special[2:3]

    # --- codec prefix: [think/lang ids] [speaker]? [codec_pad, codec_bos]
    c_think, c_pad, c_bos = c_think_pad_bos[:-2], c_think_pad_bos[-2:-1], c_think_pad_bos[-1:]
    codec_ids: list[Optional[int]] = list(think)
    rows = [c_think]
    if speaker is not None:
        rows.append(c_spk)
        codec_ids.append(spk_ids[0])
    elif task == "base":
        # The raw x-vector takes the speaker slot (no lookup), in the talker's dtype.
        rows.append(to_device(x_vector.reshape(1, hidden), device, c_think.dtype))
        codec_ids.append(None)
    rows.append(c_pad)
    codec_ids += [tc.codec_pad_id, tc.codec_bos_id]
    codec_rows = torch.cat(rows, dim=0)  # L-1 rows: everything but codec_bos, which moves into the text block

    # Text side of the prefix: tts_pad under every codec row except the last (codec_pad), which gets tts_bos.
    n_pad = codec_rows.shape[0] - 1
    text_side = torch.cat([tts_pad.expand(n_pad, -1), tts_bos], dim=0)
    blocks = [t_role, text_side + codec_rows]
    if t_instr is not None:
        blocks.insert(0, t_instr)

    # --- text block and trailing-text queue
    if icl:
        text_seq = torch.cat([embed_text(ref_body + body_ids), tts_eos], dim=0)     # T1 rows
        frames = embedder.embed_frame(to_device(ref_codes, device, torch.long))
        codec_seq = torch.cat([c_bos, frames.to(c_bos.dtype)], dim=0)              # T2 = R + 1 rows
        t1, t2 = text_seq.shape[0], codec_seq.shape[0]
        if non_streaming:
            layout = "icl_non_streaming"
            blocks += [text_seq + c_pad, codec_seq + tts_pad]
            trailing = tts_pad
        else:
            layout = "icl_streaming"
            if t1 > t2:
                blocks.append(text_seq[:t2] + codec_seq)
                trailing = text_seq[t2:]
            else:
                padded = torch.cat([text_seq, tts_pad.expand(t2 - t1, -1)], dim=0)
                blocks.append(padded + codec_seq)
                trailing = tts_pad
    elif non_streaming:
        layout = "non_streaming"
        blocks += [torch.cat([embed_text(body_ids), tts_eos], dim=0) + c_pad, tts_pad + c_bos]
        trailing = tts_pad
    else:
        layout = "streaming"
        blocks.append(embed_text(body_ids[:1]) + c_bos)
        rest = [embed_text(body_ids[1:])] if len(body_ids) > 1 else []
        trailing = torch.cat(rest + [tts_eos], dim=0)

    inputs_embeds = torch.cat(blocks, dim=0)
    return Prompt(
        inputs_embeds=inputs_embeds,
        trailing_text=trailing,
        tts_pad_embed=tts_pad[0],
        layout=layout,
        text_ids=text_ids,
        instruct_ids=instruct_ids,
        ref_ids=ref_ids,
        codec_ids=codec_ids,
        language=language,
        speaker=speaker,
        instruction_dropped=dropped,
    )
