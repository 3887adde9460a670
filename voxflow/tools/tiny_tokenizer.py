"""A tiny, handcrafted Qwen2-style byte-level BPE, written as the real Qwen3-TTS repos ship it.

The real repos carry `vocab.json`, `merges.txt` and `tokenizer_config.json` (class `Qwen2Tokenizer`) and no
`tokenizer.json`. This module writes the same three files for a tiny BPE (~800 merges over ~560 words):

* the 256 byte symbols of GPT-2's `bytes_to_unicode` (ids 0..255, in GPT-2/Qwen order);
* merges that build whole-word tokens for a fixed word list (`WORDS`), found by a small deterministic BPE
  "trainer" written here (pair counts, ties broken by the pair's text), so the files never depend on a
  library version;
* unreachable filler entries `<|u{id}|>` up to id 151642, so `vocab.json` has the real 151643 entries and no id
  holes (holes make the Rust `tokenizers` library print a ~1 MB warning whenever transformers converts it);
* the added tokens 151643-151673 in `tokenizer_config.json`'s `added_tokens_decoder`, contiguous as in the real
  Qwen3 tokenizer, incl. the ones the prompt builder uses: 151643-151645 (`<|endoftext|>`, `<|im_start|>`,
  `<|im_end|>`) and 151671-151673 (`<tts_pad>`, `<tts_text_bos>`, `<tts_text_eod>`).

The official prompt builder slices token ids positionally, so `"<|im_start|>assistant\\n"` must be exactly 3 ids
and `"<|im_end|>\\n<|im_start|>assistant\\n"` exactly 5: "assistant" and "user" are whole tokens and "\\n" is the
single byte token "Ċ".
"""
from __future__ import annotations

import functools
import heapq
import json
import os
from collections import Counter

# Special tokens with their real ids (section 2 of the spec): the ones the Qwen3-TTS prompt builder uses.
SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tts_pad>": 151671,
    "<tts_text_bos>": 151672,
    "<tts_text_eod>": 151673,
}

# Every added token, contiguous from 151643 like the real Qwen3 tokenizer (151643-151668 are Qwen3's; 151669/151670
# follow Qwen3-Omni's audio markers; 151671-151673 are the TTS tokens). (id, content, special)
ADDED_TOKENS: list[tuple[int, str, bool]] = [
    (151643, "<|endoftext|>", True), (151644, "<|im_start|>", True), (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True), (151647, "<|object_ref_end|>", True), (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True), (151650, "<|quad_start|>", True), (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True), (151653, "<|vision_end|>", True), (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True), (151656, "<|video_pad|>", True), (151657, "<tool_call>", False),
    (151658, "</tool_call>", False), (151659, "<|fim_prefix|>", False), (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False), (151662, "<|fim_pad|>", False), (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False), (151665, "<tool_response>", False), (151666, "</tool_response>", False),
    (151667, "<think>", False), (151668, "</think>", False), (151669, "<|audio_start|>", True),
    (151670, "<|audio_end|>", True), (151671, "<tts_pad>", True), (151672, "<tts_text_bos>", True),
    (151673, "<tts_text_eod>", True),
]
# vocab.json has exactly this many entries (ids 0..151642), as the real Qwen2/Qwen3 vocab.json: the tiny BPE
# fills the first few hundred ids, unreachable fillers "<|u{id}|>" (no merge produces them) the rest, so the
# added tokens land on their real ids and the vocabulary has no holes.
BPE_VOCAB_SIZE = 151643

# Qwen2's pre-tokenizer regex (as used by Qwen2Tokenizer / Qwen2TokenizerFast).
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

# Pre-tokenized chunks (as Qwen2's regex cuts them: a word with its optional leading space) that become one token.
_ROLE_WORDS = ["assistant", "user", "system"]
_CAPITALISED = ["Hello", "This", "The", "Speak", "Please", "Thank", "Good", "Yes", "No", "It", "We", "You",
                "What", "How", "Today", "Welcome", "Qwen", "TTS", "Okay", "Read", "Say", "Use", "Talk", "Let"]
