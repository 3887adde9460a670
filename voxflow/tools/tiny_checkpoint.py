"""Tiny, randomly initialised Qwen3-TTS (12 Hz) checkpoints in the EXACT file layout of the released repos.

No official package is needed: the key -> shape layout is derived from the configuration by
`checkpoint_layout` (model.safetensors) and `codec_layout` (speech_tokenizer/model.safetensors), which
reproduce every key and shape of the released checkpoints when fed their configs (`real_config`,
`real_codec_config`; tested against reference/qwen3_tts_weights.txt). Values come from numpy's
`np.random.default_rng`, seeded per tensor from (seed, key name), so the files are byte-identical across torch
versions and adding a key never shifts the values of the others.

What is kept real: text ids 151643-151645 / 151671-151673 and `text_vocab_size` 151936 (the text embedding keeps
its 151936 rows), codec vocab 3072 with the control ids 2148-2157, the 12 language ids and 9 speaker ids
(incl. the two dialect speakers), 16 code groups x 2048, the released generation_config.json, the codec's
rates (24 kHz, encoder strides [8,6,5,4] + x2, decoder [8,5,4,3] + [2,2] -> 1920 samples per frame,
sliding window 72, 32 encoder quantizers of which 16 are used) and the file set:

    config.json  generation_config.json  preprocessor_config.json  model.safetensors
    vocab.json  merges.txt  tokenizer_config.json        (no tokenizer.json, as in the real repos)
    speech_tokenizer/{config.json, preprocessor_config.json, model.safetensors}

What is tiny: widths and depths (talker H 64, 2 layers, 4 heads x 16, 2 kv heads, mrope [4,2,2]; code predictor
32, 2 layers, 4 x 8; text hidden 32; codec widths 32/64, codebook dim 16; speaker encoder channels
[32,32,32,32,96]) and the BPE merges (`voxflow.tools.tiny_tokenizer`: ~800 merges building whole-word tokens;
vocab.json keeps the real 151643 entries with unreachable fillers, added tokens 151643-151673 at their real ids).
About 43 MB per variant, most of it the 151936 x 32 text embedding and vocab.json.

Initialisation: linear/conv weights N(0, 1/fan_in) (codec decoder: residual-unit output convs x0.3, final
conv x0.06, so the random waveform has std ~0.15 and no clipping); biases N(0, 0.02); norm weights
1 + N(0, 0.05), norm biases N(0, 0.02); embeddings N(0, 1); codebook sums N(0, 1), cluster usage U(0.5, 2),
`initialized` 1; SnakeBeta alpha/beta N(0, 0.1); LayerScale 0.01; ConvNeXt gamma 0.1 + N(0, 0.02).
The `codec_head` row of codec_eos (2150) is scaled by 0.25 so random weights (practically) never stop early:
tests always get `max_new_tokens - 1` frames (force EOS by editing logits when a test needs it).

CLI:  python -m voxflow.tools.tiny_checkpoint --out DIR [--variants custom_voice voice_design base]
          [--size-tag 0b6|1b7] [--talker-hidden 64] [--cp-hidden 32] [--seed 1234]
      -> DIR/<variant>/ for each variant
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass

import numpy as np

from voxflow.tools.tiny_tokenizer import write_tokenizer_files

VARIANTS = ("custom_voice", "voice_design", "base")
DEFAULT_SEED = 1234

# Real ids from the released configs (talker_config.codec_language_id / spk_id / spk_is_dialect).
LANGUAGE_IDS = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
                "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
                "beijing_dialect": 2074, "sichuan_dialect": 2062}
SPEAKER_IDS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
               "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878}
SPEAKER_DIALECT = {name: False for name in SPEAKER_IDS} | {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
CODEC_IDS = {"codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
             "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149}
TEXT_IDS = {"im_start_token_id": 151644, "im_end_token_id": 151645, "tts_pad_token_id": 151671,
            "tts_bos_token_id": 151672, "tts_eos_token_id": 151673, "assistant_token_id": 77091}
TEXT_VOCAB_SIZE = 151936

# Released generation_config.json (245 bytes in every model repo).
GENERATION_CONFIG = {"do_sample": True, "max_new_tokens": 8192, "repetition_penalty": 1.05,
                     "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_k": 50,
                     "subtalker_top_p": 1.0, "temperature": 0.9, "top_k": 50, "top_p": 1.0}

# The model repos' `preprocessor_config.json` (127 B; these four keys, indent 2, no newline, is exactly 127 B).
PREPROCESSOR_CONFIG = {"padding_side": "left", "padding_value": 0.0, "processor_class": "Qwen3TTSProcessor",
                       "return_attention_mask": True}
# speech_tokenizer/preprocessor_config.json (EncodecFeatureExtractor; 234 B with HF's trailing newline).
CODEC_PREPROCESSOR_CONFIG = {"chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor",
                             "feature_size": 1, "overlap": None, "padding_side": "right", "padding_value": 0.0,
                             "return_attention_mask": True, "sampling_rate": 24000}

# Default size tag per variant ("0b6" makes the official wrapper drop CustomVoice instructions).
DEFAULT_SIZE_TAG = {"custom_voice": "0b6", "voice_design": "1b7", "base": "0b6"}
# `transformers_version` written into config.json. transformers 4.57.3 reads it when the official processor is
# loaded with fix_mistral_regex=True: a missing value or one in (4.57.2, 5.0) swaps the Qwen2 split regex for the
# "fixed Mistral" one (same ids for plain words; differs for contractions/camel case). Same value as the
# official tiny checkpoints.
TRANSFORMERS_VERSION = "4.57.3"

EOS_ROW_SCALE = 0.25
# Codec decoder gains: the residual branch of each SnakeBeta residual unit and the final conv are scaled so the
# random waveform stays well inside [-1, 1] (unscaled, every upsampling block grows the signal ~3x -> clipping).
RESIDUAL_GAIN = 0.3
OUTPUT_GAIN = 0.06


def mrope_section(head_dim: int) -> list[int]:
    """Interleaved MRoPE sections summing to head_dim/2, in the real ratio 24:20:20 ([24,20,20] for 128)."""
    half = head_dim // 2
    side = half * 20 // 64
    return [half - 2 * side, side, side]


# ----------------------------------------------------------------------------------------------------------
# Configurations
# ----------------------------------------------------------------------------------------------------------

def _stack_config(*, hidden, intermediate, layers, heads, kv_heads, head_dim, max_pos, vocab, model_type):
    return {"attention_bias": False, "attention_dropout": 0, "head_dim": head_dim, "hidden_act": "silu",
            "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": intermediate,
            "max_position_embeddings": max_pos, "model_type": model_type, "num_attention_heads": heads,
            "num_hidden_layers": layers, "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000, "sliding_window": None, "use_cache": True, "use_sliding_window": False,
            "vocab_size": vocab}


def _model_config(variant: str, size_tag: str, *, talker: dict, cp: dict, text_hidden: int,
                  speaker_encoder: dict) -> dict:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} (expected one of {VARIANTS})")
    if size_tag not in ("0b6", "1b7"):
        raise ValueError(f"size_tag must be '0b6' or '1b7', got {size_tag!r}")
    cp_cfg = _stack_config(vocab=2048, max_pos=65536, model_type="qwen3_tts_talker_code_predictor", **cp)
    cp_cfg.update(layer_types=["full_attention"] * cp["layers"], max_window_layers=28, num_code_groups=16,
                  rope_scaling=None)
    talker_cfg = _stack_config(vocab=3072, max_pos=32768, model_type="qwen3_tts_talker", **talker)
    talker_cfg.update(
        code_predictor_config=dict(sorted(cp_cfg.items())),
        rope_scaling={"interleaved": True, "mrope_section": mrope_section(talker["head_dim"]),
                      "rope_type": "default"},
        num_code_groups=16, text_hidden_size=text_hidden, text_vocab_size=TEXT_VOCAB_SIZE,
        position_id_per_seconds=13, codec_language_id=dict(LANGUAGE_IDS),
        spk_id=dict(SPEAKER_IDS) if variant == "custom_voice" else {},
        spk_is_dialect=dict(SPEAKER_DIALECT) if variant == "custom_voice" else {},
        **CODEC_IDS)
    cfg = {"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts", "dtype": "float32",
           "speaker_encoder_config": speaker_encoder, "talker_config": dict(sorted(talker_cfg.items())),
           "tokenizer_type": "qwen3_tts_tokenizer_12hz", "transformers_version": TRANSFORMERS_VERSION,
           "tts_model_size": size_tag, "tts_model_type": variant, **TEXT_IDS}
    return dict(sorted(cfg.items()))


def model_config(variant: str, *, size_tag: str | None = None, talker_hidden: int = 64, cp_hidden: int = 32,
                 text_hidden: int = 32) -> dict:
    """The tiny `config.json` dict. talker_hidden == cp_hidden -> small_to_mtp_projection is an Identity."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} (expected one of {VARIANTS})")
    for name, v in (("talker_hidden", talker_hidden), ("cp_hidden", cp_hidden), ("text_hidden", text_hidden)):
        if not isinstance(v, int) or v <= 0 or v % 2:
            raise ValueError(f"{name} must be a positive even int, got {v!r}")
    # Speaker encoder (real: channels [512,512,512,512,1536], attention 128, SE 128; enc_dim = H). Only the
    # declared keys: the official Qwen3TTSSpeakerEncoderConfig has no **kwargs.
    speaker_encoder = {"mel_dim": 128, "enc_dim": talker_hidden, "enc_channels": [32, 32, 32, 32, 96],
                       "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
                       "enc_attention_channels": 16, "enc_res2net_scale": 8, "enc_se_channels": 16,
                       "sample_rate": 24000}
    return _model_config(
        variant, size_tag or DEFAULT_SIZE_TAG[variant],
        talker=dict(hidden=talker_hidden, intermediate=2 * talker_hidden, layers=2, heads=4, kv_heads=2,
                    head_dim=16),
        cp=dict(hidden=cp_hidden, intermediate=2 * cp_hidden, layers=2, heads=4, kv_heads=2, head_dim=8),
        text_hidden=text_hidden, speaker_encoder=speaker_encoder)


