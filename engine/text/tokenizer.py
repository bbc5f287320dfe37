"""Tokenizers built from GGUF metadata that match llama.cpp's `llama_tokenize` token for token.

Three vocabulary kinds are supported:
- byte-level BPE (`tokenizer.ggml.model == "gpt2"`) with a gpt2-style pre-tokenizer (`smollm` and kin),
- SentencePiece BPE (`tokenizer.ggml.model == "llama"`, e.g. Gemma 3): score-ordered bigram merges over
  characters, spaces escaped as U+2581, byte fallback to `<0xXX>` tokens,
- Gemma 4's BPE (`tokenizer.ggml.model == "gemma4"`): rank-ordered merges over whole lines of raw UTF-8
  characters with spaces escaped as U+2581, byte fallback to `<0xXX>` tokens.

Special tokens (CONTROL / USER_DEFINED / UNKNOWN types) are cut out of the text before either algorithm
runs, exactly as llama.cpp's `tokenizer_st_partition` does: longest token text first, each one splitting
every remaining raw fragment. With `parse_special=False` only USER_DEFINED tokens are cut out.

Speed comes from caches keyed by the unit the algorithms work on independently (a pre-token word for
BPE, a space-delimited segment for SPM and Gemma 4), so a long prompt costs mostly dictionary lookups.
"""

from __future__ import annotations

import codecs
import heapq
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntFlag
from typing import Any

import regex

from engine.gguf import GGUFFile, UnsupportedModelError
from engine.text.fim import FimTokens
from engine.text.wordpiece import WordPieceModel

# GGUF `tokenizer.ggml.token_type` values.
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6