_LOWER = ["the", "be", "to", "of", "and", "in", "that", "have", "it", "for", "not", "on", "with", "he", "as",
          "you", "do", "at", "this", "but", "his", "by", "from", "they", "we", "say", "her", "she", "or", "an",
          "will", "my", "one", "all", "would", "there", "their", "what", "so", "up", "out", "if", "about", "who",
          "get", "which", "go", "me", "when", "make", "can", "like", "time", "no", "just", "him", "know", "take",
          "is", "are", "was", "were", "has", "had", "very", "much", "more", "some", "how", "our", "your", "its",
          "world", "hello", "tiny", "test", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "voice",
          "speech", "text", "audio", "sound", "speak", "speaking", "read", "reading", "today", "morning", "good",
          "day", "night", "weather", "nice", "please", "thank", "thanks", "sentence", "word", "words", "story",
          "happy", "happily", "sad", "sadly", "slow", "slowly", "fast", "quickly", "calm", "calmly", "warm",
          "clear", "clearly", "soft", "softly", "loud", "gentle", "excited", "angry", "young", "old", "female",
          "male", "woman", "man", "girl", "boy", "tone", "pitch", "style", "deep", "bright", "friendly", "cheerful",
          "serious", "whisper", "weak", "strong", "great", "small", "big", "new", "first", "last", "long", "little",
          "right", "here", "now", "then", "again", "yes", "okay", "sure", "well", "really", "welcome", "model",
          "system", "service", "example", "number", "people", "way", "year", "work", "home", "life", "city",
          "music", "love", "thing", "things", "think", "want", "need", "feel", "look", "come", "see", "use",
          "give", "tell", "call", "try", "ask", "let", "keep", "start", "stop", "play", "run", "move", "live",
          "hear", "listen", "write", "show", "turn", "help", "should", "could", "may", "might", "must", "been",
          "being", "did", "does", "done", "made", "said", "went", "got", "came", "saw", "told", "because",
          "after", "before", "while", "where", "why", "every", "each", "other", "many", "most", "such", "only",
          "also", "than", "too", "into", "through", "under", "between", "around", "without", "against", "during",
          "tiny", "random", "weights", "checkpoint", "engine", "serving", "stream", "streaming"]
_LETTERS_TOO = ["a", "I"]  # single letters exist as bytes already; listed so " a" / " I" become one token


def _word_list() -> list[str]:
    words: list[str] = []
    seen = set()

    def add(w: str) -> None:
        if w not in seen:
            seen.add(w)
            words.append(w)

    for w in _ROLE_WORDS:
        add(w)
    for w in _CAPITALISED:
        add(w)
        add(" " + w)
    for w in _LOWER:
        add(w)
        add(" " + w)
    for w in _LETTERS_TOO:
        add(" " + w)
    return words


WORDS: list[str] = _word_list()


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (byte-level BPE alphabet)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def byte_alphabet() -> list[str]:
    """The 256 byte symbols in GPT-2/Qwen vocabulary order (printable bytes first, then the remapped ones)."""
    return list(bytes_to_unicode().values())


def to_byte_level(text: str) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


def _merge_pair(seq: list[str], a: str, b: str) -> list[str]:
    out, j = [], 0
    while j < len(seq):
        if j + 1 < len(seq) and seq[j] == a and seq[j + 1] == b:
            out.append(a + b)
            j += 2
        else:
            out.append(seq[j])
            j += 1
    return out


