"""Qwen3-TTS configuration, parsed from the real checkpoint files.

A checkpoint folder holds `config.json` (talker, code predictor, speaker encoder, special ids),
`generation_config.json` (sampling defaults) and `speech_tokenizer/config.json` (the 12 Hz codec).
Only the fields the math needs are typed here; the raw dicts are kept for anything else.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A checkpoint's configuration is missing something voxflow needs, or is not Qwen3-TTS."""


def _get(d: dict, key: str, where: str, default: Any = ...):
    if key in d:
        return d[key]
    if default is ...:
        raise ConfigError(f"{where}: missing required field '{key}'")
    return default


@dataclass
class DecoderStackConfig:
    """A Qwen3 decoder stack (used by the talker and the code predictor)."""
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "DecoderStackConfig":
        heads = _get(d, "num_attention_heads", where)
        hidden = _get(d, "hidden_size", where)
        return cls(
            hidden_size=hidden,
            intermediate_size=_get(d, "intermediate_size", where),
            num_hidden_layers=_get(d, "num_hidden_layers", where),
            num_attention_heads=heads,
            num_key_value_heads=_get(d, "num_key_value_heads", where, heads),
            head_dim=_get(d, "head_dim", where, hidden // heads),
            rms_norm_eps=float(_get(d, "rms_norm_eps", where, 1e-6)),
            rope_theta=float(_get(d, "rope_theta", where, 1e6)),
            max_position_embeddings=_get(d, "max_position_embeddings", where, 32768),
            vocab_size=_get(d, "vocab_size", where),
        )


@dataclass
class CodePredictorConfig(DecoderStackConfig):
    num_code_groups: int = 16


@dataclass
class TalkerConfig(DecoderStackConfig):
    text_vocab_size: int = 151936
    text_hidden_size: int = 2048
    num_code_groups: int = 16
    codec_eos_token_id: int = 2150
    codec_pad_id: int = 2148
    codec_bos_id: int = 2149
    codec_think_id: int = 2154
    codec_nothink_id: int = 2155
    codec_think_bos_id: int = 2156
    codec_think_eos_id: int = 2157
    codec_language_id: dict[str, int] = field(default_factory=dict)
    spk_id: dict[str, int] = field(default_factory=dict)
    spk_is_dialect: dict[str, Any] = field(default_factory=dict)
    code_predictor: CodePredictorConfig | None = None

    @classmethod
    def from_dict(cls, d: dict, where: str = "talker_config") -> "TalkerConfig":
        base = DecoderStackConfig.from_dict(d, where)
        cp_dict = _get(d, "code_predictor_config", where)
        cp_base = DecoderStackConfig.from_dict(cp_dict, where + ".code_predictor_config")
        cp = CodePredictorConfig(**vars(cp_base),
                                 num_code_groups=cp_dict.get("num_code_groups", d.get("num_code_groups", 16)))
        return cls(
            **vars(base),
            text_vocab_size=_get(d, "text_vocab_size", where, 151936),
            text_hidden_size=_get(d, "text_hidden_size", where, 2048),
            num_code_groups=_get(d, "num_code_groups", where, 16),
            codec_eos_token_id=_get(d, "codec_eos_token_id", where, 2150),
            codec_pad_id=_get(d, "codec_pad_id", where, 2148),
            codec_bos_id=_get(d, "codec_bos_id", where, 2149),
            codec_think_id=_get(d, "codec_think_id", where, 2154),
            codec_nothink_id=_get(d, "codec_nothink_id", where, 2155),
            codec_think_bos_id=_get(d, "codec_think_bos_id", where, 2156),
            codec_think_eos_id=_get(d, "codec_think_eos_id", where, 2157),
            codec_language_id={k.lower(): v for k, v in (d.get("codec_language_id") or {}).items()},
            spk_id={k.lower(): v for k, v in (d.get("spk_id") or {}).items()},
            spk_is_dialect={k.lower(): v for k, v in (d.get("spk_is_dialect") or {}).items()},
            code_predictor=cp,
        )


@dataclass
class SpeakerEncoderConfig:
    """ECAPA-TDNN x-vector extractor (Base checkpoints only)."""
    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: list[int] = field(default_factory=lambda: [512, 512, 512, 512, 1536])
    enc_kernel_sizes: list[int] = field(default_factory=lambda: [5, 3, 3, 3, 1])
    enc_dilations: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 1])
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def from_dict(cls, d: dict) -> "SpeakerEncoderConfig":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class CodecDecoderConfig:
    """The 12 Hz codec decoder ("Code2Wav")."""
    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 512
    latent_dim: int = 1024
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    layer_scale_initial_scale: float = 0.01
    num_quantizers: int = 16
    num_semantic_quantizers: int = 1
    vector_quantization_hidden_dimension: int = 512
    upsample_rates: list[int] = field(default_factory=lambda: [8, 5, 4, 3])
    upsampling_ratios: list[int] = field(default_factory=lambda: [2, 2])
    decoder_dim: int = 1536
    max_position_embeddings: int = 8000

    @classmethod
    def from_dict(cls, d: dict) -> "CodecDecoderConfig":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        cfg = cls(**known)
        if "head_dim" not in d:
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        return cfg

    @property
    def total_upsample(self) -> int:
        n = 1
        for r in list(self.upsample_rates) + list(self.upsampling_ratios):
            n *= r
        return n