class TokenAttr(IntFlag):
    """llama.cpp's per-token attributes (a bit set, derived from the GGUF token type plus fix-ups)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


_TYPE_TO_ATTR = {
    TOKEN_TYPE_NORMAL: int(TokenAttr.NORMAL),
    TOKEN_TYPE_UNKNOWN: int(TokenAttr.UNKNOWN),
    TOKEN_TYPE_CONTROL: int(TokenAttr.CONTROL),
    TOKEN_TYPE_USER_DEFINED: int(TokenAttr.USER_DEFINED),
    TOKEN_TYPE_UNUSED: int(TokenAttr.UNUSED),
    TOKEN_TYPE_BYTE: int(TokenAttr.BYTE),
}
# Plain ints for the per-token tables: IntFlag arithmetic costs ~1 us per operation, too slow for 262k tokens.
_NORMAL = int(TokenAttr.NORMAL)
_CONTROL = int(TokenAttr.CONTROL)
_USER_DEFINED = int(TokenAttr.USER_DEFINED)
_BYTE = int(TokenAttr.BYTE)
_HIDDEN = int(TokenAttr.UNKNOWN | TokenAttr.CONTROL)  # rendered only when special tokens are rendered
_PARTITIONED = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)

SPM_SPACE = "\u2581"  # SentencePiece's escaped space
_WORD_CACHE_LIMIT = 200_000  # entries; the cache is dropped wholesale past this (bounded memory)

# Token texts llama.cpp treats as end of generation (llama-vocab.cpp, `special_eog_ids`).
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
    }
)  # fmt: skip
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
)  # fmt: skip
# FIM tokens llama.cpp adds to the end-of-generation set when it finds them by text.
_FIM_EOG_TEXTS = {
    "tokenizer.ggml.fim_pad_token_id": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "tokenizer.ggml.fim_rep_token_id": (
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ),
    "tokenizer.ggml.fim_sep_token_id": ("<|file_sep|>",),
}
# gpt-oss: llama.cpp always renders these, as USER_DEFINED tokens.
_FORCED_USER_DEFINED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})

# Whitespace as llama.cpp's unicode tables define it (Unicode White_Space), spelled out so the
# pre-tokenizer does not depend on the regex engine's idea of \s.
_WS = r"\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"

# llama.cpp's gpt2 regex `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` (run by a
# hand-written matcher there, which also takes a lone trailing whitespace run as `\s+`).
_GPT2_PATTERN = (
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?\p{{L}}+| ?\p{{N}}+| ?[^{_WS}\p{{L}}\p{{N}}]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
)
# The `smollm` family runs `\p{N}` first and then the gpt2 regex inside each piece, so every digit is its
# own word and a whitespace run before a digit ends a piece (it keeps all of its characters). Folded into
# a single regex: digits alone, no ` ?\p{N}+`, and a digit counts like the end of the text for `(?!\S)`.
_SMOLLM_PATTERN = (
    rf"\p{{N}}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{{L}}+| ?[^{_WS}\p{{L}}\p{{N}}]+"
    rf"|[{_WS}]+(?![^{_WS}\p{{N}}])|[{_WS}]+"
)

# Qwen2's `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+
# |\s+(?!\S)|\s+` (llama.cpp runs it by a hand-written matcher; the same choices as this regex): a letter
# run takes one leading non-letter (space, punctuation) with it, digits are single words, punctuation
# keeps the line breaks after it, and a whitespace run up to its last line break is one word.
_QWEN2_PATTERN = (
    rf"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
    rf"|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}| ?[^{_WS}\p{{L}}\p{{N}}]+[\r\n]*"
    rf"|[{_WS}]*[\r\n]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
)


# Qwen3.5's (`qwen35`): Qwen2's with combining marks (\p{M}) taken into letter runs and out of punctuation
# runs, `[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+` and ` ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*` (llama.cpp's matcher for it
# makes the same choices).
_QWEN35_PATTERN = (
    rf"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
    rf"|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}\p{{M}}]+|\p{{N}}| ?[^{_WS}\p{{L}}\p{{M}}\p{{N}}]+[\r\n]*"
    rf"|[{_WS}]*[\r\n]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
)


# Llama 3's `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
# |\s*[\r\n]+|\s+(?!\S)|\s+`: Qwen2's, but digits in groups of up to three (llama.cpp's hand-written
# matcher cuts a digit run left to right every three digits, as the greedy `\p{N}{1,3}` does).
_LLAMA3_PATTERN = _QWEN2_PATTERN.replace(r"|\p{N}|", r"|\p{N}{1,3}|", 1)

# Tekken (Mistral Nemo) and GPT-4o (Phi-4) split a letter run at case changes. llama.cpp has no
# hand-written matcher for them: it runs its ECMAScript adaptation of the tokenizer.json regex (std::regex),
# which cannot say \p{Lu}/\p{Ll}, on a copy of the text where every non-ASCII code point is replaced by one
# byte per category (letter, number, ...). "Upper-case" there means "a letter other than a-z" and
# "lower-case" "a letter other than A-Z": every non-ASCII letter is both, combining marks (\p{M}) are
# no letters. The same sets on the real text: `[^\P{L}a-z]` and `[^\P{L}A-Z]`; `\s` is the C locale's six
# ASCII spaces plus the non-ASCII white space llama.cpp's tables name (`_WS`).
_CASED_UPPER = r"[^\P{L}a-z]"
_CASED_LOWER = r"[^\P{L}A-Z]"
_CASED_OPENER = r"[^\r\n\p{L}\p{N}]?"  # one optional non-letter, non-digit, not a line break


def _cased_word(contraction: str) -> str:
    """The two letter-run alternatives (upper-case then lower-case letters, or upper-case ones alone)."""
    run = f"{_CASED_OPENER}{_CASED_UPPER}*{_CASED_LOWER}+{contraction}"
    return f"{run}|{_CASED_OPENER}{_CASED_UPPER}+{_CASED_LOWER}*{contraction}"


_CASED_TAIL = rf" ?[^{_WS}\p{{L}}\p{{N}}]+[\r\n/]*|[{_WS}]*[\r\n]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
# tokenizer.json's `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|... |\p{N}
# | ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+` as llama.cpp runs it (above): digits one by one.
_TEKKEN_PATTERN = _cased_word("") + rf"|\p{{N}}|{_CASED_TAIL}"
# GPT-4o's (o200k): Tekken's word with an optional contraction after each letter run, digits by three.
_CONTRACTION = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
_GPT4O_PATTERN = _cased_word(_CONTRACTION) + rf"|\p{{N}}{{1,3}}|{_CASED_TAIL}"


@dataclass(frozen=True)
class _PreTokenizer:
    """One `tokenizer.ggml.pre` family: its split regex and the vocabulary flags llama.cpp sets with it."""

    pattern: str
    clean_spaces: bool  # llama.cpp's detokenizer clean-up (" ?" -> "?" ...), per pre-tokenizer
    # A pre-token word that is itself a token is that token, merges or not (llama.cpp's `ignore_merges`:
    # tiktoken-made vocabularies, whose merge lists are derived and do not always rebuild every token).
    ignore_merges: bool = False
    add_bos: bool = False  # llama.cpp's default before `tokenizer.ggml.add_bos_token` overrides it


_LLAMA3 = _PreTokenizer(_LLAMA3_PATTERN, clean_spaces=True, ignore_merges=True, add_bos=True)

# `tokenizer.ggml.pre` -> pre-tokenizer, for the names whose llama.cpp regexes are reproduced here. Names
# llama.cpp maps to the same pre-tokenizer type share an entry (llama-vocab.cpp's name -> type table).
_PRE_TOKENIZERS: dict[str, _PreTokenizer] = {
    "smollm": _PreTokenizer(_SMOLLM_PATTERN, clean_spaces=False),
    "starcoder": _PreTokenizer(_SMOLLM_PATTERN, clean_spaces=True),
    "refact": _PreTokenizer(_SMOLLM_PATTERN, clean_spaces=True),
    "codeshell": _PreTokenizer(_SMOLLM_PATTERN, clean_spaces=True),
    "qwen2": _PreTokenizer(_QWEN2_PATTERN, clean_spaces=False),
    "deepseek-r1-qwen": _PreTokenizer(_QWEN2_PATTERN, clean_spaces=False),
    "qwen35": _PreTokenizer(_QWEN35_PATTERN, clean_spaces=False),
    "gpt-2": _PreTokenizer(_GPT2_PATTERN, clean_spaces=True),
    "phi-2": _PreTokenizer(_GPT2_PATTERN, clean_spaces=True),
    "mpt": _PreTokenizer(_GPT2_PATTERN, clean_spaces=True),
    "olmo": _PreTokenizer(_GPT2_PATTERN, clean_spaces=True),
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "llama-bpe": _LLAMA3,
    "tekken": _PreTokenizer(_TEKKEN_PATTERN, clean_spaces=False, ignore_merges=True, add_bos=True),
    "gpt-4o": _PreTokenizer(_GPT4O_PATTERN, clean_spaces=False),
    "llama4": _PreTokenizer(_GPT4O_PATTERN, clean_spaces=False),
}


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table (bytes that print as themselves keep their code point)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_TO_CHAR = _bytes_to_unicode()
# str.translate tables: latin-1 decoded bytes -> GPT-2 characters, and back. Characters of the range
# 0..255 that are not GPT-2 byte characters map to a sentinel so that encoding them to latin-1 fails.
_BYTES_TO_GPT2 = {b: c for b, c in enumerate(_BYTE_TO_CHAR)}
_GPT2_TO_BYTES: dict[int, str] = {b: "\uffff" for b in range(256)}
_GPT2_TO_BYTES.update({ord(c): chr(b) for b, c in enumerate(_BYTE_TO_CHAR)})


def _trie_pattern(words: Iterable[str]) -> str:
    """A regex alternation of literal words shaped as a prefix trie: it matches the longest word at a
    position and runs in time independent of the number of words (a flat alternation of Gemma's 6,400
    special tokens is 500x slower)."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = True

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in node.items() if ch != ""]
        if "" in node:
            return "(?:" + "|".join(alts) + ")?" if alts else ""
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(root)


