"""voxflow.tools.tiny_checkpoint: tiny random Qwen3-TTS checkpoints in the real layout."""
from __future__ import annotations

import hashlib
import json
import math
import os
import re

import numpy as np
import pytest
from safetensors import safe_open

from voxflow.models.qwen3_tts.config import load_configs
from voxflow.tools import tiny_checkpoint as tc
from voxflow.tools import tiny_tokenizer as tt

# reference/qwen3_tts_weights.txt (every key and shape of the released checkpoints): a copy under tests/fixtures/
# wins, else $VOXFLOW_REFERENCE_DIR, else the shared reference folder; the full comparison is skipped without it
# (the element/tensor counts below are checked regardless).
_FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "qwen3_tts_weights.txt")
WEIGHTS_TXT = _FIXTURE if os.path.exists(_FIXTURE) else os.path.join(
    os.environ.get("VOXFLOW_REFERENCE_DIR", "/work/shared/reference"), "qwen3_tts_weights.txt")

MODEL_FILES = {"config.json", "generation_config.json", "preprocessor_config.json", "model.safetensors",
               "vocab.json", "merges.txt", "tokenizer_config.json", "speech_tokenizer"}
CODEC_FILES = {"config.json", "preprocessor_config.json", "model.safetensors"}


def _hash_tree(path: str) -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _read(path: str) -> dict[str, np.ndarray]:
    with safe_open(path, "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _header(path: str) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict]:
    with safe_open(path, "np") as f:
        meta = f.metadata()
        return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}, meta


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    paths = tc.write_all(str(root / "seed1234"), seed=1234)
    paths["h64"] = tc.write_tiny_checkpoint(str(root / "h64"), "custom_voice", seed=1234, size_tag="1b7",
                                            talker_hidden=64, cp_hidden=64)
    return root, paths


# ---------------------------------------------------------------------------------------------- files & configs

def test_file_set_like_the_real_repos(tiny):
    _, paths = tiny
    for variant in tc.VARIANTS:
        d = paths[variant]
        assert set(os.listdir(d)) == MODEL_FILES, variant  # no tokenizer.json, no special_tokens_map.json
        assert set(os.listdir(os.path.join(d, "speech_tokenizer"))) == CODEC_FILES
        with open(os.path.join(d, "generation_config.json"), "rb") as f:
            raw = f.read()
        assert len(raw) == 245 and json.loads(raw) == tc.GENERATION_CONFIG  # released file: 245 B
        assert os.path.getsize(os.path.join(d, "preprocessor_config.json")) == 127
        assert os.path.getsize(os.path.join(d, "speech_tokenizer", "preprocessor_config.json")) == 234


def test_configs_parse_with_voxflow_loader(tiny):
    _, paths = tiny
    for variant in tc.VARIANTS:
        cfg, codec, gen = load_configs(paths[variant])
        assert cfg.tts_model_type == variant
        assert cfg.tts_model_size == tc.DEFAULT_SIZE_TAG[variant]
        t = cfg.talker
        assert (t.hidden_size, t.head_dim, t.num_attention_heads, t.num_key_value_heads) == (64, 16, 4, 2)
        assert t.code_predictor.hidden_size == 32 and t.code_predictor.head_dim == 8
        assert t.vocab_size == 3072 and t.text_vocab_size == 151936 and t.num_code_groups == 16
        assert t.codec_language_id == tc.LANGUAGE_IDS
        assert t.spk_id == (tc.SPEAKER_IDS if variant == "custom_voice" else {})
        assert (cfg.speaker_encoder is not None) == (variant == "base")
        assert (cfg.im_start_token_id, cfg.im_end_token_id, cfg.tts_pad_token_id, cfg.tts_bos_token_id,
                cfg.tts_eos_token_id) == (151644, 151645, 151671, 151672, 151673)
        assert codec.decoder.total_upsample == 1920 == codec.decode_upsample_rate
        assert codec.decoder.sliding_window == 72 and codec.encoder_valid_num_quantizers == 16
        assert gen.max_new_tokens == 8192 and gen.top_k == 50 and gen.repetition_penalty == 1.05
    cfg, _, _ = load_configs(paths["h64"])
    assert cfg.talker.hidden_size == cfg.talker.code_predictor.hidden_size == 64
    assert cfg.tts_model_size == "1b7" and cfg.supports_instructions


