"""Incremental sentence / clause splitting for text that arrives in pieces (an LLM's tokens, an STT stream).

    splitter = SentenceSplitter()
    splitter.feed("Hello Dr. Smi")      -> []
    splitter.feed("th. How are")        -> ["Hello Dr. Smith."]
    splitter.feed(" you? 你好。再")      -> ["How are you?", "你好。"]
    splitter.flush()                    -> ["再"]

A sentence is returned as soon as it is known to be complete, so the first one can be synthesised while the
rest of the text is still being written.

Boundaries
- Latin `.`, `!`, `?`, `;`, `…` (and runs such as `?!`, `...`), optionally followed by closing quotes or
  brackets, end a sentence only when WHITESPACE (or a CJK character) follows. At the end of the buffer nothing
  is decided yet: "3." may become "3.14". Not a boundary: a known abbreviation ("Dr.", "e.g.", "vs."), a
  single-letter initial ("J. Smith"), a word with inner dots ("U.S."), a list number at the start of a
  sentence ("1. Buy milk"), and a `.` / `…` whose next word starts in lower case ("etc. and so on").
- CJK `。！？；` (and the full-width `．`) end a sentence at once, with any closing quotes already received.
- A newline ends a sentence (paragraphs, list items).
- Clause marks — `，`, `、`, `：`, and a Latin `,` / `:` followed by whitespace — split too, but only inside a
  long sentence (`long_sentence_chars` characters so far), or always with granularity "clause".
- A sentence that grows past `max_sentence_chars` with no boundary is cut at its last whitespace (or hard at
  the limit for text without spaces), so one request never gets unbounded text.
- Pieces shorter than `min_chars` (after stripping) or without any letter or digit are carried forward into
  the next sentence; `flush()` drops a remainder that holds nothing speakable.

granularity "none" buffers everything until `flush()` (one request per flush; long text still gets cut at
`max_sentence_chars`).
"""
from __future__ import annotations

import unicodedata

GRANULARITIES = ("none", "sentence", "clause")

LATIN_TERMINATORS = ".!?;…"
CJK_TERMINATORS = "。！？；．"
CLAUSE_CJK = "，、："                # full-width clause marks: no whitespace needed after them
CLAUSE_LATIN = ",:"                 # needs whitespace after it
CLOSERS = "\"')]}»”’」』）】〉》〕〗"
ABBREVIATIONS = frozenset("""
    mr mrs ms mx dr prof sr jr st rev lt sgt capt cmdr gov sen
    vs e.g i.e cf approx dept jan feb apr jun jul aug sep sept oct nov dec tues thur thurs vol vols
""".split())


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF or 0xAC00 <= o <= 0xD7AF
            or 0xF900 <= o <= 0xFAFF or 0x20000 <= o <= 0x2FA1F)


def _speakable(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


class SentenceSplitter:
    def __init__(self, granularity: str = "sentence", *, min_chars: int = 2, long_sentence_chars: int = 120,
                 max_sentence_chars: int = 400):
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        if max_sentence_chars < 8:
            raise ValueError("max_sentence_chars must be at least 8")
        self.granularity = granularity
        self.min_chars = min_chars
        self.long_sentence_chars = long_sentence_chars
        self.max_sentence_chars = max_sentence_chars
        self._buf = ""

    @property
    def pending(self) -> str:
        """Text received but not yet returned as a sentence."""
        return self._buf

    def feed(self, text: str) -> list[str]:
        """Add text; return the sentences it completed (possibly none)."""
        if not isinstance(text, str):
            raise TypeError("text must be a string")
        self._buf += text
        return self._extract(final=False)

    def flush(self) -> list[str]:
        """End of input: return every remaining sentence (the last one possibly without a terminator)."""
        out = self._extract(final=True)
        rest, self._buf = self._buf.strip(), ""
        if rest and _speakable(rest):
            out.append(rest)
        elif rest and out:                     # trailing punctuation only: keep it with the last sentence
            out[-1] = out[-1] + rest
        return out

    # ---- scanning -------------------------------------------------------------------------------------------
    def _extract(self, final: bool) -> list[str]:
        out: list[str] = []
        buf = self._buf
        start = 0
        i = 0
        n = len(buf)
        split = self.granularity != "none"
        while split and i < n:
            ch = buf[i]
            cut = None
            if ch == "\n":
                cut = i + 1
            elif ch in CJK_TERMINATORS:
                cut = self._skip(buf, i + 1, CLOSERS)
            elif ch in LATIN_TERMINATORS:
                run_end = self._skip(buf, i + 1, LATIN_TERMINATORS)
                after = self._skip(buf, run_end, CLOSERS)
                if after >= n:
                    if not final:
                        break                  # undecided until more text arrives
                    cut = n
                elif buf[after].isspace() or _is_cjk(buf[after]):
                    if not self._continues(buf, start, i, run_end, after):
                        cut = after
                i = run_end - 1
            elif self._clause_mark(buf, i, start):
                cut = i + 1
            if cut is not None:
                piece = buf[start:cut].strip()
                if len(piece) >= self.min_chars and _speakable(piece):
                    out.append(piece)
                    start = cut
                elif not piece:
                    start = cut
                # else: too short / nothing to say: carried forward into the next sentence
            i += 1
        # Over-long: cut at the last whitespace before the limit (or at the limit).
        while len(buf) - start > self.max_sentence_chars:
            limit = start + self.max_sentence_chars
            ws = max(buf.rfind(" ", start, limit), buf.rfind("\n", start, limit), buf.rfind("\t", start, limit))
            cut = ws + 1 if ws > start + self.max_sentence_chars // 4 else limit
            piece = buf[start:cut].strip()
            if piece:
                out.append(piece)
            start = cut
        self._buf = buf[start:]
        return out

    @staticmethod
    def _skip(buf: str, j: int, chars: str) -> int:
        while j < len(buf) and buf[j] in chars:
            j += 1
        return j

    def _clause_mark(self, buf: str, i: int, start: int) -> bool:
        ch = buf[i]
        if ch in CLAUSE_LATIN:
            if i + 1 >= len(buf) or not buf[i + 1].isspace():
                return False                   # "1,000", "10:30", or undecided at the end
        elif ch not in CLAUSE_CJK:
            return False
        if self.granularity == "clause":
            return len(buf[start:i].strip()) >= self.min_chars
        return i - start >= self.long_sentence_chars

    @staticmethod
    def _continues(buf: str, start: int, i: int, run_end: int, after: int) -> bool:
        """True when the terminator at `i` (run up to `run_end`, whitespace at `after`) does NOT end a sentence."""
        ch = buf[i]
        nxt = after
        while nxt < len(buf) and buf[nxt].isspace():
            nxt += 1
        next_char = buf[nxt] if nxt < len(buf) else ""
        if ch in ".…" and next_char and unicodedata.category(next_char) == "Ll":
            return True                        # "e.g. this", "etc. and", "wait... what"
        if ch != "." or run_end - i > 1:
            return False                       # "!", "?", ";", "..." end sentences
        w = i
        while w > start and not buf[w - 1].isspace():
            w -= 1
        word = buf[w:i].lstrip("\"'([{«“‘")
        if not word:
            return False
        if word.lower() in ABBREVIATIONS:
            return True
        if len(word) == 1 and word.isalpha():
            return True                        # an initial: "J. Smith"
        if "." in word and any(c.isalpha() for c in word):
            return True                        # "U.S.", "e.g", "Ph.D"
        if word.isdigit() and not buf[start:w].strip():
            return True                        # a list number at the start: "1. Buy milk"
        return False


__all__ = ["SentenceSplitter", "GRANULARITIES"]