@dataclass
class CodecConfig:
    """`speech_tokenizer/config.json` of the 12 Hz codec."""
    decoder: CodecDecoderConfig
    encoder: dict  # transformers MimiConfig fields, passed through to the Mimi encoder
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920

    @classmethod
    def from_dict(cls, d: dict) -> "CodecConfig":
        mt = d.get("model_type")
        if mt is not None and mt != "qwen3_tts_tokenizer_12hz":
            raise ConfigError(f"speech_tokenizer/config.json: model_type '{mt}' is not supported "
                              "(only the 12 Hz codec 'qwen3_tts_tokenizer_12hz')")
        cfg = cls(decoder=CodecDecoderConfig.from_dict(_get(d, "decoder_config", "speech_tokenizer")),
                  encoder=dict(_get(d, "encoder_config", "speech_tokenizer")),
                  encoder_valid_num_quantizers=d.get("encoder_valid_num_quantizers", 16),
                  input_sample_rate=d.get("input_sample_rate", 24000),
                  output_sample_rate=d.get("output_sample_rate", 24000),
                  decode_upsample_rate=d.get("decode_upsample_rate", 1920),
                  encode_downsample_rate=d.get("encode_downsample_rate", 1920))
        if cfg.decoder.total_upsample != cfg.decode_upsample_rate:
            raise ConfigError(f"speech_tokenizer/config.json: decoder upsampling {cfg.decoder.total_upsample} "
                              f"!= decode_upsample_rate {cfg.decode_upsample_rate}")
        return cfg


@dataclass
class GenerationDefaults:
    """`generation_config.json`, read as a plain dict as the official code does (section 5.1)."""
    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 2048

    @classmethod
    def from_dict(cls, d: dict) -> "GenerationDefaults":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


TASKS = ("custom_voice", "voice_design", "base")


@dataclass
class Qwen3TTSConfig:
    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig | None
    tts_model_type: str
    tts_model_size: str
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    assistant_token_id: int = 77091
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: dict) -> "Qwen3TTSConfig":
        mt = d.get("model_type")
        if mt is not None and mt != "qwen3_tts":
            raise ConfigError(f"config.json: model_type '{mt}' is not a Qwen3-TTS model (expected 'qwen3_tts')")
        tok_type = d.get("tokenizer_type", "qwen3_tts_tokenizer_12hz")
        if tok_type != "qwen3_tts_tokenizer_12hz":
            raise ConfigError(f"config.json: tokenizer_type '{tok_type}' is not supported (only the 12 Hz codec)")
        model_type = _get(d, "tts_model_type", "config.json")
        if model_type not in TASKS:
            raise ConfigError(f"config.json: unknown tts_model_type '{model_type}' (expected one of {TASKS})")
        spk = d.get("speaker_encoder_config")
        return cls(
            talker=TalkerConfig.from_dict(_get(d, "talker_config", "config.json")),
            speaker_encoder=SpeakerEncoderConfig.from_dict(spk) if (spk and model_type == "base") else None,
            tts_model_type=model_type,
            tts_model_size=str(d.get("tts_model_size", "")),
            im_start_token_id=d.get("im_start_token_id", 151644),
            im_end_token_id=d.get("im_end_token_id", 151645),
            tts_pad_token_id=d.get("tts_pad_token_id", 151671),
            tts_bos_token_id=d.get("tts_bos_token_id", 151672),
            tts_eos_token_id=d.get("tts_eos_token_id", 151673),
            assistant_token_id=d.get("assistant_token_id", 77091),
            raw=d,
        )

    @property
    def supports_instructions(self) -> bool:
        """The official wrapper drops CustomVoice instructions when the size tag is a substring of "0b6"."""
        if self.tts_model_type == "custom_voice":
            return not (self.tts_model_size in "0b6")
        return self.tts_model_type == "voice_design"


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"missing file: {path}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None


def load_configs(folder: str) -> tuple[Qwen3TTSConfig, CodecConfig, GenerationDefaults]:
    cfg = Qwen3TTSConfig.from_dict(read_json(os.path.join(folder, "config.json")))
    codec = CodecConfig.from_dict(read_json(os.path.join(folder, "speech_tokenizer", "config.json")))
    gen_path = os.path.join(folder, "generation_config.json")
    gen = GenerationDefaults.from_dict(read_json(gen_path)) if os.path.exists(gen_path) else GenerationDefaults()
    return cfg, codec, gen