def test_config_json_details(tiny):
    _, paths = tiny
    for variant in tc.VARIANTS:
        with open(os.path.join(paths[variant], "config.json")) as f:
            cfg = json.load(f)
        assert cfg["model_type"] == "qwen3_tts" and cfg["architectures"] == ["Qwen3TTSForConditionalGeneration"]
        assert cfg["tokenizer_type"] == "qwen3_tts_tokenizer_12hz"
        t = cfg["talker_config"]
        rs = t["rope_scaling"]
        assert rs["interleaved"] is True and sum(rs["mrope_section"]) == t["head_dim"] // 2
        assert t["text_vocab_size"] == 151936 and "head_dim" in t["code_predictor_config"]
        # The official Qwen3TTSSpeakerEncoderConfig has no **kwargs: only declared keys are allowed.
        assert set(cfg["speaker_encoder_config"]) <= {"mel_dim", "enc_dim", "enc_channels", "enc_kernel_sizes",
                                                      "enc_dilations", "enc_attention_channels",
                                                      "enc_res2net_scale", "enc_se_channels", "sample_rate"}
        if variant == "custom_voice":
            assert t["spk_is_dialect"]["eric"] == "sichuan_dialect"
            assert t["spk_is_dialect"]["dylan"] == "beijing_dialect"
        else:
            assert t["spk_id"] == {} and t["spk_is_dialect"] == {}


def test_mrope_section():
    assert tc.mrope_section(128) == [24, 20, 20]
    assert tc.mrope_section(16) == [4, 2, 2]
    for hd in (8, 16, 32, 64, 96, 128, 256):
        assert sum(tc.mrope_section(hd)) == hd // 2


# ---------------------------------------------------------------------------------------------- weights

def test_weight_files_follow_the_layout(tiny):
    _, paths = tiny
    for name in (*tc.VARIANTS, "h64"):
        d = paths[name]
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        with open(os.path.join(d, "speech_tokenizer", "config.json")) as f:
            codec = json.load(f)
        header, meta = _header(os.path.join(d, "model.safetensors"))
        assert meta == {"format": "pt"}
        assert {k: s for k, (s, _) in header.items()} == tc.checkpoint_layout(cfg)
        assert {dt for _, dt in header.values()} == {"F32"}
        has_proj = "talker.code_predictor.small_to_mtp_projection.weight" in header
        assert has_proj == (name != "h64")
        assert any(k.startswith("speaker_encoder.") for k in header) == (name == "base")
        assert header["talker.model.text_embedding.weight"][0] == (151936, 32)
        cheader, cmeta = _header(os.path.join(d, "speech_tokenizer", "model.safetensors"))
        assert cmeta == {"format": "pt"}
        assert {k: s for k, (s, _) in cheader.items()} == tc.codec_layout(codec)
        n_codebooks = sum(k.endswith(".codebook.embed_sum") for k in cheader)
        assert n_codebooks == 32
        for suffix in ("initialized", "cluster_usage", "embed_sum"):
            assert sum(k.endswith(".codebook." + suffix) for k in cheader) == 32


