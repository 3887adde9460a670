"""The reference generation loop: one request, eager, in the official order of operations.

This is the plain, readable definition of what Qwen3-TTS computes for one utterance. The serving engine
batches the same steps; tests hold both to the official implementation.

    prompt = build_prompt(...)                 # [P, H] embeddings + trailing text queue
    hidden = talker(prompt)                    # prefill
    c0 = sample(codec_head(hidden[-1]))        # codebook 0 of frame 0
    loop:  stop on EOS or when max_new_tokens c0 tokens were sampled (the last one gets no frame)
           c1..c15 = code_predictor(hidden[-1], c0)          # frame k complete
           x = embed_frame(c0..c15) + trailing_text[k] (or tts_pad)
           hidden = talker(x); c0 = sample(codec_head(hidden))  # codebook 0 of frame k+1
    wav = codec_decoder(frames)                # official 300/25 windows; ICL: reference frames prepended, then cut
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .codec_decoder import official_decode
from .position_keys import content_key
from .prompt import Prompt, PromptRequest, build_prompts
from .sampling import RequestSampler, SamplingParams


@dataclass
class VoiceClonePrompt:
    """What a Base model needs from a reference clip; computed once, reusable across requests."""
    x_vector: torch.Tensor                 # [H] speaker embedding
    ref_codes: torch.Tensor | None         # [R, 16] reference frames (ICL mode), None in x-vector-only mode
    ref_text: str | None                   # transcript of the reference (ICL mode)
    # A content key of x_vector and ref_codes, made from the host data they were computed from (equal keys: equal
    # tensors), so that prefix caching never reads them back from the device (position_keys.py).
    key: int | None = None
    codes_checked: bool = False            # ref_codes lie in the codebook (the encoder's, or checked on the host)


@dataclass
class SynthesisRequest:
    text: str
    speaker: str | None = None             # CustomVoice preset speaker (case-insensitive)
    instruct: str | None = None            # CustomVoice 1.7B style / VoiceDesign voice description
    language: str | None = None            # None or "auto" = automatic
    ref_audio: np.ndarray | None = None    # Base: reference clip, mono float32 at 24 kHz
    ref_text: str | None = None            # Base ICL: transcript of the reference clip
    x_vector_only: bool = False            # Base: speaker embedding only (no ref text / codes)
    voice_clone_prompt: VoiceClonePrompt | None = None   # Base: precomputed instead of ref_audio
    non_streaming_mode: bool | None = None  # prompt layout; None = the official default of the task
    seed: int | None = None
    greedy: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None      # None = generation_config.json (8192 in the released files)


@dataclass
class SynthesisResult:
    codes: torch.Tensor                    # [F, 16] generated frames (int64)
    wav: np.ndarray                        # float32 mono at the model's sample rate
    finish_reason: str                     # "eos" | "length"
    prompt: Prompt
    talker_logits: list[torch.Tensor] = field(default_factory=list)   # raw [3072] per sampled c0 (when recorded)
    cp_logits: list[torch.Tensor] = field(default_factory=list)       # raw [15, 2048] per frame (when recorded)


@torch.no_grad()
def make_voice_clone_prompt(model, ref_audio_24k: np.ndarray, ref_text: str | None = None,
                            x_vector_only: bool = False) -> VoiceClonePrompt:
    """Speaker embedding (and, in ICL mode, reference codes) of a 24 kHz mono clip."""
    if model.task != "base":
        raise ValueError(f"voice cloning needs a Base model; this one is '{model.task}'")
    if not x_vector_only and (ref_text is None or not ref_text.strip()):
        raise ValueError("ref_text (the transcript of the reference audio) is required for voice cloning "
                         "in ICL mode; give it, or use x-vector-only mode")
    wav = torch.from_numpy(np.array(ref_audio_24k, dtype=np.float32))   # a copy: the input may be read-only
    if wav.ndim != 1 or wav.numel() == 0:
        raise ValueError("reference audio must be a non-empty mono clip")
    x_vector = model.speaker_encoder.extract_xvector(wav.to(model.device))
    ref_codes = None if x_vector_only else model.codec_encoder.encode(wav.to(model.device))
    # Both are functions of the clip alone (and of the weights, fixed for a model).
    key = content_key(("clip", wav.numpy().tobytes(), bool(x_vector_only)))
    return VoiceClonePrompt(x_vector=x_vector, ref_codes=ref_codes, ref_text=None if x_vector_only else ref_text,
                            key=key, codes_checked=True)


def sampling_params(model, req: SynthesisRequest) -> SamplingParams:
    overrides = {k: v for k, v in dict(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                                       repetition_penalty=req.repetition_penalty).items() if v is not None}
    # The same overrides apply to the code predictor ("subtalker"), as vLLM-Omni's API does.
    for k in ("temperature", "top_k", "top_p"):
        if k in overrides:
            overrides["subtalker_" + k] = overrides[k]
    params = SamplingParams.from_defaults(model.generation, seed=req.seed, **overrides)
    if req.greedy:
        params = replace(params, do_sample=False, subtalker_do_sample=False)
    params.validate()
    return params


def prepare(model, req: SynthesisRequest) -> tuple[Prompt, SamplingParams, int, VoiceClonePrompt | None]:
    """Validate a request and build its prompt. Raises ValueError (with a user-facing message) on bad input."""
    result = prepare_many(model, [req])[0]
    if isinstance(result, Exception):
        raise result
    return result


def prepare_many(model, reqs: list[SynthesisRequest]) -> list[tuple | ValueError]:
    """`prepare` of several requests, their prompts built together (prompt.build_prompts: one tokenizer call, a few
    tensor ops for all of them); each request's result is what `prepare` gives it alone, a bad request's ValueError
    in its place (checked in the same order: the request, its prompt, its sampling parameters)."""
    results: list = [None] * len(reqs)
    pending = {}                            # index -> (max_new_tokens, clone, PromptRequest)
    for i, req in enumerate(reqs):
        try:
            pending[i] = _prompt_request(model, req)
        except ValueError as e:
            results[i] = e
    with torch.no_grad():
        prompts = build_prompts(model.config, model.tokenizer, model.talker, [p[2] for p in pending.values()])
    for (i, (max_new_tokens, clone, _)), prompt in zip(pending.items(), prompts):
        if isinstance(prompt, Exception):
            results[i] = prompt
            continue
        try:
            results[i] = (prompt, sampling_params(model, reqs[i]), max_new_tokens, clone)
        except ValueError as e:
            results[i] = e
    return results


def _prompt_request(model, req: SynthesisRequest) -> tuple[int, VoiceClonePrompt | None, PromptRequest]:
    if req.max_new_tokens is not None and req.max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    max_new_tokens = req.max_new_tokens or model.generation.max_new_tokens
    clone = req.voice_clone_prompt
    if model.task == "base" and clone is None:
        if req.ref_audio is None:
            raise ValueError("a Base model clones a voice: give reference audio (ref_audio)")
        clone = make_voice_clone_prompt(model, req.ref_audio, req.ref_text, req.x_vector_only)
    elif model.task != "base" and (req.ref_audio is not None or clone is not None):
        raise ValueError(f"reference audio is only used by Base (voice clone) models; this one is '{model.task}'")
    prompt_req = PromptRequest(
        text=req.text, language=req.language, speaker=req.speaker, instruction=req.instruct,
        non_streaming_mode=req.non_streaming_mode,
        x_vector=clone.x_vector if clone is not None else None,
        ref_text=clone.ref_text if clone is not None else None,
        ref_codes=clone.ref_codes if clone is not None else None,
        ref_codes_checked=clone is not None and clone.codes_checked)
    return max_new_tokens, clone, prompt_req


@torch.no_grad()
def generate_codes(model, prompt: Prompt, sampler: RequestSampler, max_new_tokens: int,
                   record_logits: bool = False) -> tuple[torch.Tensor, str, list, list]:
    """Run the talker + code predictor until EOS or `max_new_tokens` sampled c0 tokens.

    Returns frames [F, 16], the finish reason and (when recorded) the raw logits of every step.
    """
    talker = model.talker
    eos = model.config.talker.codec_eos_token_id
    trailing, pad = prompt.trailing_text, prompt.tts_pad_embed
    cache = talker.new_cache()
    length = prompt.length
    hidden = talker(prompt.inputs_embeds[None], torch.arange(length, device=model.device)[None], cache)
    # The head runs on every prefill position (as the reference does) so the GEMM rounds identically.
    logits = talker.codec_logits(hidden)[:, -1]
    talker_logits, cp_logits, frames = [], [], []
    sampled = 1
    c0 = sampler.talker(logits)
    h_last = hidden[:, -1]
    while True:
        if record_logits:
            talker_logits.append(logits[0].float().cpu())
        if int(c0) == eos:
            finish = "eos"
            break
        if sampled >= max_new_tokens:          # the last sampled c0 never gets its residual codes
            finish = "length"
            break
        residual, res_logits = talker.predict_residual_codes(h_last, c0, sampler.code_predictor)
        if record_logits:
            cp_logits.append(res_logits[0].float().cpu())
        frame = torch.cat((c0.view(1, 1), residual), dim=1)           # [1, 16]
        frames.append(frame)
        k = len(frames) - 1
        text_part = trailing[k] if k < trailing.shape[0] else pad
        x = (talker.embed_frame(frame) + text_part)[:, None]            # [1, 1, H]
        hidden = talker(x, torch.tensor([[length + k]], device=model.device), cache)
        logits = talker.codec_logits(hidden)[:, -1]
        c0 = sampler.talker(logits)
        h_last = hidden[:, -1]
        sampled += 1
    codes = torch.cat(frames) if frames else torch.zeros(0, 16, dtype=torch.long, device=model.device)
    return codes, finish, talker_logits, cp_logits


@torch.no_grad()
def decode_to_wav(model, codes: torch.Tensor, ref_codes: torch.Tensor | None = None) -> np.ndarray:
    """Waveform of generated frames, exactly as the official wrapper produces it.

    ICL: the reference frames are decoded in front of the generated ones (the decoder needs their context),
    then the reference part is cut with the official proportional formula (occasionally one sample short of
    R * 1920; replicated for parity).
    """
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.float32)
    full = codes if ref_codes is None else torch.cat((ref_codes.to(codes), codes))
    wav = official_decode(model.codec_decoder, full[None].to(model.device))[0].float().cpu()
    if ref_codes is not None:
        cut = int(ref_codes.shape[0] / max(full.shape[0], 1) * wav.shape[0])
        wav = wav[cut:]
    return wav.numpy().astype(np.float32)


def synthesize(model, req: SynthesisRequest, record_logits: bool = False) -> SynthesisResult:
    """Text in, waveform out, for one request (eager reference path)."""
    prompt, params, max_new_tokens, clone = prepare(model, req)
    sampler = RequestSampler(params, device=model.device)
    codes, finish, talker_logits, cp_logits = generate_codes(model, prompt, sampler, max_new_tokens, record_logits)
    wav = decode_to_wav(model, codes, clone.ref_codes if clone is not None else None)
    return SynthesisResult(codes=codes.cpu(), wav=wav, finish_reason=finish, prompt=prompt,
                           talker_logits=talker_logits, cp_logits=cp_logits)