def _overlapping_matcher(words: Iterable[str]) -> re.Pattern[str] | None:
    """A pattern whose finditer yields, at every position, the longest word starting there (group 1)."""
    words = list(words)
    return re.compile("(?=(" + _trie_pattern(words) + "))") if words else None


class _SpecialTokens:
    """llama.cpp's `tokenizer_st_partition`: cut special-token texts out of the raw text."""

    def __init__(self, texts: Sequence[str], attrs: Sequence[int]) -> None:
        ids = [i for i, a in enumerate(attrs) if a & _PARTITIONED]
        # llama.cpp sorts by text length, longest first (its sort is not stable; ties are by id here).
        ids.sort(key=lambda i: (-len(texts[i]), i))
        self._texts = texts
        self._order = {tid: rank for rank, tid in enumerate(ids)}
        # parse_special -> the eligible tokens by text; without it, control/unknown texts stay plain text.
        self._by_text = {
            True: {texts[i]: i for i in ids},
            False: {texts[i]: i for i in ids if not attrs[i] & _HIDDEN},
        }
        self._matchers: dict[bool, re.Pattern[str] | None] = {}

    def _matcher(self, parse_special: bool) -> re.Pattern[str] | None:
        # Compiled on first use: Gemma's trie takes ~70 ms to build and most users need only one of them.
        if parse_special not in self._matchers:
            self._matchers[parse_special] = _overlapping_matcher(self._by_text[parse_special])
        return self._matchers[parse_special]

    def _candidates(self, text: str, parse_special: bool) -> list[int]:
        """Every eligible special token occurring anywhere in `text`, in partition order."""
        matcher = self._matcher(parse_special)
        if matcher is None:
            return []
        by_text = self._by_text[parse_special]
        found: set[int] = set()
        for m in matcher.finditer(text):
            longest = m.group(1)
            # Any other token starting here is a prefix of the longest one.
            for n in range(1, len(longest) + 1):
                tid = by_text.get(longest[:n])
                if tid is not None:
                    found.add(tid)
        return sorted(found, key=self._order.__getitem__)

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Fragments in order: raw text (non-empty str) and special token ids (int)."""
        fragments: list[str | int] = [text] if text else []
        for tid in self._candidates(text, parse_special):
            needle = self._texts[tid]
            split: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or needle not in frag:
                    split.append(frag)
                    continue
                for k, part in enumerate(frag.split(needle)):
                    if k:
                        split.append(tid)
                    if part:
                        split.append(part)
            fragments = split
        return fragments


_CROSSING = re.compile(f"[^{SPM_SPACE}]{SPM_SPACE}")


class _SpaceCuts:
    """Text with escaped spaces cut before each U+2581 that follows another character, into segments a
    merge-based tokenizer handles independently (and caches), except inside an occurrence of one of the
    `spanning` texts: the merged symbols that do cross such a cut."""

    def __init__(self, spanning: Iterable[str]) -> None:
        self._boundary = re.compile(f"(?<=[^{SPM_SPACE}])(?={SPM_SPACE})")
        self._spanning = _overlapping_matcher(spanning)

    def split(self, text: str) -> list[str]:
        if self._spanning is None:
            return self._boundary.split(text)
        covered = [(m.start(), m.start() + len(m.group(1))) for m in self._spanning.finditer(text)]
        if not covered:
            return self._boundary.split(text)
        cuts = [
            m.start() for m in self._boundary.finditer(text) if not any(s < m.start() < e for s, e in covered)
        ]
        bounds = [0, *cuts, len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


class _BpeModel:
    """Byte-level BPE: pre-tokenizer regex, then rank-ordered merges within each word."""

    def __init__(self, token_to_id: dict[str, int], merges: Sequence[str], pre: _PreTokenizer) -> None:
        self._token_to_id = token_to_id
        ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            pos = merge.find(" ", 1)
            pair = (merge[:pos], merge[pos + 1 :]) if pos >= 0 else ("", "")
            ranks.setdefault(pair, rank)
        self._ranks = ranks
        self._pre = regex.compile(pattern=pre.pattern)
        self._ignore_merges = pre.ignore_merges
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for word in self._pre.findall(text):
            ids = cache.get(word)
            if ids is None:
                if len(cache) >= _WORD_CACHE_LIMIT:
                    cache.clear()
                ids = cache[word] = self._encode_word(word)
            out.extend(ids)

    def _encode_word(self, word: str) -> tuple[int, ...]:
        chars = word.encode("utf-8").decode("latin-1").translate(_BYTES_TO_GPT2)
        if self._ignore_merges:
            whole = self._token_to_id.get(chars)
            if whole is not None:
                return (whole,)
        symbols = self._merge(list(chars))
        ids: list[int] = []
        for sym in symbols:
            tid = self._token_to_id.get(sym)
            if tid is not None:
                ids.append(tid)
                continue
            # llama.cpp then looks up each byte of the symbol's UTF-8 text as a one-byte string, so only
            # ASCII bytes can match; others are dropped. Unreachable with a complete byte-level vocabulary.
            for b in sym.encode("utf-8"):
                tid = self._token_to_id.get(chr(b)) if b < 0x80 else None
                if tid is not None:
                    ids.append(tid)
        return tuple(ids)

    def _merge(self, syms: list[str]) -> list[str]:
        """Merge the lowest-ranked adjacent pair (leftmost on ties) until none is left, like llama.cpp's
        priority queue; a linked list keeps long words O(n log n)."""
        n = len(syms)
        if n < 2:
            return syms
        ranks = self._ranks
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[int, int, int, str]] = []

        def push(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                rank = ranks.get((syms[left], syms[right]))
                if rank is not None:
                    heapq.heappush(heap, (rank, left, right, syms[left] + syms[right]))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, text = heapq.heappop(heap)
            if not syms[left] or not syms[right] or syms[left] + syms[right] != text:
                continue  # outdated: one side was merged since
            syms[left], syms[right] = text, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        return [s for s in syms if s]

    def piece(self, text: str) -> bytes:
        """A normal token's bytes: GPT-2 characters back to bytes."""
        try:
            return text.translate(_GPT2_TO_BYTES).encode("latin-1")
        except UnicodeEncodeError:
            return self._piece_slow(text)

    @staticmethod
    def _piece_slow(text: str) -> bytes:
        # llama.cpp's llama_decode_text writes an [UNK_BYTE_0x..] marker for a character outside the table.
        out = bytearray()
        for ch in text:
            mapped = _GPT2_TO_BYTES.get(ord(ch))
            if mapped is not None and mapped != "\uffff":
                out.append(ord(mapped))
            else:
                out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
        return bytes(out)