def test_values_are_sensible(tiny):
    _, paths = tiny
    w = _read(os.path.join(paths["base"], "model.safetensors"))
    c = _read(os.path.join(paths["base"], "speech_tokenizer", "model.safetensors"))
    for k, v in {**w, **c}.items():
        assert v.dtype == np.float32 and np.isfinite(v).all(), k
    norm = w["talker.model.layers.0.input_layernorm.weight"]
    assert abs(norm.mean() - 1) < 0.05 and 0 < norm.std() < 0.2
    q = w["talker.model.layers.0.self_attn.q_proj.weight"]
    assert abs(q.std() - 1 / math.sqrt(q.shape[1])) < 0.3 / math.sqrt(q.shape[1])
    head = w["talker.codec_head.weight"]
    assert np.linalg.norm(head[2150]) < 0.5 * np.median(np.linalg.norm(head[:2048], axis=1))  # EOS row damped
    for k, v in c.items():
        if k.endswith("initialized"):
            assert v.tolist() == [1.0]
        elif k.endswith("cluster_usage"):
            assert v.min() >= 0.5 and v.max() <= 2.0
        elif k.endswith(("embed_sum", "embedding_sum")):
            assert 0.9 < v.std() < 1.1
        elif k.endswith("layer_scale.scale"):
            assert np.all(v == np.float32(0.01))
        elif k.endswith((".alpha", ".beta")):
            assert 0.03 < v.std() < 0.3
    # different tensors draw from different streams
    assert not np.array_equal(w["talker.model.layers.0.mlp.gate_proj.weight"],
                              w["talker.model.layers.0.mlp.up_proj.weight"])


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tiny, tmp_path):
    _, paths = tiny
    again = tc.write_tiny_checkpoint(str(tmp_path / "again"), "custom_voice", seed=1234)
    assert _hash_tree(again) == _hash_tree(paths["custom_voice"])

    other = tc.write_tiny_checkpoint(str(tmp_path / "other"), "custom_voice", seed=99)
    h1, h2 = _hash_tree(paths["custom_voice"]), _hash_tree(other)
    assert h1["model.safetensors"] != h2["model.safetensors"]
    assert h1[os.path.join("speech_tokenizer", "model.safetensors")] != h2[os.path.join("speech_tokenizer",
                                                                                        "model.safetensors")]
    for name in ("config.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        assert h1[name] == h2[name]
    a = _read(os.path.join(paths["custom_voice"], "model.safetensors"))
    b = _read(os.path.join(other, "model.safetensors"))
    assert a.keys() == b.keys()
    for k in ("talker.codec_head.weight", "talker.model.text_embedding.weight",
              "talker.model.layers.1.self_attn.k_norm.weight"):
        assert not np.array_equal(a[k], b[k]), k


def test_cli_writes_the_same_files(tiny, tmp_path):
    _, paths = tiny
    assert tc.main(["--out", str(tmp_path), "--variants", "voice_design", "--seed", "1234"]) == 0
    assert _hash_tree(str(tmp_path / "voice_design")) == _hash_tree(paths["voice_design"])


def test_bad_arguments():
    with pytest.raises(ValueError):
        tc.model_config("speech")
    with pytest.raises(ValueError):
        tc.model_config("base", size_tag="7b")
    with pytest.raises(ValueError):
        tc.real_config("voice_design", "0.6B")


# ---------------------------------------------------------------------------------------------- real layouts

# From qwen3_tts_weights.txt (official classes, released configs): elements and tensor counts.
REAL_COUNTS = {("base", "0.6B"): (914_643_008, 478), ("custom_voice", "0.6B"): (905_788_672, 402),
               ("base", "1.7B"): (1_928_677_440, 480), ("custom_voice", "1.7B"): (1_916_676_352, 404),
               ("voice_design", "1.7B"): (1_916_676_352, 404)}


@pytest.mark.parametrize("variant,size", sorted(REAL_COUNTS))
def test_real_config_counts(variant, size):
    layout = tc.checkpoint_layout(tc.real_config(variant, size))
    total, tensors = REAL_COUNTS[(variant, size)]
    assert len(layout) == tensors
    assert sum(math.prod(s) for s in layout.values()) == total


def test_real_codec_counts():
    layout = tc.codec_layout(tc.real_codec_config())
    assert len(layout) == 496
    assert sum(math.prod(s) for s in layout.values()) == 170_557_441
    enc = sum(math.prod(s) for k, s in layout.items() if k.startswith("encoder."))
    buffers = sum(math.prod(s) for k, s in layout.items() if k.startswith("encoder.") and
                  k.endswith((".initialized", ".cluster_usage", ".embed_sum")))
    assert enc == 56_234_304 and enc - buffers == 39_391_520
    assert sum(math.prod(s) for k, s in layout.items() if k.startswith("decoder.")) == 114_323_137


def _parse_weights_txt(path: str):
    sections: dict[str, dict[str, tuple[int, ...]]] = {}
    counts: dict[str, tuple[int, int, dict[str, int]]] = {}
    current = None
    in_counts = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("# =="):
                title = line.strip("# =").strip()
                in_counts = title.startswith("parameter counts")
                current = None if in_counts else sections.setdefault(title, {})
                continue
            if not line.strip() or line.startswith("#"):
                continue
            if in_counts:
                if line.startswith("  "):
                    group, n = line.strip().split("\t")
                    counts[last][2][group] = int(n.replace(",", ""))
                else:
                    name, *rest = line.split("\t")
                    total = int(re.search(r"total (?:stored elements )?([\d,]+)", line).group(1).replace(",", ""))
                    n_t = int(re.search(r"tensors (\d+)", line).group(1))
                    last = name
                    counts[name] = (total, n_t, {})
                continue
            key, shape = line.split("\t")
            current[key] = tuple(json.loads(shape))
    return sections, counts


def _group_prefixes(group: str) -> list[str]:
    m = re.fullmatch(r"(.*)\{(.*)\}", group)
    if not m:
        return [group]
    return [m.group(1) + re.sub(r"\.\d+-\d+$", "", alt) for alt in m.group(2).split(",")]


@pytest.mark.skipif(not os.path.exists(WEIGHTS_TXT), reason="reference/qwen3_tts_weights.txt not available")
def test_layout_reproduces_reference_weight_list():
    sections, counts = _parse_weights_txt(WEIGHTS_TXT)
    model_sections = [t for t in sections if "model.safetensors" in t and not t.startswith("speech_tokenizer")]
    assert model_sections, "no model section found"
    for title in model_sections:
        m = re.match(r"Qwen3-TTS-12Hz-([\d.]+B)-(Base|CustomVoice|VoiceDesign)", title)
        variant = {"Base": "base", "CustomVoice": "custom_voice", "VoiceDesign": "voice_design"}[m.group(2)]
        assert tc.checkpoint_layout(tc.real_config(variant, m.group(1))) == sections[title], title
    codec_title = next(t for t in sections if t.startswith("speech_tokenizer/model.safetensors"))
    assert tc.codec_layout(tc.real_codec_config()) == sections[codec_title]
    # parameter-count table: totals, tensor counts and per-group sums for every listed release
    checked = 0
    for name, (total, n_tensors, groups) in counts.items():
        m = re.match(r"Qwen3-TTS-12Hz-([\d.]+B)-(Base|CustomVoice|VoiceDesign)", name)
        if not m:
            continue
        variant = {"Base": "base", "CustomVoice": "custom_voice", "VoiceDesign": "voice_design"}[m.group(2)]
        layout = tc.checkpoint_layout(tc.real_config(variant, m.group(1)))
        assert (sum(math.prod(s) for s in layout.values()), len(layout)) == (total, n_tensors), name
        for group, n in groups.items():
            prefixes = tuple(_group_prefixes(group))
            assert sum(math.prod(s) for k, s in layout.items() if k.startswith(prefixes)) == n, (name, group)
        checked += 1
    assert checked >= 4


@pytest.mark.parametrize("which", ["tiny", "real"])
def test_codec_encoder_layout_matches_transformers_mimi(which):
    torch = pytest.importorskip("torch")
    mimi = pytest.importorskip("transformers.models.mimi")
    enc_cfg = (tc.codec_config() if which == "tiny" else tc.real_codec_config())["encoder_config"]
    config = mimi.MimiConfig.from_dict(enc_cfg)
    with torch.device("meta"):
        model = mimi.MimiModel(config)
    keep = ("encoder.", "encoder_transformer.", "downsample.", "quantizer.")
    expected = {"encoder." + k: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith(keep)}
    ours = {k: s for k, s in tc.codec_layout({"encoder_config": enc_cfg,
                                              "decoder_config": tc.codec_config()["decoder_config"]}).items()
            if k.startswith("encoder.")}
    assert ours == expected


def test_real_configs_parse_with_voxflow_loader(tmp_path):
    for variant, size, hidden in (("base", "0.6B", 1024), ("custom_voice", "1b7", 2048),
                                  ("voice_design", "1.7B", 2048)):
        d = tmp_path / f"{variant}-{size}"
        (d / "speech_tokenizer").mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(tc.real_config(variant, size)))
        (d / "speech_tokenizer" / "config.json").write_text(json.dumps(tc.real_codec_config()))
        cfg, codec, _ = load_configs(str(d))
        assert cfg.talker.hidden_size == hidden and cfg.talker.head_dim == 128
        assert cfg.talker.num_hidden_layers == 28 and cfg.talker.code_predictor.num_hidden_layers == 5
        assert cfg.talker.text_hidden_size == 2048 and codec.decoder.latent_dim == 1024