def _normalise_size(size: str) -> str:
    s = str(size).lower().replace("-", "").replace("_", "")
    table = {"0b6": "0b6", "0.6b": "0b6", "0.6": "0b6", "06b": "0b6", "1b7": "1b7", "1.7b": "1b7", "1.7": "1b7",
             "17b": "1b7"}
    if s not in table:
        raise ValueError(f"unknown model size {size!r} (expected '0.6B'/'0b6' or '1.7B'/'1b7')")
    return table[s]


def real_config(variant: str, size: str) -> dict:
    """`config.json` with the dimensions of a released checkpoint (Qwen3-TTS-12Hz-{0.6B,1.7B}-{variant}).

    The speaker-encoder block carries only `enc_dim` and `sample_rate`, as the released files do (the other
    fields take the official defaults). There is no 0.6B VoiceDesign release: asking for it raises ValueError.
    """
    tag = _normalise_size(size)
    if variant == "voice_design" and tag == "0b6":
        raise ValueError("there is no released 0.6B VoiceDesign checkpoint")
    hidden = 1024 if tag == "0b6" else 2048
    return _model_config(
        variant, tag,
        talker=dict(hidden=hidden, intermediate=3 * hidden, layers=28, heads=16, kv_heads=8, head_dim=128),
        cp=dict(hidden=1024, intermediate=3072, layers=5, heads=16, kv_heads=8, head_dim=128),
        text_hidden=2048, speaker_encoder={"enc_dim": hidden, "sample_rate": 24000})


