"""DRY ("Don't Repeat Yourself", llama.cpp's `dry` sampler, from koboldcpp): a token that would extend a
sequence already seen in the recent history loses multiplier * base ^ (length - allowed_length).

Sequence breakers (strings such as "\\n" or ":") stop a repetition from reaching back across them. They
are matched on tokens: every token whose text contains a breaker is a breaker on its own, and a token
whose text ends with the start of a breaker is one when the tokens after it spell the rest (llama.cpp's
get_overlapping_token_sequences). `DryVocabulary` finds those tokens once per breaker set and tokenizer.

The repetition lengths come from a Z-function over the reversed history (linear time, a Numba kernel:
the whole context, e.g. `dry_penalty_last_n: -1` on 8k tokens, is ~10 ms a token in plain Python).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numba import njit

from engine.sampling.params import SamplingParams

MAX_BREAKER_BYTES = 40  # llama.cpp cuts longer breakers to this many bytes
MAX_TAIL_TOKENS = 20  # and their token tails to this many tokens
_FLOAT_MAX_LOG = 88.7228391  # log(FLT_MAX): the exponent is clamped so base^exponent stays finite
_CACHED_SETS = 16


class Vocabulary(Protocol):
    """What DRY needs of a tokenizer (engine/text/tokenizer.py's Tokenizer has it)."""

    n_vocab: int

    def token_to_piece(self, token: int, render_special: bool = True) -> bytes: ...

    def decode_bytes(self, tokens: list[int], render_special: bool = True) -> bytes: ...

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class Breakers:
    """Head token -> the token tails that complete a breaker after it (an empty tail: the token alone)."""

    tails: dict[int, tuple[tuple[int, ...], ...]]

    @property
    def heads(self) -> np.ndarray:
        return np.fromiter(self.tails, dtype=np.int64, count=len(self.tails))

    def single(self, token: int) -> bool:
        return () in self.tails.get(token, ())


NO_BREAKERS = Breakers({})


class DryVocabulary:
    """One tokenizer's breaker tables, computed on first use of each breaker set and kept (a few)."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self._blob: tuple[np.ndarray, np.ndarray] | None = None
        self._sets: dict[tuple[str, ...], Breakers] = {}

    def breakers(self, strings: tuple[str, ...]) -> Breakers:
        found = self._sets.get(strings)
        if found is None:
            found = Breakers(self._build(strings))
            if len(self._sets) >= _CACHED_SETS:
                self._sets.pop(next(iter(self._sets)))
            self._sets[strings] = found
        return found

    def _build(self, strings: tuple[str, ...]) -> dict[int, tuple[tuple[int, ...], ...]]:
        tails: dict[int, list[tuple[int, ...]]] = {}
        for text in strings:
            breaker = text.encode("utf-8", errors="replace")[:MAX_BREAKER_BYTES]
            if not breaker:
                continue
            for token in self._tokens_with_byte(breaker[0]):
                for tail in self._overlaps(int(token), breaker):
                    if tail not in tails.setdefault(int(token), []):
                        tails[int(token)].append(tail)
        return {token: tuple(found) for token, found in tails.items()}

    def _overlaps(self, token: int, breaker: bytes) -> list[tuple[int, ...]]:
        """The tails that make `token` start `breaker`: () if its text contains it, else one per place
        where its text ends with a beginning of the breaker (the rest, tokenized)."""
        word = self.vocab.decode_bytes([token], True)
        if breaker in word:
            return [()]
        found = []
        at = word.find(breaker[:1])
        while at != -1:
            if breaker.startswith(word[at:]):
                rest = breaker[len(word) - at :].decode("utf-8", errors="replace")
                found.append(tuple(self.vocab.encode(rest, False, False)[:MAX_TAIL_TOKENS]))
            at = word.find(breaker[:1], at + 1)
        return found

    def _tokens_with_byte(self, byte: int) -> np.ndarray:
        """Tokens whose text contains `byte`: a search of all pieces joined (built once, ~0.1 s on a
        262k vocabulary; a Python loop over the pieces per breaker would cost that every time)."""
        if self._blob is None:
            pieces = [self.vocab.token_to_piece(t) for t in range(self.vocab.n_vocab)]
            ends = np.cumsum([len(p) for p in pieces])
            self._blob = (np.frombuffer(b"".join(pieces), dtype=np.uint8), ends)
        blob, ends = self._blob
        return np.unique(np.searchsorted(ends, np.flatnonzero(blob == byte), side="right"))


class Dry:
    """One sequence's DRY state: its recent tokens, and the penalties they call for."""

    def __init__(self, params: SamplingParams, breakers: Breakers) -> None:
        self.multiplier = params.dry_multiplier
        self.base = params.dry_base
        self.allowed = params.dry_allowed_length
        window = params.dry_penalty_last_n
        self.history: deque[int] = deque(maxlen=window if window > 0 else None)
        self.breakers = breakers
        self._heads = breakers.heads

    def accept(self, token: int) -> None:
        self.history.append(token)

    def penalties(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(tokens, amounts to subtract from their logits), or None when nothing is penalised."""
        n = len(self.history)
        if n <= self.allowed:
            return None
        history = np.fromiter(self.history, dtype=np.int64, count=n)
        limit = self._repetition_limit(history)
        if limit < self.allowed:
            return None
        # lengths[p]: how far the text ending at p matches the text ending now (capped at the limit);
        # the token after p would extend that repetition.
        z = suffix_matches(history[::-1].copy())
        lengths = np.minimum(z[1:][::-1], limit)
        repeats = np.flatnonzero(lengths >= self.allowed)
        if not repeats.size:
            return None
        tokens, longest = _longest_per_token(history[repeats + 1], lengths[repeats])
        penalised = np.array([not self.breakers.single(int(t)) for t in tokens], dtype=bool)
        return tokens[penalised], self._amounts(longest[penalised])

    def _amounts(self, lengths: np.ndarray) -> np.ndarray:
        """multiplier * base ^ (length - allowed), as llama.cpp computes it (float base, double power)."""
        base = np.float32(self.base)
        exponent = lengths - self.allowed
        cap = int(np.float32(_FLOAT_MAX_LOG) / np.log(base)) if base > np.float32(1.000001) else 0
        if cap > 0:
            exponent = np.minimum(exponent, cap)
        return (np.float32(self.multiplier) * np.power(np.float64(base), exponent)).astype(np.float32)

    def _repetition_limit(self, history: np.ndarray) -> int:
        """How far back a repetition may reach: up to the most recent complete breaker, else all of it."""
        n = history.size
        if not self._heads.size:
            return n
        for at in np.flatnonzero(np.isin(history, self._heads))[::-1]:
            back = n - 1 - int(at)  # how many tokens came after the head
            longest = -1
            for tail in self.breakers.tails[int(history[at])]:
                size = len(tail)
                if longest < size <= back and tuple(history[at + 1 : at + 1 + size]) == tail:
                    longest = size
            if longest >= 0:
                return back - longest
        return n


def _longest_per_token(tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((-lengths, tokens))
    tokens, lengths = tokens[order], lengths[order]
    first = np.flatnonzero(np.r_[True, tokens[1:] != tokens[:-1]])
    return tokens[first], lengths[first]


@njit(cache=True, nogil=True)
def suffix_matches(tokens: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """The Z-function: z[k] = how many tokens from k on match the tokens from 0 on (z[0] = 0)."""
    n = tokens.size
    z = np.zeros(n, np.int64)
    left = 0
    right = 0
    for k in range(1, n):
        if k <= right and z[k - left] < right - k + 1:
            z[k] = z[k - left]
            continue
        i = max(k, right + 1)
        while i < n and tokens[i] == tokens[i - k]:
            i += 1
        z[k] = i - k
        if i - 1 >= k:
            left, right = k, i - 1
    return z
