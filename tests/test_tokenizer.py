"""Text tokenizer: Qwen2 byte-level BPE rebuilt from vocab.json + merges.txt + tokenizer_config.json."""
import json
import os
import shutil

import pytest
from tokenizers import pre_tokenizers

from voxflow.models.qwen3_tts.tokenizer import (
    TextTokenizer, TokenizerError, official_uses_mistral_fix,
)

SPECIALS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
            151671: "<tts_pad>", 151672: "<tts_text_bos>", 151673: "<tts_text_eod>"}
WORDS = ["assistant", "hello", "iPhone", "12"]


def write_byte_level_tokenizer(folder, non_special=None, config=None):
    """A small byte-level BPE in the real file layout: the 256 byte symbols, merges that build WORDS, and the
    Qwen special tokens at their real ids (with an id hole between 151645 and 151671, as in the tiny checkpoints)."""
    os.makedirs(folder, exist_ok=True)
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = []
    for w in WORDS:
        cur = w[0]
        for ch in w[1:]:
            if (cur, ch) not in merges:
                merges.append((cur, ch))
            cur += ch
            vocab.setdefault(cur, len(vocab))
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    added = {str(i): dict(content=c, lstrip=False, rstrip=False, normalized=False, single_word=False,
                          special=True) for i, c in SPECIALS.items()}
    for i, c in (non_special or {}).items():
        added[str(i)] = dict(content=c, lstrip=False, rstrip=False, normalized=False, single_word=False,
                             special=False)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"added_tokens_decoder": added, "tokenizer_class": "Qwen2Tokenizer",
                   "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
    return folder


@pytest.fixture()
def small(tmp_path):
    return TextTokenizer.from_folder(write_byte_level_tokenizer(str(tmp_path / "tok"), non_special={151660: "<think>"}))


def test_special_tokens_keep_their_declared_ids(small):
    for tid, content in SPECIALS.items():
        assert small.token_id(content) == tid
        assert small.encode(content) == [tid]
    assert small.token_id("<think>") == 151660
    ids = small.encode("<|im_start|>assistant\nhello<|im_end|>\n<tts_pad><think>")
    assert ids[0] == 151644 and ids[1] == small.token_id("assistant") and ids[-2:] == [151671, 151660]
    assert ids[2] == small.token_id("\u010a")  # "\n" as its byte-level symbol
    with pytest.raises(KeyError):
        small.token_id("<not a token>")


def test_chat_template_fits_positional_slicing(small):
    assert len(small.encode("<|im_start|>assistant\n")) == 3
    assert len(small.encode("<|im_end|>\n<|im_start|>assistant\n")) == 5


def test_digits_are_split_one_by_one(small):
    # the merge "1"+"2" exists, but Qwen2's regex isolates every digit before BPE
    assert small.encode("12") == small.encode("1") + small.encode("2")


def test_byte_level_round_trip_for_cjk_emoji_newlines(small):
    for text in ["你好，世界", "こんにちは", "emoji 😀👍🏽 🇫🇷", "a\nb\r\n\n c\t d  ", "Привет"]:
        ids = small.encode(text)
        assert all(0 <= i < 256 for i in ids)  # no merges apply: one byte symbol per byte
        assert small.decode(ids) == text


def test_nfc_normalisation(small):
    assert small.encode("cafe\u0301") == small.encode("caf\u00e9")


def test_regex_choice_changes_camel_case(tmp_path):
    d = write_byte_level_tokenizer(str(tmp_path / "tok"))
    qwen2 = TextTokenizer.from_folder(d, pretokenizer="qwen2")
    fixed = TextTokenizer.from_folder(d, pretokenizer="mistral_fix")
    assert qwen2.pretokenizer == "qwen2" and fixed.pretokenizer == "mistral_fix"
    # Qwen2 keeps "iPhone" in one piece (so the merges build it); the patched regex splits "i" | "Phone".
    assert qwen2.encode("iPhone") == [qwen2.token_id("iPhone")]
    assert len(fixed.encode("iPhone")) > 1
    assert qwen2.encode("hello world") == fixed.encode("hello world")
    with pytest.raises(ValueError, match="pretokenizer"):
        TextTokenizer.from_folder(d, pretokenizer="bogus")


