"""Prompt builder (spec section 3): layouts, per-task rules, errors, and the section 3.5 lengths."""
import importlib.util
import os

import pytest
import torch

from voxflow.models.qwen3_tts.config import Qwen3TTSConfig, load_configs
from voxflow.models.qwen3_tts.prompt import (
    Prompt, PromptError, PromptRequest, build_prompt, codec_think_ids, default_non_streaming_mode,
    supported_languages, supported_speakers,
)
from voxflow.models.qwen3_tts.tokenizer import TextTokenizer

H = 8
LANGS = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071, "spanish": 2054,
         "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069, "beijing_dialect": 2074,
         "sichuan_dialect": 2062}
SPEAKERS = {"Serena": 3066, "Vivian": 3065, "Uncle_Fu": 3010, "Ryan": 3061, "Aiden": 2861, "Ono_Anna": 2873,
            "Sohee": 2864, "Eric": 2875, "Dylan": 2878}
DIALECT = {"Eric": "sichuan_dialect", "Dylan": "beijing_dialect"}
PAD, BOS, THINK, NOTHINK, THINK_BOS, THINK_EOS = 2148, 2149, 2154, 2155, 2156, 2157
TTS_PAD, TTS_BOS, TTS_EOS = 151671, 151672, 151673


def make_config(model_type="custom_voice", size="0b6", hidden=H) -> Qwen3TTSConfig:
    stack = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=4, vocab_size=3072)
    talker = dict(stack, codec_language_id=dict(LANGS), text_vocab_size=151936,
                  code_predictor_config=dict(stack, vocab_size=2048))
    if model_type == "custom_voice":
        talker["spk_id"] = dict(SPEAKERS)
        talker["spk_is_dialect"] = {k: DIALECT.get(k, False) for k in SPEAKERS}
    return Qwen3TTSConfig.from_dict(dict(model_type="qwen3_tts", tts_model_type=model_type, tts_model_size=size,
                                         talker_config=talker))


class FakeEmbedder:
    """Deterministic, id-distinct vectors: text, codec and code-predictor tables never collide."""

    def __init__(self, hidden=H):
        self.hidden = hidden
        self.j = torch.arange(hidden, dtype=torch.float64)

    def _vec(self, ids, salt):
        ids = ids.to(torch.float64).reshape(-1, 1)
        return torch.sin(0.37 * self.j * (salt + 1) + 1.618 * ids + salt).to(torch.float32)

    def embed_text(self, ids):
        return self._vec(ids, 0.0)

    def embed_codec(self, ids):
        return self._vec(ids, 100.0)

    def embed_frame(self, codes):
        out = self.embed_codec(codes[:, 0])
        for g in range(1, codes.shape[1]):
            out = out + self._vec(codes[:, g], 200.0 + g)
        return out


E = FakeEmbedder()


def T(*ids):
    return E.embed_text(torch.tensor(ids))


def C(*ids):
    return E.embed_codec(torch.tensor(ids))


_spec = importlib.util.spec_from_file_location("_tok_helpers", os.path.join(os.path.dirname(__file__),
                                                                             "test_tokenizer.py"))
_tok_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tok_helpers)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return TextTokenizer.from_folder(_tok_helpers.write_byte_level_tokenizer(str(tmp_path_factory.mktemp("tok"))))


def build(tok, cfg=None, **kw):
    cfg = cfg or make_config()
    return build_prompt(cfg, tok, E, PromptRequest(**kw))


def text_ids(tok, text):
    return tok.encode(text)  # no template: the text's own ids (positional slicing agrees for plain text)


def prefix(tok, codec_ids, speaker_row=None):
    """Role + codec prefix rows, built by hand from the spec."""
    role = T(*tok.encode("<|im_start|>assistant\n"))
    rows = [C(*codec_ids)]
    if speaker_row is not None:
        rows.append(speaker_row)
    rows.append(C(PAD))
    codec = torch.cat(rows)
    text_side = torch.cat([T(TTS_PAD).expand(codec.shape[0] - 1, -1), T(TTS_BOS)])
    return torch.cat([role, text_side + codec])


