"""voxflow's modules at the REAL 0.6B / 1.7B / codec shapes accept the released checkpoints' key names.

The modules are built on the meta device from configs with the released dimensions and checked, key for key
and shape for shape, with the same check the loader applies (`weights.check_keys`), against the key list of
the released files in ../shared/reference/qwen3_tts_weights.txt (a copy is in tests/fixtures). For the models
whose full key list is not recorded there, the tensor and element counts of the released files are compared.
"""
import os
import re

import pytest
import torch

from voxflow.models.qwen3_tts.codec_decoder import CodecDecoder
from voxflow.models.qwen3_tts.codec_encoder import CodecEncoder
from voxflow.models.qwen3_tts.config import CodecConfig, Qwen3TTSConfig
from voxflow.models.qwen3_tts.speaker_encoder import SpeakerEncoder
from voxflow.models.qwen3_tts.talker import Talker
from voxflow.models.qwen3_tts.weights import WeightLoadError, check_keys
from voxflow.tools.tiny_checkpoint import real_codec_config, real_config

WEIGHTS_TXT = os.path.join(os.path.dirname(__file__), "fixtures", "qwen3_tts_weights.txt")


def released_sections() -> dict[str, dict[str, tuple]]:
    sections, current = {}, None
    with open(WEIGHTS_TXT) as f:
        for line in f:
            m = re.match(r"# == (.+?)(?: \(.*\))? ==", line)
            if m:
                current = sections.setdefault(m.group(1), {})
                continue
            if current is not None and "\t[" in line:
                key, shape = line.rstrip("\n").split("\t")
                current[key] = tuple(int(x) for x in shape.strip("[]").split(",") if x.strip())
    return sections


RELEASED = released_sections()
# Tensor and element counts of the released model.safetensors files (qwen3_tts_weights.txt, header).
RELEASED_COUNTS = {("base", "0.6B"): (478, 914_643_008), ("custom_voice", "0.6B"): (402, 905_788_672),
                   ("base", "1.7B"): (480, 1_928_677_440), ("custom_voice", "1.7B"): (404, 1_916_676_352),
                   ("voice_design", "1.7B"): (404, 1_916_676_352)}


def meta_state(variant: str, size: str) -> dict[str, torch.Tensor]:
    cfg = Qwen3TTSConfig.from_dict(real_config(variant, size))
    with torch.device("meta"):
        state = {"talker." + k: v for k, v in Talker(cfg.talker).state_dict().items()}
        if cfg.speaker_encoder is not None:
            state.update({"speaker_encoder." + k: v for k, v in SpeakerEncoder(cfg.speaker_encoder).state_dict().items()})
    return state


def test_reference_key_list_is_present():
    assert "Qwen3-TTS-12Hz-1.7B-Base: model.safetensors" in RELEASED
    assert len(RELEASED["Qwen3-TTS-12Hz-1.7B-Base: model.safetensors"]) == 480


def test_1p7b_base_accepts_every_released_key_and_shape():
    released = RELEASED["Qwen3-TTS-12Hz-1.7B-Base: model.safetensors"]
    cfg = Qwen3TTSConfig.from_dict(real_config("base", "1.7B"))
    with torch.device("meta"):
        talker, speaker = Talker(cfg.talker), SpeakerEncoder(cfg.speaker_encoder)
    strip = lambda p: {k[len(p):]: v for k, v in released.items() if k.startswith(p)}  # noqa: E731
    check_keys(talker, strip("talker."), what="1.7B talker", prefix="talker.")
    check_keys(speaker, strip("speaker_encoder."), what="1.7B speaker encoder", prefix="speaker_encoder.")
    assert len(strip("talker.")) + len(strip("speaker_encoder.")) == len(released)


@pytest.mark.parametrize("variant, size", sorted(RELEASED_COUNTS))
def test_tensor_and_parameter_counts_match_released_files(variant, size):
    state = meta_state(variant, size)
    tensors, elements = RELEASED_COUNTS[(variant, size)]
    assert len(state) == tensors
    assert sum(v.numel() for v in state.values()) == elements


def test_0p6b_has_identity_projection_and_1p7b_a_linear_one():
    small = meta_state("custom_voice", "0.6B")
    big = meta_state("custom_voice", "1.7B")
    assert not any("small_to_mtp_projection" in k for k in small)
    assert big["talker.code_predictor.small_to_mtp_projection.weight"].shape == (1024, 2048)
    assert small["talker.model.layers.0.self_attn.q_proj.weight"].shape == (2048, 1024)   # head_dim 128, not H/16


def test_codec_accepts_every_released_key_and_shape():
    released = RELEASED["speech_tokenizer/model.safetensors"]
    codec = CodecConfig.from_dict(real_codec_config())
    with torch.device("meta"):
        decoder = CodecDecoder(codec.decoder)
        encoder = CodecEncoder(codec)
    strip = lambda p: {k[len(p):]: v for k, v in released.items() if k.startswith(p)}  # noqa: E731
    check_keys(decoder, strip("decoder."), what="codec decoder", prefix="decoder.")
    check_keys(encoder, strip("encoder."), what="codec encoder", prefix="encoder.")
    assert len(strip("decoder.")) + len(strip("encoder.")) == len(released)


def test_check_keys_reports_missing_unexpected_and_misshaped():
    released = RELEASED["Qwen3-TTS-12Hz-1.7B-Base: model.safetensors"]
    cfg = Qwen3TTSConfig.from_dict(real_config("base", "1.7B"))
    with torch.device("meta"):
        talker = Talker(cfg.talker)
    shapes = {k[len("talker."):]: v for k, v in released.items() if k.startswith("talker.")}
    shapes.pop("codec_head.weight")
    shapes["model.layers.0.mlp.up_proj.weight"] = (1, 1)
    shapes["model.extra.weight"] = (3,)
    with pytest.raises(WeightLoadError) as e:
        check_keys(talker, shapes, what="broken", prefix="talker.")
    msg = str(e.value)
    assert "talker.codec_head.weight" in msg and "talker.model.extra.weight" in msg
    assert "talker.model.layers.0.mlp.up_proj.weight: checkpoint (1, 1)" in msg
