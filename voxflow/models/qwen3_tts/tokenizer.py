"""Text tokenizer for Qwen3-TTS: Qwen2 byte-level BPE built straight from the checkpoint files.

Released checkpoints ship `vocab.json`, `merges.txt` and `tokenizer_config.json` but no `tokenizer.json`, so
transformers converts them on the fly (`Qwen2Converter`). We rebuild the same pipeline with the `tokenizers`
library alone:

    added tokens (matched on the raw text first) -> NFC -> regex split -> byte-level mapping -> BPE

The ids must match the official processor exactly: the prompt builder slices the chat template positionally,
and one id off shifts every text embedding.

The split regex has a twist. The official wrapper loads its processor with `fix_mistral_regex=True`, and
transformers 4.57.3 then REPLACES the Qwen2 split regex with a different one (a fix meant for Mistral
tokenizers) whenever: the vocabulary has more than 100000 entries, the folder is local, and the folder's
`config.json` does not opt out (its `transformers_version` is missing or in (4.57.2, 5.0.0), or its model_type is
a Mistral one). Real Qwen3-TTS checkpoints meet those conditions, which is why other runtimes that load them
without the flag print the "incorrect regex pattern" warning. `pretokenizer="auto"` (the default) reproduces
that decision so voxflow gives the official ids; "qwen2" / "mistral_fix" force one regex. The two regexes
differ only on rare inputs (camelCase such as "iPhone", combining marks, "'s" followed by letters).
"""
from __future__ import annotations

import json
import os
from typing import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from .config import ConfigError, read_json

# Qwen2's split pattern (transformers `Qwen2Converter`): contractions, letter runs with one optional leading
# non-letter, single digits, punctuation runs, newlines, spaces.
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The pattern transformers 4.57.3 substitutes under `fix_mistral_regex=True` (tokenization_utils_base.py,
# `_patch_mistral_regex`): splits on case changes, keeps combining marks with letters, lets '/' trail punctuation.
MISTRAL_FIX_SPLIT_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

PRETOKENIZERS = ("auto", "qwen2", "mistral_fix")

# transformers only considers the patch for tokenizers with a large base vocabulary.
_PATCH_MIN_VOCAB = 100000
_MISTRAL_MODEL_TYPES = ("mistral", "mistral3", "voxtral", "ministral", "pixtral")


class TokenizerError(ValueError):
    """The tokenizer files are missing or inconsistent."""


def _version_tuple(v: str):
    try:
        from packaging.version import Version
        return Version(v)
    except Exception:  # packaging missing or an odd version string: compare the leading numbers
        nums = []
        for part in v.split("."):
            digits = "".join(ch for ch in part if ch.isdigit())
            if not digits:
                break
            nums.append(int(digits))
        return tuple(nums)


def official_uses_mistral_fix(folder: str, base_vocab_size: int) -> bool:
    """Whether the official processor (qwen-tts 0.1.1 + transformers 4.57.3, local folder) swaps the regex."""
    if base_vocab_size <= _PATCH_MIN_VOCAB:
        return False
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.exists(cfg_path):
        return False
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    tf_version = cfg.get("transformers_version")
    model_type = cfg.get("model_type")
    if tf_version:
        v = _version_tuple(str(tf_version))
        if v <= _version_tuple("4.57.2") and model_type is not None and model_type not in _MISTRAL_MODEL_TYPES:
            return False
        if v >= _version_tuple("5.0.0"):
            return False
    return True


def _read_json(path: str) -> dict:
    try:
        return read_json(path)
    except ConfigError as e:
        raise TokenizerError(str(e)) from None


def _read_merges(path: str) -> list[tuple[str, str]]:
    if not os.path.exists(path):
        raise TokenizerError(f"missing tokenizer file: {path}")
    merges = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise TokenizerError(f"{path}: malformed merge line {line!r}")
            merges.append((parts[0], parts[1]))
    return merges


class TextTokenizer:
    """Encodes text to Qwen2 token ids, identical to the official Qwen3-TTS processor."""

    def __init__(self, tokenizer: Tokenizer, pretokenizer: str):
        self._tok = tokenizer
        self.pretokenizer = pretokenizer  # the resolved choice: "qwen2" or "mistral_fix"

    @classmethod
    def from_folder(cls, path: str, pretokenizer: str = "auto") -> "TextTokenizer":
        """Build from `vocab.json` + `merges.txt` + `tokenizer_config.json` in `path` (any tokenizer.json is ignored)."""
        if pretokenizer not in PRETOKENIZERS:
            raise ValueError(f"pretokenizer must be one of {PRETOKENIZERS}, got {pretokenizer!r}")
        vocab = _read_json(os.path.join(path, "vocab.json"))
        merges = _read_merges(os.path.join(path, "merges.txt"))
        tok_cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
        base_vocab_size = len(vocab)

        added = []  # (id, AddedToken)
        for id_str, spec in (tok_cfg.get("added_tokens_decoder") or {}).items():
            added.append((int(id_str), AddedToken(
                spec["content"],
                single_word=spec.get("single_word", False),
                lstrip=spec.get("lstrip", False),
                rstrip=spec.get("rstrip", False),
                normalized=spec.get("normalized", False),
                special=spec.get("special", True),
            )))
        added.sort(key=lambda x: x[0])

        # Put each added token into the model vocabulary at its declared id, so the id never depends on the
        # order tokens were added. (transformers hands out ids sequentially after the vocabulary; on real
        # checkpoints the added ids are contiguous from len(vocab.json), so both agree.)
        vocab = dict(vocab)
        id_to_token = {i: t for t, i in vocab.items()}
        for tid, atok in added:
            have = vocab.get(atok.content)
            if have is not None and have != tid:
                raise TokenizerError(f"added token {atok.content!r} has id {tid} in tokenizer_config.json "
                                     f"but {have} in vocab.json")
            other = id_to_token.get(tid)
            if other is not None and other != atok.content:
                raise TokenizerError(f"id {tid} is both {other!r} (vocab.json) and {atok.content!r} (added tokens)")
            vocab[atok.content] = tid
            id_to_token[tid] = atok.content

        if pretokenizer == "auto":
            pretokenizer = "mistral_fix" if official_uses_mistral_fix(path, base_vocab_size) else "qwen2"
        split = QWEN2_SPLIT_REGEX if pretokenizer == "qwen2" else MISTRAL_FIX_SPLIT_REGEX

        bpe = models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                         continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                         byte_fallback=False)
        tok = Tokenizer(bpe)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=bool(tok_cfg.get("add_prefix_space", False)),
                                     use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        # Special and non-special added tokens are both cut out of the raw text before normalisation/BPE.
        specials = [t for _, t in added if t.special]
        plain = [t for _, t in added if not t.special]
        if plain:
            tok.add_tokens(plain)
        if specials:
            tok.add_special_tokens(specials)
        return cls(tok, pretokenizer)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in the text map to their ids (no BOS/EOS added)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def token_id(self, token: str) -> int:
        """Id of one vocabulary entry or added token, e.g. "<tts_pad>"; KeyError if unknown."""
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return tid

    def decode(self, ids: Iterable[int]) -> str:
        """Debug helper: byte-level decode (special tokens kept)."""
        return self._tok.decode(list(ids), skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)