def _cfg_folder(tmp_path, name, cfg):
    d = tmp_path / name
    d.mkdir()
    if cfg is not None:
        (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_auto_regex_follows_the_official_processor_rule(tmp_path):
    # transformers 4.57.3 + fix_mistral_regex=True (official wrapper), local folder, vocabulary > 100000
    qt = {"model_type": "qwen3_tts"}
    assert official_uses_mistral_fix(_cfg_folder(tmp_path, "a", {**qt, "transformers_version": "4.57.3"}), 151643)
    assert official_uses_mistral_fix(_cfg_folder(tmp_path, "b", qt), 151643)
    assert not official_uses_mistral_fix(_cfg_folder(tmp_path, "c", {**qt, "transformers_version": "4.57.1"}), 151643)
    assert not official_uses_mistral_fix(_cfg_folder(tmp_path, "d", {**qt, "transformers_version": "5.0.0"}), 151643)
    assert not official_uses_mistral_fix(_cfg_folder(tmp_path, "e", None), 151643)
    assert not official_uses_mistral_fix(_cfg_folder(tmp_path, "f", {**qt, "transformers_version": "4.57.3"}), 344)
    # small vocabulary -> "auto" resolves to the plain Qwen2 regex even with a 4.57.3 config
    d = write_byte_level_tokenizer(str(tmp_path / "g"), config={**qt, "transformers_version": "4.57.3"})
    assert TextTokenizer.from_folder(d).pretokenizer == "qwen2"


def test_missing_or_inconsistent_files(tmp_path):
    d = write_byte_level_tokenizer(str(tmp_path / "tok"))
    os.remove(os.path.join(d, "merges.txt"))
    with pytest.raises(TokenizerError, match="merges.txt"):
        TextTokenizer.from_folder(d)
    d2 = write_byte_level_tokenizer(str(tmp_path / "tok2"))
    cfg = json.load(open(os.path.join(d2, "tokenizer_config.json")))
    cfg["added_tokens_decoder"]["5"] = dict(content="<clash>", special=True)  # id 5 is a byte symbol
    json.dump(cfg, open(os.path.join(d2, "tokenizer_config.json"), "w"))
    with pytest.raises(TokenizerError, match="id 5"):
        TextTokenizer.from_folder(d2)


# ---------------------------------------------------------------------------------------------------------
# Against transformers' Qwen2TokenizerFast on the tiny checkpoints (real layout: no tokenizer.json)

TEXTS = [
    "Hello world.", "<|im_start|>assistant\nHello world.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nSpeak happily.<|im_end|>\n", "<tts_pad><tts_text_bos>x<tts_text_eod><|endoftext|>",
    "你好，世界！今天天气怎么样？", "こんにちは、世界。カタカナ", "안녕하세요", "Привет, мир!", "Größe café",
    "cafe\u0301 (NFD)", "123456 3.14159 1,000,000", "line1\nline2\r\nline3\n\n\nend", "tabs\tand   spaces   ",
    "   leading", "emoji 😀👍🏽 👨‍👩‍👧 🇫🇷", "iPhone YouTube HTTPServer", "it's I'm we'll 'sam DON'T",
    "a/b ./ http://x.y/z?q=1", "x<|im_end|>y", "<|im_start", " ", "\n\n", "ﬁ ligature", "The quick brown fox.",
]


def _tiny_dir():
    root = os.environ.get("VOXFLOW_TINY_DIR")
    if not root:
        pytest.skip("VOXFLOW_TINY_DIR is not set (tiny checkpoints)")
    return root


@pytest.mark.parametrize("variant", ["custom_voice", "voice_design", "base"])
def test_matches_transformers_qwen2_fast(variant, tmp_path):
    transformers = pytest.importorskip("transformers")
    src = os.path.join(_tiny_dir(), variant)
    if not os.path.isdir(src):
        pytest.skip(f"{src} missing")
    dst = tmp_path / variant
    dst.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):  # the real layout: no tokenizer.json
        shutil.copy(os.path.join(src, name), dst / name)
    ref = transformers.Qwen2TokenizerFast.from_pretrained(str(dst))
    ours = TextTokenizer.from_folder(str(dst))
    for text in TEXTS:
        assert ours.encode(text) == ref(text)["input_ids"], text
    for special in SPECIALS.values():
        assert ours.token_id(special) == ref.convert_tokens_to_ids(special)
    # the spec's tiny-tokenizer facts (section 3.5)
    assert len(ours.encode("Hello world.")) == 3
    assert len(ours.encode("<|im_start|>assistant\n")) == 3
