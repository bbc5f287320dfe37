"""WordPiece (`tokenizer.ggml.model == "bert"`), as llama.cpp's WPM tokenizer runs it.

The text is first split into words (llama.cpp's `llm_tokenizer_wpm_session::preprocess`): every code
point mapped to the first code point of its NFD decomposition when accents are stripped (so "é" is "e";
a Hangul syllable keeps only its leading jamo, as llama.cpp's one-code-point NFD table does), white space
ends a word, control characters (Unicode `C*` but unassigned), U+0000 and U+FFFD vanish, combining marks
vanish when accents are stripped, letters are lower-cased (the simple, one-code-point mapping), and
every punctuation character, ASCII symbol and CJK ideograph is a word of its own.

Each word is then "▁" + word (the vocabulary spells word starts with U+2581, continuations bare) cut
greedily into the longest tokens from the left, over UTF-8 bytes as llama.cpp compares them; a word
with a piece no token spells becomes one unknown token. Special tokens are cut out before any of this
by the shared `Tokenizer`; it also puts [CLS] before and [SEP] after an input with special tokens.

Character classes come from Python's `unicodedata` (Unicode 14 on Python 3.11); llama.cpp generated its
tables from a later UnicodeData.txt, so a code point assigned since then is a letter here and may be a
symbol there (tests/test_wordpiece.py checks the vocabularies' test strings and 100 mixed sentences).
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence
from typing import Any

SPM_SPACE = "\u2581"
_CACHE_LIMIT = 200_000  # words; dropped wholesale past this (bounded memory)

# llama.cpp's white space (Unicode White_Space, its unicode-data table): not \x1c-\x1f, which Python's
# str.isspace takes too (those are control characters here, and vanish).
_WHITESPACE = frozenset(
    [
        *range(0x09, 0x0E),
        *range(0x2000, 0x200B),
        0x20,
        0x85,
        0xA0,
        0x1680,
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
    ]
)
# llama.cpp's CJK ideograph ranges (its is_chinese_char, with Hugging Face's 0x2B920 lower bound).
_CJK = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)  # fmt: skip

# What preprocessing does with one code point.
_SPACE, _DROP, _ALONE, _JOIN = range(4)


def _is_cjk(cpt: int) -> bool:
    return any(lo <= cpt <= hi for lo, hi in _CJK)


def _lower(ch: str) -> str:
    """The simple (one code point) lower case mapping of UnicodeData, which llama.cpp's table holds;
    str.lower() is the full mapping ("İ" -> "i̇"), whose first code point is the simple one."""
    low = ch.lower()
    return low[0] if low else ch


@functools.cache
def _classify(cpt: int, strip_accents: bool, lowercase: bool) -> tuple[int, str]:
    """(what preprocessing does with the code point, its text in a word)."""
    ch = chr(cpt)
    if strip_accents:
        ch = unicodedata.normalize("NFD", ch)[0]
        cpt = ord(ch)
    category = unicodedata.category(ch)
    if cpt in _WHITESPACE:
        return _SPACE, ""
    if cpt in (0, 0xFFFD) or (category[0] == "C" and category != "Cn"):
        return _DROP, ""
    if strip_accents and category[0] == "M":
        return _DROP, ""
    text = _lower(ch) if lowercase else ch
    if category[0] == "P" or (cpt < 0x7F and category[0] == "S") or _is_cjk(cpt):
        return _ALONE, text
    return _JOIN, text


def split_words(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """llama.cpp's WPM preprocessing: the words of `text`, normalised."""
    words: list[str] = []
    word: list[str] = []
    for ch in text:
        kind, piece = _classify(ord(ch), strip_accents, lowercase)
        if kind == _JOIN:
            word.append(piece)
            continue
        if kind == _DROP:  # gone without a trace: the word goes on
            continue
        if word:
            words.append("".join(word))
            word = []
        if kind == _ALONE:
            words.append(piece)
    if word:
        words.append("".join(word))
    return words


class WordPieceModel:
    """Longest-match-first WordPiece over a vocabulary whose word-initial tokens start with U+2581."""

    def __init__(self, tokens: Sequence[str], unk_id: int, lowercase: bool, strip_accents: bool) -> None:
        self._ids = {t.encode("utf-8"): i for i, t in enumerate(tokens)}
        self._max_len = max((len(t.encode("utf-8")) for t in tokens), default=0)
        self._unk = unk_id
        self._lowercase = lowercase
        self._strip_accents = strip_accents
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], tokens: Sequence[str], unk_id: int | None) -> WordPieceModel:
        """The model with llama.cpp's normaliser flags: lower-casing on unless the file says otherwise,
        accents stripped as lower-casing is unless the file says otherwise."""
        lowercase = bool(meta.get("tokenizer.ggml.normalizer.lowercase", True))
        strip = bool(meta.get("tokenizer.ggml.normalizer.strip_accents", lowercase))
        return cls(tokens, 100 if unk_id is None else unk_id, lowercase, strip)

    def encode(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for word in split_words(text, self._lowercase, self._strip_accents):
            ids = cache.get(word)
            if ids is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                ids = cache[word] = self._encode_word(word)
            out.extend(ids)

    def _encode_word(self, word: str) -> tuple[int, ...]:
        """The longest token at each byte offset from the left; any offset no token starts at makes the
        whole word the unknown token (llama.cpp discards the word's pieces found so far)."""
        data = (SPM_SPACE + word).encode("utf-8")
        n, i, ids = len(data), 0, []
        while i < n:
            for j in range(min(n, i + self._max_len + 1), i, -1):
                tid = self._ids.get(data[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                return (self._unk,)
        return tuple(ids) if ids else (self._unk,)

    @staticmethod
    def piece(text: str) -> bytes:
        """A normal token's bytes: U+2581 is a space (llama.cpp's llama_unescape_whitespace)."""
        return text.replace(SPM_SPACE, " ").encode("utf-8")
