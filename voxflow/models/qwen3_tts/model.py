"""Qwen3-TTS: every component of one checkpoint, loaded from a local folder or a hub id.

    model = Qwen3TTS.from_pretrained("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", device="cpu", dtype=torch.float32)

The talker (with its code predictor) and the speaker encoder come from `model.safetensors`; the 12 Hz codec
(encoder and decoder) from `speech_tokenizer/model.safetensors`. The codec decoder loads in fp32 whatever the
talker's dtype (half precision can overflow it, reference spec section 10); the engine's loader may then cast it
to fp16 after checking this checkpoint against its fp32 decode (codec_precision.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from voxflow.layers.cast import cast_parameters

from ..hub import resolve_model_dir
from .codec_decoder import CodecDecoder
from .config import CodecConfig, GenerationDefaults, Qwen3TTSConfig, load_configs
from .prompt import supported_languages, supported_speakers
from .talker import Talker
from .tokenizer import TextTokenizer
from .weights import WeightLoadError, load_into, read_safetensors, split_prefix

SAMPLE_RATE = 24000


@dataclass
class Qwen3TTS:
    path: str
    config: Qwen3TTSConfig
    codec_config: CodecConfig
    generation: GenerationDefaults
    tokenizer: TextTokenizer
    talker: Talker
    codec_decoder: CodecDecoder
    speaker_encoder: torch.nn.Module | None
    codec_encoder: object | None
    device: torch.device
    dtype: torch.dtype

    sample_rate: int = SAMPLE_RATE

    @property
    def task(self) -> str:
        """custom_voice | voice_design | base"""
        return self.config.tts_model_type

    @property
    def samples_per_frame(self) -> int:
        return self.codec_config.decode_upsample_rate

    @property
    def speakers(self) -> list[str]:
        return supported_speakers(self.config)

    @property
    def languages(self) -> list[str]:
        return supported_languages(self.config)

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32, codec_dtype: torch.dtype = torch.float32,
                        revision: str | None = None,
                        text_embedding_device: str | torch.device | None = None) -> "Qwen3TTS":
        """text_embedding_device: where the talker's text embedding table lives (None: with the rest). "cpu"
        keeps its 151,936 rows x 2,048 (594 MiB in bf16) off a GPU: Talker.embed_text gathers the rows there
        and projects them on the GPU, which prompt builds do only for ids their kept rows lack (text_rows.py)."""
        path = resolve_model_dir(name_or_path, revision=revision)
        config, codec_config, generation = load_configs(path)
        device = torch.device(device)
        tokenizer = TextTokenizer.from_folder(path)

        main_file = os.path.join(path, "model.safetensors")
        codec_file = os.path.join(path, "speech_tokenizer", "model.safetensors")
        for f in (main_file, codec_file):
            if not os.path.exists(f):
                raise WeightLoadError(f"{name_or_path}: missing weights file {os.path.relpath(f, path)}")
        tensors = read_safetensors(main_file)
        known = ("talker.", "speaker_encoder.")
        stray = sorted(k for k in tensors if not k.startswith(known))
        if stray:
            raise WeightLoadError(f"{name_or_path}: model.safetensors has {len(stray)} unexpected key(s): "
                                  + ", ".join(stray[:8]))

        talker = _build(Talker, config.talker, device, dtype)
        if text_embedding_device is not None and torch.device(text_embedding_device) != device:
            _move_text_embedding(talker, torch.device(text_embedding_device), device)
        load_into(talker, split_prefix(tensors, "talker."), what=f"{name_or_path} talker", prefix="talker.")

        speaker_encoder = None
        if config.tts_model_type == "base":
            from .speaker_encoder import SpeakerEncoder
            if config.speaker_encoder is None:
                raise WeightLoadError(f"{name_or_path}: a Base model needs speaker_encoder_config in config.json")
            # The official code keeps the speaker encoder in the model dtype; its mel front end is fp32.
            speaker_encoder = _build(SpeakerEncoder, config.speaker_encoder, device, dtype)
            load_into(speaker_encoder, split_prefix(tensors, "speaker_encoder."),
                      what=f"{name_or_path} speaker encoder", prefix="speaker_encoder.")
        elif any(k.startswith("speaker_encoder.") for k in tensors):
            raise WeightLoadError(f"{name_or_path}: speaker_encoder weights in a '{config.tts_model_type}' model")
        del tensors

        codec_tensors = read_safetensors(codec_file)
        codec_decoder = _build(CodecDecoder, codec_config.decoder, device, codec_dtype)
        load_into(codec_decoder, split_prefix(codec_tensors, "decoder."), what=f"{name_or_path} codec decoder",
                  prefix="decoder.")
        codec_encoder = None
        if config.tts_model_type == "base":
            from .codec_encoder import CodecEncoder
            codec_encoder = CodecEncoder(codec_config)
            codec_encoder.to(device=device, dtype=codec_dtype)
            load_into(codec_encoder, split_prefix(codec_tensors, "encoder."), what=f"{name_or_path} codec encoder",
                      prefix="encoder.")
            codec_encoder.eval()
        return cls(path=path, config=config, codec_config=codec_config, generation=generation, tokenizer=tokenizer,
                   talker=talker, codec_decoder=codec_decoder, speaker_encoder=speaker_encoder,
                   codec_encoder=codec_encoder, device=device, dtype=dtype)


def _move_text_embedding(talker: Talker, to: torch.device, device: torch.device) -> None:
    """An empty table on `to` that load_into fills, in place of the one built on the talker's device."""
    table = talker.model.text_embedding
    table.weight = torch.nn.Parameter(torch.empty_like(table.weight, device=to), requires_grad=False)
    if device.type == "cuda":
        torch.cuda.empty_cache()      # the built table's own segment, freed just now: not kept reserved


def _build(module_cls, cfg, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Build a module on its device, its parameters born in `dtype`. (Built normally, not on the meta device:
    modules keep derived, non-persistent buffers such as RoPE frequencies that a meta build would leave
    uninitialised.)

    Parameters are created in `dtype` directly (the default dtype during construction), not in fp32 and then
    cast: on a GPU the fp32 copies were freed blocks the caching allocator kept, and the smaller weights loaded
    into them left ~790 MiB reserved but unused for good (0.6B, session 21 call 1's allocator snapshot). The
    default dtype is process-wide: a load runs before the engine's threads start, nothing else makes tensors then."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            module = module_cls(cfg)
    finally:
        torch.set_default_dtype(previous)
    # Buffers (RoPE frequencies) are fp32 whatever the parameters are: each module builds them with an explicit
    # dtype; one that took the default dtype instead would have lost precision here.
    for name, b in module.named_buffers():
        if b.is_floating_point() and b.dtype != torch.float32:
            raise TypeError(f"{module_cls.__name__} buffer {name} was built in {b.dtype}, not float32")
    cast_parameters(module, dtype)         # any parameter a module made in a dtype of its own (fused groups whole)
    return module.eval().requires_grad_(False)