def train_bpe(words: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Deterministic BPE over `words` (one count each) until every word is a single token.

    Each step merges the most frequent adjacent pair; ties go to the lexicographically smallest pair.
    Returns (vocab without specials, merges in rank order).
    """
    vocab: dict[str, int] = {sym: i for i, sym in enumerate(byte_alphabet())}
    seqs = [list(to_byte_level(w)) for w in words]
    counts: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, s in enumerate(seqs):
        for pair in zip(s, s[1:]):
            counts[pair] += 1
            where.setdefault(pair, set()).add(i)
    heap = [(-c, pair) for pair, c in counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap:
        neg, best = heapq.heappop(heap)
        if counts.get(best, 0) != -neg:  # stale entry
            continue
        merges.append(best)
        new = best[0] + best[1]
        if new not in vocab:
            vocab[new] = len(vocab)
        touched = set()
        for i in sorted(where.pop(best, ())):
            s = seqs[i]
            for pair in zip(s, s[1:]):
                counts[pair] -= 1
                touched.add(pair)
            s = seqs[i] = _merge_pair(s, *best)
            for pair in zip(s, s[1:]):
                counts[pair] += 1
                touched.add(pair)
                where.setdefault(pair, set()).add(i)
        counts.pop(best, None)  # every occurrence was merged
        touched.discard(best)
        for pair in sorted(touched):
            c = counts.get(pair, 0)
            if c <= 0:
                counts.pop(pair, None)
            else:
                heapq.heappush(heap, (-c, pair))
    return vocab, merges


def bpe_encode_chunk(chunk: str, merges: list[tuple[str, str]],
                     ranks: dict[tuple[str, str], int] | None = None) -> list[str]:
    """Reference BPE of one pre-tokenized chunk (plain text), as HF's BPE model applies merges by rank."""
    if ranks is None:
        ranks = {m: i for i, m in enumerate(merges)}
    sym = list(to_byte_level(chunk))
    while len(sym) > 1:
        pairs = [(ranks.get((a, b), None), k) for k, (a, b) in enumerate(zip(sym, sym[1:]))]
        pairs = [p for p in pairs if p[0] is not None]
        if not pairs:
            break
        r, _ = min(pairs)
        sym = _merge_pair(sym, *merges[r])
    return sym


def _added_token(content: str, special: bool = True) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special}


def tokenizer_config() -> dict:
    """`tokenizer_config.json` in the real repos' style (Qwen2Tokenizer; specials at their real ids)."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(i): _added_token(t, special) for i, t, special in ADDED_TOKENS},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                                      "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
                                      "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                                      "<|video_pad|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


@functools.lru_cache(maxsize=4)
def _build_tokenizer_files(words: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    vocab, merges = train_bpe(list(words))
    ranks = {m: i for i, m in enumerate(merges)}
    for w in words:
        got = bpe_encode_chunk(w, merges, ranks)
        if len(got) != 1:  # pragma: no cover - guards the trainer
            raise AssertionError(f"tiny BPE: {w!r} is not one token: {got}")
    if len(vocab) > BPE_VOCAB_SIZE:  # pragma: no cover
        raise AssertionError("tiny BPE vocabulary too large")
    full = dict(vocab)
    for i in range(len(vocab), BPE_VOCAB_SIZE):
        full[f"<|u{i}|>"] = i
    return (
        ("vocab.json", json.dumps(full, ensure_ascii=False, separators=(",", ":"))),
        ("merges.txt", "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)),
        ("tokenizer_config.json", json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n"),
    )


def build_tokenizer_files(words: list[str] | None = None) -> dict[str, str]:
    """The text of `vocab.json`, `merges.txt` and `tokenizer_config.json` (deterministic, cached)."""
    return dict(_build_tokenizer_files(tuple(WORDS if words is None else words)))


def write_tokenizer_files(folder: str, words: list[str] | None = None) -> list[str]:
    """Write `vocab.json`, `merges.txt`, `tokenizer_config.json` into `folder`; returns the paths."""
    paths = []
    for name, text in build_tokenizer_files(words).items():
        path = os.path.join(folder, name)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        paths.append(path)
    return paths


def load_fast_tokenizer(folder: str):
    """A `tokenizers.Tokenizer` built from the folder's vocab.json + merges.txt the way Qwen2TokenizerFast is
    (Qwen2 regex split + ByteLevel, byte-level decoder, specials as added tokens). Needs only `tokenizers`."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    merges = []
    with open(os.path.join(folder, "merges.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            a, b = line.split(" ")
            merges.append((a, b))
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # Added tokens get consecutive ids after the BPE vocabulary, in id order (as transformers adds them).
    for idx, v in sorted(cfg.get("added_tokens_decoder", {}).items(), key=lambda kv: int(kv[0])):
        token = AddedToken(v["content"], special=v.get("special", True), normalized=False,
                           lstrip=v.get("lstrip", False), rstrip=v.get("rstrip", False),
                           single_word=v.get("single_word", False))
        if token.special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
        if tok.token_to_id(v["content"]) != int(idx):
            raise ValueError(f"added token {v['content']!r} got id {tok.token_to_id(v['content'])}, "
                             f"tokenizer_config.json says {idx}")
    return tok