def _mimi_encoder_config(**overrides) -> dict:
    """transformers' MimiConfig fields (defaults = the real 12 Hz codec encoder)."""
    cfg = {"_frame_rate": 12.5, "attention_bias": False, "attention_dropout": 0.0, "audio_channels": 1,
           "codebook_dim": 256, "codebook_size": 2048, "compress": 2, "dilation_growth_rate": 2, "head_dim": 64,
           "hidden_act": "gelu", "hidden_size": 512, "initializer_range": 0.02, "intermediate_size": 2048,
           "kernel_size": 7, "last_kernel_size": 3, "layer_scale_initial_scale": 0.01,
           "max_position_embeddings": 8000, "model_type": "mimi", "norm_eps": 1e-05, "num_attention_heads": 8,
           "num_filters": 64, "num_hidden_layers": 8, "num_key_value_heads": 8, "num_quantizers": 32,
           "num_residual_layers": 1, "num_semantic_quantizers": 1, "pad_mode": "constant",
           "residual_kernel_size": 3, "rope_theta": 10000.0, "sampling_rate": 24000, "sliding_window": 250,
           "trim_right_ratio": 1.0, "upsample_groups": 512, "upsampling_ratios": [8, 6, 5, 4], "use_cache": False,
           "use_causal_conv": True, "use_conv_shortcut": False, "use_streaming": False,
           "vector_quantization_hidden_dimension": 256}
    cfg.update(overrides)
    return cfg


def _codec_decoder_config(**overrides) -> dict:
    """The 12 Hz codec decoder config (defaults = the real one)."""
    cfg = {"attention_bias": False, "attention_dropout": 0.0, "codebook_dim": 512, "codebook_size": 2048,
           "decoder_dim": 1536, "head_dim": 64, "hidden_act": "silu", "hidden_size": 512, "intermediate_size": 1024,
           "latent_dim": 1024, "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000,
           "model_type": "", "num_attention_heads": 16, "num_hidden_layers": 8, "num_key_value_heads": 16,
           "num_quantizers": 16, "num_semantic_quantizers": 1, "rms_norm_eps": 1e-05, "rope_theta": 10000,
           "semantic_codebook_size": 4096, "sliding_window": 72, "upsample_rates": [8, 5, 4, 3],
           "upsampling_ratios": [2, 2], "vector_quantization_hidden_dimension": 512}
    cfg.update(overrides)
    return cfg


def _codec_config(encoder: dict, decoder: dict) -> dict:
    return {"architectures": ["Qwen3TTSTokenizerV2Model"], "decode_upsample_rate": 1920,
            "decoder_config": decoder, "dtype": "float32", "encode_downsample_rate": 1920,
            "encoder_config": encoder, "encoder_valid_num_quantizers": 16, "input_sample_rate": 24000,
            "model_type": "qwen3_tts_tokenizer_12hz", "output_sample_rate": 24000,
            "transformers_version": TRANSFORMERS_VERSION}


def codec_config() -> dict:
    """The tiny `speech_tokenizer/config.json` dict: real rates/strides/window, tiny widths."""
    encoder = _mimi_encoder_config(codebook_dim=16, head_dim=8, hidden_size=32, intermediate_size=64,
                                   num_attention_heads=4, num_filters=8, num_hidden_layers=2, num_key_value_heads=4,
                                   upsample_groups=32, vector_quantization_hidden_dimension=16)
    decoder = _codec_decoder_config(codebook_dim=16, decoder_dim=64, head_dim=8, hidden_size=32,
                                    intermediate_size=64, latent_dim=32, num_attention_heads=4,
                                    num_hidden_layers=2, num_key_value_heads=4,
                                    vector_quantization_hidden_dimension=16)
    return _codec_config(encoder, decoder)