# ---------------------------------------------------------------------------------------------- tokenizer

def test_tokenizer_files_and_template_lengths(tiny):
    _, paths = tiny
    d = paths["voice_design"]
    with open(os.path.join(d, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    assert sorted(vocab.values()) == list(range(151643))  # real size, no holes
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        tcfg = json.load(f)
    assert tcfg["tokenizer_class"] == "Qwen2Tokenizer"
    added = {int(k): v["content"] for k, v in tcfg["added_tokens_decoder"].items()}
    assert sorted(added) == list(range(151643, 151674))
    for tok, idx in tt.SPECIAL_TOKENS.items():
        assert added[idx] == tok
    with open(os.path.join(d, "merges.txt"), encoding="utf-8") as f:
        assert f.readline() == "#version: 0.2\n"

    tok = tt.load_fast_tokenizer(d)
    assert len(tok.encode("<|im_start|>assistant\n").ids) == 3
    assert tok.encode("<|im_start|>assistant\n").ids[0] == 151644
    assert tok.encode("<|im_end|>\n<|im_start|>assistant\n").ids == [151645, 198, 151644,
                                                                        tok.token_to_id("assistant"), 198]
    assert len(tok.encode("<|im_start|>assistant\nHello world.<|im_end|>\n<|im_start|>assistant\n").ids) == 11
    assert len(tok.encode("<|im_start|>user\nSpeak happily.<|im_end|>\n").ids) == 8
    assert len(tok.encode("<|im_start|>assistant\nThe quick brown fox.<|im_end|>\n").ids) == 10
    assert [tok.token_to_id(t) for t in ("<tts_pad>", "<tts_text_bos>", "<tts_text_eod>", "<|endoftext|>")] == \
        [151671, 151672, 151673, 151643]
    for text in ("Hello world.", "Qwen3 TTS says: it's 12:30, héllo 你好!\n  ok", "user assistant system"):
        assert tok.decode(tok.encode(text).ids) == text
    for w in tt.WORDS:
        assert len(tok.encode(w).ids) == 1, w


def test_transformers_qwen2_tokenizer_agrees(tiny):
    transformers = pytest.importorskip("transformers")
    _, paths = tiny
    d = paths["base"]
    fast = transformers.Qwen2TokenizerFast.from_pretrained(d)
    ours = tt.load_fast_tokenizer(d)
    for text in ("<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>assistant\n",
                 "<|im_start|>user\nSpeak happily.<|im_end|>\n", "Hello world. The quick brown fox!",
                 "<tts_pad><tts_text_bos>x<tts_text_eod>"):
        assert fast(text)["input_ids"] == ours.encode(text).ids, text
    assert len(fast) == 151674


def test_bpe_trainer_is_deterministic_and_complete():
    words = ["hello", " world", "help", " help", "assistant", "aaaa", "abab"]
    v1, m1 = tt.train_bpe(words)
    v2, m2 = tt.train_bpe(list(words))
    assert (v1, m1) == (v2, m2)
    for w in words:
        assert len(tt.bpe_encode_chunk(w, m1)) == 1
    assert len(tt.byte_alphabet()) == 256 and tt.byte_alphabet()[:3] == ["!", '"', "#"]