def assert_same(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------------------
# Capabilities and defaults


def test_supported_speakers_and_languages():
    cfg = make_config()
    assert supported_speakers(cfg) == sorted(k.lower() for k in SPEAKERS)
    langs = supported_languages(cfg)
    assert langs[0] == "auto" and "english" in langs and not any("dialect" in x for x in langs)
    assert len(langs) == 11
    assert supported_speakers(make_config("base")) == []


def test_default_non_streaming_mode(tok):
    assert default_non_streaming_mode("custom_voice") is True
    assert default_non_streaming_mode("voice_design") is True
    assert default_non_streaming_mode("base") is False
    with pytest.raises(PromptError, match="unknown task"):
        default_non_streaming_mode("clone")
    assert build(tok, text="hello", speaker="vivian").layout == "non_streaming"
    assert build(tok, _base_cfg(), text="hello", x_vector=torch.zeros(H)).layout == "streaming"


# ---------------------------------------------------------------------------------------------------------
# Layout structure with the fake embedder


def test_non_streaming_layout(tok):
    p = build(tok, text="hello world", speaker="Vivian", language="English", non_streaming_mode=True)
    t = text_ids(tok, "hello world")
    think = [THINK, THINK_BOS, LANGS["english"], THINK_EOS]
    pre = prefix(tok, think, C(SPEAKERS["Vivian"]))
    assert pre.shape[0] == 3 + 6  # role + (L - 1), L = 7
    body = torch.cat([T(*t), T(TTS_EOS)]) + C(PAD)  # position k: T(t_k) + C(codec_pad)
    expected = torch.cat([pre, body, T(TTS_PAD) + C(BOS)])
    assert_same(p.inputs_embeds, expected)
    assert_same(p.trailing_text, T(TTS_PAD))
    assert_same(p.tts_pad_embed, T(TTS_PAD)[0])
    assert p.layout == "non_streaming" and p.length == 3 + 6 + len(t) + 2
    assert p.codec_ids == think + [SPEAKERS["Vivian"], PAD, BOS]
    for k, tk in enumerate(t):
        assert torch.equal(p.inputs_embeds[9 + k], (T(tk) + C(PAD))[0])


def test_streaming_layout(tok):
    p = build(tok, text="hello world", speaker="vivian", language="english", non_streaming_mode=False)
    t = text_ids(tok, "hello world")
    pre = prefix(tok, [THINK, THINK_BOS, LANGS["english"], THINK_EOS], C(SPEAKERS["Vivian"]))
    assert_same(p.inputs_embeds, torch.cat([pre, T(t[0]) + C(BOS)]))
    assert_same(p.trailing_text, torch.cat([T(*t[1:]), T(TTS_EOS)]))
    assert p.layout == "streaming" and p.trailing_text.shape[0] == len(t)


def test_streaming_single_token_text(tok):
    p = build(tok, text="hello", speaker="vivian", non_streaming_mode=False)
    assert p.trailing_text.shape[0] == 1
    assert_same(p.trailing_text, T(TTS_EOS))


def test_text_ids_are_the_whole_template(tok):
    p = build(tok, text="hello", speaker="vivian")
    assert p.text_ids == tok.encode("<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>assistant\n")


def test_voice_design_has_no_speaker_slot_and_leads_with_the_instruction(tok):
    cfg = make_config("voice_design", "1b7")
    p = build(tok, cfg, text="hello", instruction="hello world", non_streaming_mode=True)
    instr = tok.encode("<|im_start|>user\nhello world<|im_end|>\n")
    assert p.instruct_ids == instr
    t = text_ids(tok, "hello")
    expected = torch.cat([T(*instr), prefix(tok, [NOTHINK, THINK_BOS, THINK_EOS]),
                          torch.cat([T(*t), T(TTS_EOS)]) + C(PAD), T(TTS_PAD) + C(BOS)])
    assert_same(p.inputs_embeds, expected)
    assert p.codec_ids == [NOTHINK, THINK_BOS, THINK_EOS, PAD, BOS]


def _base_cfg():
    return make_config("base", "0b6")


def test_base_x_vector_only_uses_the_raw_x_vector(tok):
    xv = torch.linspace(-1, 1, H)
    p = build(tok, _base_cfg(), text="hello world", language="english", x_vector=xv)
    assert p.layout == "streaming"  # the official default for base
    t = text_ids(tok, "hello world")
    pre = prefix(tok, [THINK, THINK_BOS, LANGS["english"], THINK_EOS], xv.reshape(1, H))
    assert_same(p.inputs_embeds, torch.cat([pre, T(t[0]) + C(BOS)]))
    assert p.codec_ids[4] is None


def _icl(tok, text, n_ref_frames, non_streaming):
    codes = (torch.arange(n_ref_frames * 16).reshape(n_ref_frames, 16) * 7) % 2048
    xv = torch.linspace(-1, 1, H)
    p = build(tok, _base_cfg(), text=text, language="auto", x_vector=xv, ref_text="hello",
              ref_codes=codes, non_streaming_mode=non_streaming)
    ref = tok.encode("hello")
    t = text_ids(tok, text)
    text_seq = torch.cat([T(*(ref + t)), T(TTS_EOS)])
    codec_seq = torch.cat([C(BOS), E.embed_frame(codes)])
    pre = prefix(tok, [NOTHINK, THINK_BOS, THINK_EOS], xv.reshape(1, H))
    return p, pre, text_seq, codec_seq


def test_icl_streaming_text_longer_than_codec(tok):
    p, pre, text_seq, codec_seq = _icl(tok, "hello world hello world", 2, False)
    t1, t2 = text_seq.shape[0], codec_seq.shape[0]
    assert t1 > t2
    assert_same(p.inputs_embeds, torch.cat([pre, text_seq[:t2] + codec_seq]))
    assert_same(p.trailing_text, text_seq[t2:])
    assert p.layout == "icl_streaming"


def test_icl_streaming_text_not_longer_than_codec(tok):
    p, pre, text_seq, codec_seq = _icl(tok, "hello", 13, False)
    t1, t2 = text_seq.shape[0], codec_seq.shape[0]
    assert t1 <= t2
    padded = torch.cat([text_seq, T(TTS_PAD).expand(t2 - t1, -1)])
    assert_same(p.inputs_embeds, torch.cat([pre, padded + codec_seq]))
    assert_same(p.trailing_text, T(TTS_PAD))
    assert p.length == pre.shape[0] + t2


def test_icl_streaming_equal_lengths(tok):
    ref_len = len(tok.encode("hello"))
    t = text_ids(tok, "hello")
    n_frames = ref_len + len(t)  # T1 = ref + text + 1 = T2 = frames + 1
    p, pre, text_seq, codec_seq = _icl(tok, "hello", n_frames, False)
    assert text_seq.shape[0] == codec_seq.shape[0]
    assert_same(p.inputs_embeds, torch.cat([pre, text_seq + codec_seq]))
    assert_same(p.trailing_text, T(TTS_PAD))


def test_icl_non_streaming(tok):
    p, pre, text_seq, codec_seq = _icl(tok, "hello world", 4, True)
    assert_same(p.inputs_embeds, torch.cat([pre, text_seq + C(PAD), codec_seq + T(TTS_PAD)]))
    assert_same(p.trailing_text, T(TTS_PAD))
    assert p.layout == "icl_non_streaming"
    assert p.ref_ids == tok.encode("<|im_start|>assistant\nhello<|im_end|>\n")


# ---------------------------------------------------------------------------------------------------------
# Per-task rules


def test_case_insensitive_speaker_and_language(tok):
    a = build(tok, text="hello", speaker="VIVIAN", language="EnGlIsH")
    b = build(tok, text="hello", speaker="vivian", language="english")
    assert_same(a.inputs_embeds, b.inputs_embeds)
    assert a.speaker == "vivian" and a.language == "english"
    c = build(tok, text="hello", speaker="uncle_fu", language="Auto")
    d = build(tok, text="hello", speaker="Uncle_Fu", language=None)
    assert_same(c.inputs_embeds, d.inputs_embeds)


@pytest.mark.parametrize("speaker,language,expected", [
    ("eric", "auto", [THINK, THINK_BOS, LANGS["sichuan_dialect"], THINK_EOS]),
    ("Eric", "Chinese", [THINK, THINK_BOS, LANGS["sichuan_dialect"], THINK_EOS]),
    ("dylan", "auto", [THINK, THINK_BOS, LANGS["beijing_dialect"], THINK_EOS]),
    ("eric", "english", [THINK, THINK_BOS, LANGS["english"], THINK_EOS]),
    ("vivian", "chinese", [THINK, THINK_BOS, LANGS["chinese"], THINK_EOS]),
    ("vivian", "auto", [NOTHINK, THINK_BOS, THINK_EOS]),
])
def test_dialect_rule(tok, speaker, language, expected):
    p = build(tok, text="hello", speaker=speaker, language=language)
    assert p.codec_ids[:-3] == expected
    cfg = make_config()
    assert codec_think_ids(cfg, language.lower(), speaker.lower()) == expected


def test_instruction_dropped_on_0b6_custom_voice(tok):
    with_instr = build(tok, make_config("custom_voice", "0b6"), text="hello", speaker="ryan", instruction="hello")
    without = build(tok, make_config("custom_voice", "0b6"), text="hello", speaker="ryan")
    assert with_instr.instruction_dropped and with_instr.instruct_ids is None
    assert_same(with_instr.inputs_embeds, without.inputs_embeds)


def test_instruction_kept_on_1b7_custom_voice(tok):
    cfg = make_config("custom_voice", "1b7")
    p = build(tok, cfg, text="hello", speaker="ryan", instruction="hello", non_streaming_mode=False)
    without = build(tok, cfg, text="hello", speaker="ryan", non_streaming_mode=False)
    instr = tok.encode("<|im_start|>user\nhello<|im_end|>\n")
    assert not p.instruction_dropped and p.instruct_ids == instr
    assert_same(p.inputs_embeds, torch.cat([T(*instr), without.inputs_embeds]))
    # an empty instruction means no instruction (as in the official wrapper)
    assert_same(build(tok, cfg, text="hello", speaker="ryan", instruction="", non_streaming_mode=False).inputs_embeds,
                without.inputs_embeds)


# ---------------------------------------------------------------------------------------------------------
# Errors


def _err(tok, match, cfg=None, **kw):
    with pytest.raises(PromptError, match=match):
        build(tok, cfg, **kw)


def test_errors_speaker_and_language(tok):
    _err(tok, r"unknown speaker 'bob'; available: aiden, dylan, eric", text="hi", speaker="bob")
    _err(tok, r"custom_voice needs a speaker; available: aiden", text="hi")
    _err(tok, r"unsupported language 'Klingon'; supported: auto, chinese, english", text="hi", speaker="ryan",
         language="Klingon")
    _err(tok, r"unsupported language 'sichuan_dialect'", text="hi", speaker="eric", language="sichuan_dialect")
    _err(tok, r"no built-in speakers", make_config("voice_design", "1b7"), text="hi", speaker="vivian",
         instruction="x")
    _err(tok, r"no built-in speakers", _base_cfg(), text="hi", speaker="vivian", x_vector=torch.zeros(H))


def test_errors_text_task_instruction(tok):
    _err(tok, "text is empty", text="", speaker="ryan")
    _err(tok, "text is empty", text="  \n", speaker="ryan")
    _err(tok, "cannot serve a base request", text="hi", speaker="ryan", task="base")
    _err(tok, "unknown task", text="hi", speaker="ryan", task="clone")
    _err(tok, "voice_design needs an instruction", make_config("voice_design", "1b7"), text="hi")
    _err(tok, "voice_design needs an instruction", make_config("voice_design", "1b7"), text="hi", instruction="")
    _err(tok, "take no instruction", _base_cfg(), text="hi", x_vector=torch.zeros(H), instruction="calm")
    _err(tok, "only used by base", text="hi", speaker="ryan", x_vector=torch.zeros(H))


def test_errors_voice_clone_inputs(tok):
    base = _base_cfg()
    codes = torch.zeros(3, 16, dtype=torch.long)
    _err(tok, "needs an x_vector", base, text="hi")
    _err(tok, f"must have {H} values", base, text="hi", x_vector=torch.zeros(H + 1))
    _err(tok, "needs ref_text", base, text="hi", x_vector=torch.zeros(H), ref_codes=codes)
    _err(tok, "without ref_codes", base, text="hi", x_vector=torch.zeros(H), ref_text="hello")
    _err(tok, r"shape \[R >= 1, 16\]", base, text="hi", x_vector=torch.zeros(H), ref_text="hello",
         ref_codes=torch.zeros(3, 8, dtype=torch.long))
    _err(tok, "integer", base, text="hi", x_vector=torch.zeros(H), ref_text="hello", ref_codes=codes.float())
    _err(tok, r"\[0, 2048\)", base, text="hi", x_vector=torch.zeros(H), ref_text="hello", ref_codes=codes + 2048)
    _err(tok, r"\[0, 2048\)", base, text="hi", x_vector=torch.zeros(H), ref_text="hello", ref_codes=codes - 1)
    # host codes are checked even when marked known-good (only GPU codes skip the blocking read)
    _err(tok, r"\[0, 2048\)", base, text="hi", x_vector=torch.zeros(H), ref_text="hello", ref_codes=codes + 2048,
         ref_codes_checked=True)


def test_error_tokenizer_that_breaks_the_template():
    class CharTokenizer:  # one id per character: "assistant" is 9 ids, positional slicing would be wrong
        def encode(self, text):
            return [ord(c) for c in text]
    with pytest.raises(PromptError, match="chat template"):
        build_prompt(make_config(), CharTokenizer(), E, PromptRequest(text="hi", speaker="ryan"))


def test_template_check_runs_once_per_tokenizer_and_a_failing_one_fails_every_time(tok):
    class Counting:
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def encode(self, text):
            self.calls += 1
            return self.inner.encode(text)

    counting = Counting(tok)
    first = build_prompt(make_config(), counting, E, PromptRequest(text="hi there", speaker="ryan"))
    n_first = counting.calls
    again = build_prompt(make_config(), counting, E, PromptRequest(text="hi there", speaker="ryan"))
    assert n_first == 3 and counting.calls - n_first == 1            # the text only: the template passed once
    assert_same(again.inputs_embeds, first.inputs_embeds)

    class CharTokenizer:
        def encode(self, text):
            return [ord(c) for c in text]
    broken = CharTokenizer()
    for _ in range(2):
        with pytest.raises(PromptError, match="chat template"):
            build_prompt(make_config(), broken, E, PromptRequest(text="hi", speaker="ryan"))


# ---------------------------------------------------------------------------------------------------------
# Section 3.5 lengths with the tiny checkpoints' tokenizer and config


def _tiny(variant):
    root = os.environ.get("VOXFLOW_TINY_DIR")
    if not root:
        pytest.skip("VOXFLOW_TINY_DIR is not set (tiny checkpoints)")
    folder = os.path.join(root, variant)
    if not os.path.isdir(folder):
        pytest.skip(f"{folder} missing")
    cfg, _, _ = load_configs(folder)
    return cfg, TextTokenizer.from_folder(folder), FakeEmbedder(cfg.talker.hidden_size)


def _tiny_build(variant, **kw) -> Prompt:
    cfg, tk, emb = _tiny(variant)
    return build_prompt(cfg, tk, emb, PromptRequest(**kw))


def test_lengths_custom_voice():
    p = _tiny_build("custom_voice", text="Hello world.", speaker="Vivian", language="English")
    assert len(p.text_ids) - 8 == 3 and p.length == 14 and p.trailing_text.shape[0] == 1
    p = _tiny_build("custom_voice", text="Hello world.", speaker="Vivian", language="English",
                    instruction="Speak happily.")  # 0b6: dropped
    assert p.length == 14 and p.instruction_dropped


def test_lengths_custom_voice_1b7_streaming_with_instruction():
    p = _tiny_build("custom_voice_1b7", text="Hello world.", speaker="Vivian", language="English",
                    instruction="Speak happily.", non_streaming_mode=False)
    assert p.length == len(p.instruct_ids) + 3 + 6 + 1 and p.trailing_text.shape[0] == 3


def test_lengths_voice_design():
    p = _tiny_build("voice_design", text="Hello world.", instruction="Speak happily.", language="English")
    assert len(p.instruct_ids) == 8 and p.length == 21 and p.trailing_text.shape[0] == 1


def test_lengths_base():
    cfg, _, _ = _tiny("base")
    xv = torch.randn(cfg.talker.hidden_size, generator=torch.Generator().manual_seed(0))
    p = _tiny_build("base", text="Hello world.", language="English", x_vector=xv)
    assert p.length == 10 and p.trailing_text.shape[0] == 3
    codes = torch.randint(0, 2048, (13, 16), generator=torch.Generator().manual_seed(0))
    icl = dict(text="Hello world.", language="English", x_vector=xv, ref_text="The quick brown fox.",
               ref_codes=codes)
    p = _tiny_build("base", **icl)
    assert len(p.ref_ids) - 5 == 5  # T1 = 5 + 3 + 1 = 9, T2 = 14
    assert p.layout == "icl_streaming" and p.length == 23 and p.trailing_text.shape[0] == 1
    p = _tiny_build("base", non_streaming_mode=True, **icl)
    assert p.length == 32 and p.trailing_text.shape[0] == 1


class CachingEmbedder(FakeEmbedder):
    """FakeEmbedder with the cache hooks of the Talker (prompt_constants, weights_version), counting lookups."""

    def __init__(self):
        super().__init__()
        self.prompt_constants, self.version, self.calls = {}, 0, 0

    def weights_version(self):
        return self.version

    def embed_text(self, ids):
        self.calls += 1
        return super().embed_text(ids)

    def embed_codec(self, ids):
        self.calls += 1
        return super().embed_codec(ids)


def test_fixed_prompt_parts_are_embedded_once_per_language_speaker_and_weights(tok):
    emb = CachingEmbedder()

    def prompt(text, speaker="vivian", language="english"):
        before = emb.calls
        p = build_prompt(make_config(), tok, emb, PromptRequest(text=text, speaker=speaker, language=language))
        return p, emb.calls - before

    want = build(tok, text="hello there", speaker="vivian", language="english")
    first, n_first = prompt("hello there")
    again, n_again = prompt("hello there")
    other, _ = prompt("something else")
    assert n_again < n_first and n_again == 1                    # only the request's own text
    for p in (first, again):
        assert_same(p.inputs_embeds, want.inputs_embeds)
        assert_same(p.trailing_text, want.trailing_text)
    assert_same(other.inputs_embeds[:4], want.inputs_embeds[:4])   # shared role rows
    _, n_new_speaker = prompt("hello there", speaker="ryan")
    assert n_new_speaker > 1                                     # another speaker row: its constants made once
    emb.version += 1                                             # weights changed: everything made again
    _, n_after = prompt("hello there")
    assert n_after == n_first