def real_codec_config() -> dict:
    """`speech_tokenizer/config.json` with the real codec dimensions (Qwen3-TTS-Tokenizer-12Hz)."""
    return _codec_config(_mimi_encoder_config(), _codec_decoder_config())


# ----------------------------------------------------------------------------------------------------------
# Layout: key -> shape (+ how to initialise it)
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    shape: tuple[int, ...]
    kind: str                # "normal" (std=a, mean=b) | "uniform" (a..b) | "const" (a) | "one_plus" (1 + N(0, a))
    a: float = 0.0
    b: float = 0.0


def _lin(out_f, in_f):
    return _Spec((out_f, in_f), "normal", 1.0 / math.sqrt(in_f))


def _conv(out_c, in_c_per_group, k, gain=1.0):
    return _Spec((out_c, in_c_per_group, k), "normal", gain / math.sqrt(in_c_per_group * k))


def _tconv(in_c, out_c, k, stride):  # ConvTranspose1d weight [in, out, k]; each output sees in*k/stride taps
    return _Spec((in_c, out_c, k), "normal", 1.0 / math.sqrt(max(1.0, in_c * k / stride)))


def _bias(n):
    return _Spec((n,), "normal", 0.02)


def _norm_w(n):
    return _Spec((n,), "one_plus", 0.05)


def _norm_b(n):
    return _Spec((n,), "normal", 0.02)


def _emb(rows, dim):
    return _Spec((rows, dim), "normal", 1.0)


def _get(d: dict, key: str, default=...):
    if key in d and d[key] is not None:
        return d[key]
    if default is ...:
        raise KeyError(f"config is missing '{key}'")
    return default


def _decoder_stack_specs(prefix: str, c: dict, *, defaults: dict) -> dict[str, _Spec]:
    """A Qwen3 decoder stack (talker or code predictor): layers.N.{self_attn, mlp, norms}."""
    hidden = _get(c, "hidden_size", defaults["hidden_size"])
    inter = _get(c, "intermediate_size", defaults["intermediate_size"])
    heads = _get(c, "num_attention_heads", defaults["num_attention_heads"])
    kv = _get(c, "num_key_value_heads", defaults["num_key_value_heads"])
    hd = _get(c, "head_dim", defaults["head_dim"] if defaults["head_dim"] is not None else hidden // heads)
    bias = bool(_get(c, "attention_bias", False))
    out: dict[str, _Spec] = {}
    for i in range(_get(c, "num_hidden_layers", defaults["num_hidden_layers"])):
        p = f"{prefix}layers.{i}."
        for name, (o, n) in (("q_proj", (heads * hd, hidden)), ("k_proj", (kv * hd, hidden)),
                             ("v_proj", (kv * hd, hidden)), ("o_proj", (hidden, heads * hd))):
            out[f"{p}self_attn.{name}.weight"] = _lin(o, n)
            if bias:
                out[f"{p}self_attn.{name}.bias"] = _bias(o)
        out[f"{p}self_attn.q_norm.weight"] = _norm_w(hd)
        out[f"{p}self_attn.k_norm.weight"] = _norm_w(hd)
        out[f"{p}mlp.gate_proj.weight"] = _lin(inter, hidden)
        out[f"{p}mlp.up_proj.weight"] = _lin(inter, hidden)
        out[f"{p}mlp.down_proj.weight"] = _lin(hidden, inter)
        out[f"{p}input_layernorm.weight"] = _norm_w(hidden)
        out[f"{p}post_attention_layernorm.weight"] = _norm_w(hidden)
    out[f"{prefix}norm.weight"] = _norm_w(hidden)
    return out


# Defaults of the official config classes (used when a field is absent, as the official code would).
_TALKER_DEFAULTS = dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=20, num_attention_heads=16,
                        num_key_value_heads=2, head_dim=None, vocab_size=3072, num_code_groups=32,
                        text_hidden_size=2048)
_CP_DEFAULTS = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
                    num_key_value_heads=8, head_dim=128, vocab_size=2048, num_code_groups=32)
_SPEAKER_DEFAULTS = dict(mel_dim=128, enc_dim=1024, enc_channels=[512, 512, 512, 512, 1536],
                         enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=128,
                         enc_res2net_scale=8, enc_se_channels=128)