class _EscapedBpeModel(_BpeModel):
    """Gemma 4's BPE (`tokenizer.ggml.model == "gemma4"`): SentencePiece-style text (spaces escaped as
    U+2581, raw UTF-8 characters, no GPT-2 byte table) merged by rank over whole lines, newline runs
    apart (a run that is a token is that token); a symbol no token spells falls back to `<0xXX>` tokens
    byte by byte. Lines are merged in segments cut at escaped spaces (`_SpaceCuts`): the merge list's few
    pairs that join across such a cut are the exceptions."""

    def __init__(self, token_to_id: dict[str, int], merges: Sequence[str]) -> None:
        super().__init__(token_to_id, merges, _PreTokenizer(r"[^\n]+|\n+", clean_spaces=True))
        crossing = [a + b for a, b in self._ranks if a and b and _CROSSING.search(a[-1] + b[0])]
        self._cuts = _SpaceCuts(crossing)
        self._byte_ids = [token_to_id.get(f"<0x{b:02X}>") for b in range(256)]

    def encode(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for word in self._pre.findall(text.replace(" ", SPM_SPACE)):
            whole = self._token_to_id.get(word) if word[0] == "\n" else None
            if whole is not None:
                out.append(whole)
                continue
            for seg in self._cuts.split(word):
                ids = cache.get(seg)
                if ids is None:
                    if len(cache) >= _WORD_CACHE_LIMIT:
                        cache.clear()
                    ids = cache[seg] = self._encode_segment(seg)
                out.extend(ids)

    def _encode_segment(self, seg: str) -> tuple[int, ...]:
        ids: list[int] = []
        for sym in self._merge(list(seg)):
            tid = self._token_to_id.get(sym)
            if tid is not None:
                ids.append(tid)
                continue
            ids.extend(b for b in (self._byte_ids[b] for b in sym.encode("utf-8")) if b is not None)
        return tuple(ids)

    def piece(self, text: str) -> bytes:
        return text.replace(SPM_SPACE, " ").encode("utf-8")


class _SpmModel:
    """SentencePiece BPE as llama.cpp runs it: characters merged pairwise by the score of the merged
    token, highest first (leftmost on ties); leftover characters fall back to byte tokens."""

    def __init__(
        self, texts: Sequence[str], token_to_id: dict[str, int], scores: Sequence[float], unk_id: int
    ) -> None:
        self._token_to_id = token_to_id
        self._scores = scores
        self._byte_ids = [self._byte_token(token_to_id, b, unk_id) for b in range(256)]
        # A merge never crosses the boundary before a U+2581 that follows another character unless some
        # token contains that character pair: the few tokens that do are the cuts' exceptions.
        self._cuts = _SpaceCuts(t for t in texts if SPM_SPACE in t and _CROSSING.search(t))
        self._cache: dict[str, tuple[int, ...]] = {}

    @staticmethod
    def _byte_token(token_to_id: dict[str, int], b: int, unk_id: int) -> int:
        tid = token_to_id.get(f"<0x{b:02X}>")
        if tid is None:
            tid = token_to_id.get(chr(b)) if b < 0x80 else None
        return unk_id if tid is None else tid

    def encode(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for seg in self._cuts.split(text.replace(" ", SPM_SPACE)):
            ids = cache.get(seg)
            if ids is None:
                if len(cache) >= _WORD_CACHE_LIMIT:
                    cache.clear()
                ids = cache[seg] = self._encode_segment(seg)
            out.extend(ids)

    def _encode_segment(self, seg: str) -> tuple[int, ...]:
        syms = list(seg)
        n = len(syms)
        vocab, scores = self._token_to_id, self._scores
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            if left >= 0 and right >= 0:
                tid = vocab.get(syms[left] + syms[right])
                if tid is not None:
                    size = len(syms[left]) + len(syms[right])
                    heapq.heappush(heap, (-scores[tid], left, right, size))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not syms[left] or not syms[right] or len(syms[left]) + len(syms[right]) != size:
                continue  # outdated: one side was merged since
            syms[left] += syms[right]
            syms[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        ids: list[int] = []
        for sym in syms:
            if not sym:
                continue
            tid = vocab.get(sym)
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(self._byte_ids[b] for b in sym.encode("utf-8"))
        return tuple(ids)

    @staticmethod
    def piece(text: str) -> bytes:
        return text.replace(SPM_SPACE, " ").encode("utf-8")


def _special_piece(text: str, attr: int) -> bytes:
    """The bytes of a token that is not plain NORMAL (llama.cpp's token_to_piece, rendering specials)."""
    if attr & (_HIDDEN | _USER_DEFINED):
        return text.encode("utf-8")
    if attr & _BYTE:
        return _byte_of(text)
    return b""  # unused / undefined tokens render as nothing


def _byte_of(text: str) -> bytes:
    """A BYTE token's value: `<0xXX>` -> the byte (llama.cpp's token_to_byte)."""
    try:
        return bytes([int(text[3:5], 16)])
    except ValueError:
        return b""


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's detokenizer clean-up for BPE vocabularies that ask for it (three passes, in order)."""
    text = re.sub(rb" (?=[?!.,])", b"", text)
    text = text.replace(b" ' ", b"'")
    return re.sub(rb" (?='(?:s|m|re|ve))", b"", text)


def _meta_id(meta: dict[str, Any], key: str, default: int | None, n_vocab: int) -> int | None:
    """A special token id from the metadata; out-of-range values fall back to the default (llama.cpp)."""
    if default is not None and default >= n_vocab:
        default = None
    value = meta.get(key)
    if value is None:
        return default
    value = int(value)
    return value if 0 <= value < n_vocab else default


@dataclass(frozen=True)
class _SpecialIds:
    bos: int | None
    eos: int | None
    eot: int | None
    eom: int | None
    unk: int | None
    pad: int | None


@dataclass(frozen=True)
class _Options:
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool


@dataclass(frozen=True)
class _KindDefaults:
    """llama.cpp's defaults for a `tokenizer.ggml.model`, before the metadata overrides them."""

    bos: int | None
    eos: int | None
    unk: int | None
    add_bos: bool
    add_space_prefix: bool


_KIND_DEFAULTS = {
    "gpt2": _KindDefaults(bos=11, eos=11, unk=None, add_bos=False, add_space_prefix=False),
    "llama": _KindDefaults(bos=1, eos=2, unk=0, add_bos=True, add_space_prefix=True),
    # Gemma 4: BPE whose special ids come from the file only; llama.cpp adds BOS whatever the file says.
    "gemma4": _KindDefaults(bos=None, eos=None, unk=None, add_bos=True, add_space_prefix=False),
    # WordPiece (BERT-family encoders, engine/text/wordpiece.py): [CLS] 101 and [UNK] 100 by default.
    "bert": _KindDefaults(bos=101, eos=None, unk=100, add_bos=True, add_space_prefix=False),
}


def _flag(meta: dict[str, Any], key: str, default: bool) -> bool:
    value = meta.get(key)
    return default if value is None else bool(value)


def _attrs_of(meta: dict[str, Any], n_vocab: int) -> list[int]:
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        return [_NORMAL] * n_vocab
    return [_TYPE_TO_ATTR.get(t, 0) for t in types.tolist()]


def _pre_tokenizer(meta: dict[str, Any]) -> _PreTokenizer:
    name = str(meta.get("tokenizer.ggml.pre", ""))
    pre = _PRE_TOKENIZERS.get(name)
    if pre is None:
        known = ", ".join(sorted(_PRE_TOKENIZERS))
        raise UnsupportedModelError(f"unsupported BPE pre-tokenizer '{name}' (supported: {known})")
    return pre


def _model_of(
    kind: str, meta: dict[str, Any], tokens: list[str], token_to_id: dict[str, int], unk: int | None
) -> tuple[_BpeModel | _SpmModel, bool, bool]:
    """The vocabulary's tokenizer model, whether llama.cpp cleans its decoded spaces up, and whether its
    pre-tokenizer adds BOS by default."""
    if kind == "bert":  # llama.cpp cleans WordPiece's decoded spaces up
        return WordPieceModel.from_metadata(meta, tokens, unk), True, True
    if kind == "llama":
        scores = meta.get("tokenizer.ggml.scores")
        score_list = scores.tolist() if scores is not None else [0.0] * len(tokens)
        return _SpmModel(tokens, token_to_id, score_list, 0 if unk is None else unk), False, False
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise UnsupportedModelError("BPE vocabulary without tokenizer.ggml.merges")
    if kind == "gemma4":
        return _EscapedBpeModel(token_to_id, merges), True, True
    pre = _pre_tokenizer(meta)
    return _BpeModel(token_to_id, merges, pre), pre.clean_spaces, pre.add_bos


class Tokenizer:
    """A model's tokenizer; encode/decode like llama.cpp's llama_tokenize / llama_token_to_piece.

    Thread-safe: the only mutable state is the per-word caches, whose updates are single dict operations.
    """

    def __init__(
        self,
        tokens: list[str],
        attrs: list[int],
        model: _BpeModel | _SpmModel,
        ids: _SpecialIds,
        eog_ids: frozenset[int],
        options: _Options,
    ) -> None:
        self.tokens = tokens
        self.n_vocab = len(tokens)
        self._attrs = attrs
        self._model = model
        self.bos_id = -1 if ids.bos is None else ids.bos
        self.eos_id = -1 if ids.eos is None else ids.eos
        self.eot_id = ids.eot
        self.unk_id = ids.unk
        self.pad_id = ids.pad
        self.eog_ids = eog_ids
        self.add_bos = options.add_bos
        self.add_eos = options.add_eos
        self._options = options
        self._special = _SpecialTokens(tokens, attrs)
        piece = model.piece
        self._pieces = [
            piece(text) if attr == _NORMAL else _special_piece(text, attr)
            for text, attr in zip(tokens, attrs, strict=True)
        ]
        self.fim = FimTokens()  # the fill-in-the-middle tokens (from_gguf finds them)
        # WordPiece's [SEP] (from_gguf sets it): an input with special tokens ends with it, and
        # llama-server's rerank layout puts it between query and document when `add_sep`.
        self.sep_id: int | None = None
        self.add_sep = False
        self._pieces_plain = [b"" if a & _HIDDEN else p for a, p in zip(attrs, self._pieces, strict=True)]

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> Tokenizer:
        meta = g.metadata
        kind = str(meta.get("tokenizer.ggml.model", ""))
        defaults = _KIND_DEFAULTS.get(kind)
        if defaults is None:
            known = ", ".join(_KIND_DEFAULTS)
            raise UnsupportedModelError(f"unsupported tokenizer model '{kind}' (supported: {known})")
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(meta["tokenizer.ggml.tokens"])]
        n_vocab = len(tokens)
        token_to_id = {t: i for i, t in enumerate(tokens)}
        if len(token_to_id) != n_vocab:
            raise UnsupportedModelError("duplicate token texts in the vocabulary")
        attrs = _attrs_of(meta, n_vocab)
        ids = _SpecialIds(
            bos=_meta_id(meta, "tokenizer.ggml.bos_token_id", defaults.bos, n_vocab),
            eos=_meta_id(meta, "tokenizer.ggml.eos_token_id", defaults.eos, n_vocab),
            eot=_meta_id(meta, "tokenizer.ggml.eot_token_id", None, n_vocab),
            eom=_meta_id(meta, "tokenizer.ggml.eom_token_id", None, n_vocab),
            unk=_meta_id(meta, "tokenizer.ggml.unknown_token_id", defaults.unk, n_vocab),
            pad=_meta_id(meta, "tokenizer.ggml.padding_token_id", None, n_vocab),
        )
        model, clean_spaces, add_bos = _model_of(kind, meta, tokens, token_to_id, ids.unk)
        if kind == "gemma4":  # llama.cpp overrides a file's add_bos_token false for Gemma 4
            meta = {**meta, "tokenizer.ggml.add_bos_token": True}
        options = _Options(
            add_bos=_flag(meta, "tokenizer.ggml.add_bos_token", add_bos or defaults.add_bos),
            add_eos=_flag(meta, "tokenizer.ggml.add_eos_token", False),
            add_space_prefix=_flag(meta, "tokenizer.ggml.add_space_prefix", defaults.add_space_prefix),
            clean_spaces=clean_spaces,
        )
        if (options.add_bos and ids.bos is None) or (options.add_eos and ids.eos is None):
            raise UnsupportedModelError("the tokenizer adds a BOS/EOS token the vocabulary does not define")
        ids, eog_ids = _resolve_eog(meta, tokens, token_to_id, attrs, ids)
        tokenizer = cls(tokens, attrs, model, ids, eog_ids, options)
        tokenizer.fim = FimTokens.from_vocab(meta, token_to_id)
        if kind == "bert":
            tokenizer.sep_id = _meta_id(meta, "tokenizer.ggml.seperator_token_id", 102, n_vocab)
            tokenizer.add_sep = _flag(meta, "tokenizer.ggml.add_sep_token", True)
        return tokenizer

    # -- encoding -------------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; `add_special` applies the model's BOS/EOS rule, `parse_special` turns
        control-token texts into their ids (user-defined tokens always are)."""
        if add_special and self.sep_id is not None:  # WordPiece: [CLS] text [SEP], whatever the flags say
            return [self.bos_id, *self.encode(text, False, parse_special), self.sep_id]
        text = _without_surrogates(text)
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        # SentencePiece prefixes a space to text that starts the prompt or follows a special token.
        spm_prefix = self._options.add_space_prefix and isinstance(self._model, _SpmModel)
        prev_special = True
        for frag in self._special.partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
            else:
                self._model.encode(" " + frag if spm_prefix and prev_special else frag, out)
                prev_special = False
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    # -- decoding -------------------------------------------------------------------------------------

    def token_to_piece(self, token: int, render_special: bool = True) -> bytes:
        """The bytes of one token (may be part of a UTF-8 character). Control and unknown tokens are
        empty unless `render_special`."""
        if not 0 <= token < self.n_vocab:
            raise ValueError(f"token id {token} out of range [0, {self.n_vocab})")
        return (self._pieces if render_special else self._pieces_plain)[token]

    def decode(self, tokens: Sequence[int], render_special: bool = True) -> str:
        return self.decode_bytes(tokens, render_special).decode("utf-8", errors="replace")

    def decode_bytes(self, tokens: Sequence[int], render_special: bool = True) -> bytes:
        """llama.cpp's llama_detokenize (keeping BOS/EOS) as bytes."""
        if len(tokens) == 0:
            return b""
        if min(tokens) < 0 or max(tokens) >= self.n_vocab:
            raise ValueError(f"token id out of range [0, {self.n_vocab})")
        pieces = self._pieces if render_special else self._pieces_plain
        out = b"".join([pieces[t] for t in tokens])
        if self._options.add_space_prefix and pieces[tokens[0]].startswith(b" "):
            out = out[1:]  # the space SentencePiece prefixed to the text
        return _clean_spaces(out) if self._options.clean_spaces else out

    # -- token classes --------------------------------------------------------------------------------

    def is_control(self, token: int) -> bool:
        return bool(self._attrs[token] & _CONTROL)

    def is_eog(self, token: int) -> bool:
        return token in self.eog_ids

    def attr(self, token: int) -> TokenAttr:
        return TokenAttr(self._attrs[token])


_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_surrogates(text: str) -> str:
    """Lone surrogates (possible in a Python str, not in UTF-8) become U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _resolve_eog(
    meta: dict[str, Any],
    tokens: list[str],
    token_to_id: dict[str, int],
    attrs: list[int],
    ids: _SpecialIds,
) -> tuple[_SpecialIds, frozenset[int]]:
    """llama.cpp's text-based detection of EOT and FIM tokens, and its end-of-generation set. Tokens it
    finds this way become CONTROL (updates `attrs` in place, as llama.cpp does at load)."""
    eot = ids.eot
    if eot is None:
        eot = next((token_to_id[t] for t in _EOT_TEXTS if t in token_to_id), None)
        if eot is not None:
            attrs[eot] |= _CONTROL
    eog: set[int] = set()
    for key, texts in _FIM_EOG_TEXTS.items():
        tid = _meta_id(meta, key, None, len(tokens))
        if tid is None:
            tid = next((token_to_id[t] for t in texts if t in token_to_id), None)
            if tid is not None:
                attrs[tid] |= _CONTROL
        if tid is not None:
            eog.add(tid)
    for text in _EOG_TEXTS:
        tid = token_to_id.get(text)
        if tid is not None:
            eog.add(tid)
            attrs[tid] |= _CONTROL
    for text in _FORCED_USER_DEFINED:
        tid = token_to_id.get(text)
        if tid is not None:
            attrs[tid] = _USER_DEFINED
    eog.update(t for t in (ids.eos, eot, ids.eom) if t is not None)
    texts = {tokens[t] for t in eog}
    # gpt-oss / solar-open: "<|end|>" ends a message there, not the generation.
    if {"<|return|>", "<|call|>", "<|end|>"} <= texts or {"<|calls|>", "<|flush|>", "<|end|>"} <= texts:
        end = token_to_id["<|end|>"]
        eog.discard(end)
        attrs[end] = _USER_DEFINED
    if {"<|tool_response>", "</s>"} <= texts:  # gemma4: "</s>" is ordinary text there
        s = token_to_id["</s>"]
        eog.discard(s)
        attrs[s] = _NORMAL
    resolved = _SpecialIds(bos=ids.bos, eos=ids.eos, eot=eot, eom=ids.eom, unk=ids.unk, pad=ids.pad)
    return resolved, frozenset(eog)


class IncrementalDecoder:
    """Streams one sequence's text: bytes of a character split across tokens are held back until the
    character is complete, so no push returns half a character."""

    def __init__(self, tokenizer: Tokenizer, render_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._render_special = render_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._utf8.decode(self._tokenizer.token_to_piece(token, self._render_special))

    def flush(self) -> str:
        """Whatever is left; an incomplete trailing character becomes U+FFFD."""
        return self._utf8.decode(b"", final=True)