def _speaker_encoder_specs(prefix: str, c: dict) -> dict[str, _Spec]:
    g = {k: _get(c, k, v) for k, v in _SPEAKER_DEFAULTS.items()}
    ch, ks, dil = g["enc_channels"], g["enc_kernel_sizes"], g["enc_dilations"]
    if not (len(ch) == len(ks) == len(dil)):
        raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations should have same length")
    scale, se, att = g["enc_res2net_scale"], g["enc_se_channels"], g["enc_attention_channels"]
    out: dict[str, _Spec] = {}

    def tdnn(p, cin, cout, k):
        out[p + "conv.weight"] = _conv(cout, cin, k)
        out[p + "conv.bias"] = _bias(cout)

    tdnn(f"{prefix}blocks.0.", g["mel_dim"], ch[0], ks[0])
    for i in range(1, len(ch) - 1):
        p = f"{prefix}blocks.{i}."
        tdnn(p + "tdnn1.", ch[i - 1], ch[i], 1)
        for j in range(scale - 1):
            tdnn(f"{p}res2net_block.blocks.{j}.", ch[i] // scale, ch[i] // scale, ks[i])
        tdnn(p + "tdnn2.", ch[i], ch[i], 1)
        out[p + "se_block.conv1.weight"] = _conv(se, ch[i], 1)
        out[p + "se_block.conv1.bias"] = _bias(se)
        out[p + "se_block.conv2.weight"] = _conv(ch[i], se, 1)
        out[p + "se_block.conv2.bias"] = _bias(ch[i])
    tdnn(f"{prefix}mfa.", ch[-1], ch[-1], ks[-1])
    tdnn(f"{prefix}asp.tdnn.", ch[-1] * 3, att, 1)
    out[f"{prefix}asp.conv.weight"] = _conv(ch[-1], att, 1)
    out[f"{prefix}asp.conv.bias"] = _bias(ch[-1])
    out[f"{prefix}fc.weight"] = _conv(g["enc_dim"], ch[-1] * 2, 1)
    out[f"{prefix}fc.bias"] = _bias(g["enc_dim"])
    return out


def _model_specs(config: dict) -> dict[str, _Spec]:
    t = config["talker_config"]
    cp = _get(t, "code_predictor_config", {})
    H = _get(t, "hidden_size", _TALKER_DEFAULTS["hidden_size"])
    vocab = _get(t, "vocab_size", _TALKER_DEFAULTS["vocab_size"])
    text_hidden = _get(t, "text_hidden_size", _TALKER_DEFAULTS["text_hidden_size"])
    text_vocab = _get(t, "text_vocab_size")  # not a constructor argument: must be in config.json
    cpH = _get(cp, "hidden_size", _CP_DEFAULTS["hidden_size"])
    cp_vocab = _get(cp, "vocab_size", _CP_DEFAULTS["vocab_size"])
    groups = _get(cp, "num_code_groups", _CP_DEFAULTS["num_code_groups"])

    out = _decoder_stack_specs("talker.model.", t, defaults=_TALKER_DEFAULTS)
    out["talker.model.codec_embedding.weight"] = _emb(vocab, H)
    out["talker.model.text_embedding.weight"] = _emb(text_vocab, text_hidden)
    out["talker.text_projection.linear_fc1.weight"] = _lin(text_hidden, text_hidden)
    out["talker.text_projection.linear_fc1.bias"] = _bias(text_hidden)
    out["talker.text_projection.linear_fc2.weight"] = _lin(H, text_hidden)
    out["talker.text_projection.linear_fc2.bias"] = _bias(H)
    out["talker.codec_head.weight"] = _lin(vocab, H)
    out.update(_decoder_stack_specs("talker.code_predictor.model.", cp, defaults=_CP_DEFAULTS))
    for g in range(groups - 1):
        out[f"talker.code_predictor.model.codec_embedding.{g}.weight"] = _emb(cp_vocab, H)
    for g in range(groups - 1):
        out[f"talker.code_predictor.lm_head.{g}.weight"] = _lin(cp_vocab, cpH)
    if cpH != H:
        out["talker.code_predictor.small_to_mtp_projection.weight"] = _lin(cpH, H)
        out["talker.code_predictor.small_to_mtp_projection.bias"] = _bias(cpH)
    if config.get("tts_model_type") == "base":
        out.update(_speaker_encoder_specs("speaker_encoder.", config.get("speaker_encoder_config") or {}))
    return out


def _mimi_encoder_specs(prefix: str, c: dict) -> dict[str, _Spec]:
    """transformers' MimiModel without its decoder half (= Qwen3TTSTokenizerV2Encoder), incl. codebook buffers."""
    if c.get("use_conv_shortcut"):
        raise NotImplementedError("use_conv_shortcut=True is not used by the 12 Hz codec")
    nf, hidden = c["num_filters"], c["hidden_size"]
    ratios = list(c["upsampling_ratios"])
    out: dict[str, _Spec] = {}

    def conv(p, cin, cout, k, bias=True):
        out[p + "conv.weight"] = _conv(cout, cin, k)
        if bias:
            out[p + "conv.bias"] = _bias(cout)

    conv(f"{prefix}encoder.layers.0.", c["audio_channels"], nf, c["kernel_size"])
    idx, scaling = 1, 1
    for ratio in reversed(ratios):
        cur = scaling * nf
        for _ in range(c["num_residual_layers"]):
            p = f"{prefix}encoder.layers.{idx}.block."
            conv(p + "1.", cur, cur // c["compress"], c["residual_kernel_size"])
            conv(p + "3.", cur // c["compress"], cur, 1)
            idx += 1
        idx += 1  # ELU
        conv(f"{prefix}encoder.layers.{idx}.", cur, cur * 2, ratio * 2)
        idx += 1
        scaling *= 2
    idx += 1  # ELU
    conv(f"{prefix}encoder.layers.{idx}.", scaling * nf, hidden, c["last_kernel_size"])

    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or hidden // heads
    for i in range(c["num_hidden_layers"]):
        p = f"{prefix}encoder_transformer.layers.{i}."
        for name, (o, n) in (("q_proj", (heads * hd, hidden)), ("k_proj", (kv * hd, hidden)),
                             ("v_proj", (kv * hd, hidden)), ("o_proj", (hidden, heads * hd))):
            out[f"{p}self_attn.{name}.weight"] = _lin(o, n)
            if c.get("attention_bias"):
                out[f"{p}self_attn.{name}.bias"] = _bias(o)
        out[p + "mlp.fc1.weight"] = _lin(c["intermediate_size"], hidden)
        out[p + "mlp.fc2.weight"] = _lin(hidden, c["intermediate_size"])
        for ln in ("input_layernorm", "post_attention_layernorm"):
            out[f"{p}{ln}.weight"] = _norm_w(hidden)
            out[f"{p}{ln}.bias"] = _norm_b(hidden)
        out[p + "self_attn_layer_scale.scale"] = _Spec((hidden,), "const", c["layer_scale_initial_scale"])
        out[p + "mlp_layer_scale.scale"] = _Spec((hidden,), "const", c["layer_scale_initial_scale"])

    hop = math.prod(ratios)
    encodec_frame_rate = math.ceil(c["sampling_rate"] / hop)
    frame_rate = c.get("_frame_rate") or c.get("frame_rate") or c["sampling_rate"] / (hop * 2)
    if frame_rate != encodec_frame_rate:
        conv(f"{prefix}downsample.", hidden, hidden, 2 * int(encodec_frame_rate / frame_rate), bias=False)

    cb_dim = c.get("codebook_dim") or hidden
    vq_hidden = c["vector_quantization_hidden_dimension"]
    n_sem = c["num_semantic_quantizers"]
    for name, n in (("semantic", n_sem), ("acoustic", c["num_quantizers"] - n_sem)):
        p = f"{prefix}quantizer.{name}_residual_vector_quantizer."
        for i in range(n):
            q = f"{p}layers.{i}.codebook."
            out[q + "initialized"] = _Spec((1,), "const", 1.0)
            out[q + "cluster_usage"] = _Spec((c["codebook_size"],), "uniform", 0.5, 2.0)
            out[q + "embed_sum"] = _Spec((c["codebook_size"], cb_dim), "normal", 1.0)
        if vq_hidden != hidden:
            out[p + "input_proj.weight"] = _conv(vq_hidden, hidden, 1)
            out[p + "output_proj.weight"] = _conv(hidden, vq_hidden, 1)
    return out


def _codec_decoder_specs(prefix: str, c: dict) -> dict[str, _Spec]:
    """Qwen3TTSTokenizerV2Decoder (code -> waveform)."""
    hidden, latent, cb = c["hidden_size"], c["latent_dim"], c["codebook_dim"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or hidden // heads
    out: dict[str, _Spec] = {}
    ls = c.get("layer_scale_initial_scale", 0.01)
    for i in range(c["num_hidden_layers"]):
        p = f"{prefix}pre_transformer.layers.{i}."
        for name, (o, n) in (("q_proj", (heads * hd, hidden)), ("k_proj", (kv * hd, hidden)),
                             ("v_proj", (kv * hd, hidden)), ("o_proj", (hidden, heads * hd))):
            out[f"{p}self_attn.{name}.weight"] = _lin(o, n)
            if c.get("attention_bias"):
                out[f"{p}self_attn.{name}.bias"] = _bias(o)
        out[p + "mlp.gate_proj.weight"] = _lin(c["intermediate_size"], hidden)
        out[p + "mlp.up_proj.weight"] = _lin(c["intermediate_size"], hidden)
        out[p + "mlp.down_proj.weight"] = _lin(hidden, c["intermediate_size"])
        out[p + "input_layernorm.weight"] = _norm_w(hidden)
        out[p + "post_attention_layernorm.weight"] = _norm_w(hidden)
        out[p + "self_attn_layer_scale.scale"] = _Spec((hidden,), "const", ls)
        out[p + "mlp_layer_scale.scale"] = _Spec((hidden,), "const", ls)
    out[f"{prefix}pre_transformer.norm.weight"] = _norm_w(hidden)
    out[f"{prefix}pre_transformer.input_proj.weight"] = _lin(hidden, latent)
    out[f"{prefix}pre_transformer.input_proj.bias"] = _bias(hidden)
    out[f"{prefix}pre_transformer.output_proj.weight"] = _lin(latent, hidden)
    out[f"{prefix}pre_transformer.output_proj.bias"] = _bias(latent)

    dim = cb // 2
    n_sem = c.get("num_semantic_quantizers", 1)
    for name, n in (("rvq_first", n_sem), ("rvq_rest", c["num_quantizers"] - n_sem)):
        p = f"{prefix}quantizer.{name}."
        out[p + "input_proj.weight"] = _conv(dim, cb, 1)
        out[p + "output_proj.weight"] = _conv(cb, dim, 1)
        for i in range(n):
            out[f"{p}vq.layers.{i}._codebook.cluster_usage"] = _Spec((c["codebook_size"],), "uniform", 0.5, 2.0)
            out[f"{p}vq.layers.{i}._codebook.embedding_sum"] = _Spec((c["codebook_size"], dim), "normal", 1.0)

    out[f"{prefix}pre_conv.conv.weight"] = _conv(latent, cb, 3)
    out[f"{prefix}pre_conv.conv.bias"] = _bias(latent)
    for i, factor in enumerate(c["upsampling_ratios"]):
        p = f"{prefix}upsample.{i}."
        out[p + "0.conv.weight"] = _tconv(latent, latent, factor, factor)
        out[p + "0.conv.bias"] = _bias(latent)
        out[p + "1.gamma"] = _Spec((latent,), "normal", 0.02, 0.1)
        out[p + "1.dwconv.conv.weight"] = _conv(latent, 1, 7)
        out[p + "1.dwconv.conv.bias"] = _bias(latent)
        out[p + "1.norm.weight"] = _norm_w(latent)
        out[p + "1.norm.bias"] = _norm_b(latent)
        out[p + "1.pwconv1.weight"] = _lin(4 * latent, latent)
        out[p + "1.pwconv1.bias"] = _bias(4 * latent)
        out[p + "1.pwconv2.weight"] = _lin(latent, 4 * latent)
        out[p + "1.pwconv2.bias"] = _bias(latent)

    def snake(p, n):
        out[p + "alpha"] = _Spec((n,), "normal", 0.1)
        out[p + "beta"] = _Spec((n,), "normal", 0.1)

    D = c["decoder_dim"]
    out[f"{prefix}decoder.0.conv.weight"] = _conv(D, latent, 7)
    out[f"{prefix}decoder.0.conv.bias"] = _bias(D)
    rates = list(c["upsample_rates"])
    for i, r in enumerate(rates):
        cin, cout = D // 2 ** i, D // 2 ** (i + 1)
        p = f"{prefix}decoder.{i + 1}.block."
        snake(p + "0.", cin)
        out[p + "1.conv.weight"] = _tconv(cin, cout, 2 * r, r)
        out[p + "1.conv.bias"] = _bias(cout)
        for j in range(3):  # residual units, dilations 1, 3, 9
            q = f"{p}{j + 2}."
            snake(q + "act1.", cout)
            out[q + "conv1.conv.weight"] = _conv(cout, cout, 7)
            out[q + "conv1.conv.bias"] = _bias(cout)
            snake(q + "act2.", cout)
            out[q + "conv2.conv.weight"] = _conv(cout, cout, 1, gain=RESIDUAL_GAIN)
            out[q + "conv2.conv.bias"] = _bias(cout)
    last = D // 2 ** len(rates)
    snake(f"{prefix}decoder.{len(rates) + 1}.", last)
    out[f"{prefix}decoder.{len(rates) + 2}.conv.weight"] = _conv(1, last, 7, gain=OUTPUT_GAIN)
    out[f"{prefix}decoder.{len(rates) + 2}.conv.bias"] = _bias(1)
    return out


def _codec_specs(codec_cfg: dict) -> dict[str, _Spec]:
    out = _mimi_encoder_specs("encoder.", codec_cfg["encoder_config"])
    out.update(_codec_decoder_specs("decoder.", codec_cfg["decoder_config"]))
    return out


def checkpoint_layout(config: dict) -> dict[str, tuple[int, ...]]:
    """Every key of `model.safetensors` with its shape, derived from a `config.json` dict."""
    return {k: s.shape for k, s in _model_specs(config).items()}


def codec_layout(codec_cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every key of `speech_tokenizer/model.safetensors` with its shape, from `speech_tokenizer/config.json`."""
    return {k: s.shape for k, s in _codec_specs(codec_cfg).items()}


def layouts(config: dict, codec_cfg: dict) -> dict[str, dict[str, tuple[int, ...]]]:
    """Both weight files of a checkpoint folder: {relative path: {key: shape}}."""
    return {"model.safetensors": checkpoint_layout(config),
            "speech_tokenizer/model.safetensors": codec_layout(codec_cfg)}


# ----------------------------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------------------------

def _rng(seed: int, key: str) -> np.random.Generator:
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng([int(seed), h])


def _value(seed: int, key: str, spec: _Spec) -> np.ndarray:
    n = math.prod(spec.shape)
    if spec.kind == "const":
        arr = np.full(n, spec.a, dtype=np.float64)
    elif spec.kind == "uniform":
        arr = _rng(seed, key).uniform(spec.a, spec.b, n)
    elif spec.kind == "normal":
        arr = _rng(seed, key).standard_normal(n) * spec.a + spec.b
    elif spec.kind == "one_plus":
        arr = 1.0 + _rng(seed, key).standard_normal(n) * spec.a
    else:  # pragma: no cover
        raise ValueError(spec.kind)
    return arr.astype(np.float32).reshape(spec.shape)


def make_tensors(specs: dict[str, _Spec], seed: int) -> dict[str, np.ndarray]:
    return {k: _value(seed, k, s) for k, s in specs.items()}


def model_tensors(config: dict, seed: int = DEFAULT_SEED) -> dict[str, np.ndarray]:
    """The float32 tensors of `model.safetensors` for a config (used by write_tiny_checkpoint)."""
    tensors = make_tensors(_model_specs(config), seed)
    eos = config["talker_config"].get("codec_eos_token_id", CODEC_IDS["codec_eos_token_id"])
    head = tensors["talker.codec_head.weight"]
    if 0 <= eos < head.shape[0]:
        head[eos] *= np.float32(EOS_ROW_SCALE)
    return tensors


def codec_tensors(codec_cfg: dict, seed: int = DEFAULT_SEED) -> dict[str, np.ndarray]:
    return make_tensors(_codec_specs(codec_cfg), seed)


# ----------------------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------------------

def _write_json(path: str, obj: dict, *, trailing_newline: bool = True, sort_keys: bool = False) -> None:
    text = json.dumps(obj, indent=2, sort_keys=sort_keys, ensure_ascii=False)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text + ("\n" if trailing_newline else ""))


def _save_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file
    save_file({k: np.ascontiguousarray(v) for k, v in sorted(tensors.items())}, path, metadata={"format": "pt"})


def write_tiny_checkpoint(out_dir: str | os.PathLike, variant: str, *, seed: int = DEFAULT_SEED,
                          size_tag: str | None = None, talker_hidden: int = 64, cp_hidden: int = 32,
                          text_hidden: int = 32) -> str:
    """Write one tiny checkpoint folder INTO `out_dir` (created; existing files there are overwritten).

    variant: "custom_voice" | "voice_design" | "base". size_tag: "0b6" | "1b7" (default: custom_voice/base
    "0b6", voice_design "1b7"). talker_hidden == cp_hidden gives the 0.6B-like Identity small_to_mtp_projection.
    Returns the folder path (str).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} (expected one of {VARIANTS})")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    out_dir = os.fspath(out_dir)
    st_dir = os.path.join(out_dir, "speech_tokenizer")
    os.makedirs(st_dir, exist_ok=True)

    cfg = model_config(variant, size_tag=size_tag, talker_hidden=talker_hidden, cp_hidden=cp_hidden,
                       text_hidden=text_hidden)
    codec = codec_config()
    _write_json(os.path.join(out_dir, "config.json"), cfg)
    _write_json(os.path.join(out_dir, "generation_config.json"), GENERATION_CONFIG, trailing_newline=False)
    _write_json(os.path.join(out_dir, "preprocessor_config.json"), PREPROCESSOR_CONFIG, trailing_newline=False)
    write_tokenizer_files(out_dir)
    _save_safetensors(os.path.join(out_dir, "model.safetensors"), model_tensors(cfg, seed))

    _write_json(os.path.join(st_dir, "config.json"), codec, sort_keys=True)
    _write_json(os.path.join(st_dir, "preprocessor_config.json"), CODEC_PREPROCESSOR_CONFIG, sort_keys=True)
    _save_safetensors(os.path.join(st_dir, "model.safetensors"), codec_tensors(codec, seed))
    return out_dir


def write_all(out_dir: str | os.PathLike, *, seed: int = DEFAULT_SEED, variants=VARIANTS, **kwargs) -> dict[str, str]:
    """Write `out_dir/<variant>/` for each variant; returns {variant: path}. kwargs go to write_tiny_checkpoint."""
    return {v: write_tiny_checkpoint(os.path.join(os.fspath(out_dir), v), v, seed=seed, **kwargs)
            for v in variants}


def _folder_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m voxflow.tools.tiny_checkpoint",
        description="Write tiny random Qwen3-TTS checkpoints in the real file layout (one folder per variant).")
    ap.add_argument("--out", required=True, help="output directory; one sub-folder per variant")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--size-tag", choices=["0b6", "1b7"], default=None,
                    help="tts_model_size (default: custom_voice/base 0b6, voice_design 1b7)")
    ap.add_argument("--talker-hidden", type=int, default=64, help="talker hidden size H (real: 1024 / 2048)")
    ap.add_argument("--cp-hidden", type=int, default=32,
                    help="code-predictor hidden (real: 1024); equal to --talker-hidden -> Identity projection")
    ap.add_argument("--text-hidden", type=int, default=32, help="text embedding width (real: 2048)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--clean", action="store_true", help="delete each variant folder before writing it")
    args = ap.parse_args(argv)
    for variant in args.variants:
        path = os.path.join(args.out, variant)
        if args.clean:
            shutil.rmtree(path, ignore_errors=True)
        t0 = time.perf_counter()
        write_tiny_checkpoint(path, variant, seed=args.seed, size_tag=args.size_tag,
                              talker_hidden=args.talker_hidden, cp_hidden=args.cp_hidden,
                              text_hidden=args.text_hidden)
        print(f"wrote {variant:13s} -> {path} ({_folder_size(path) / 1e6:.1f} MB, "
              f"{time.perf_counter() - t0:.2f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
