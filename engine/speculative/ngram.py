"""Speculators without a draft model: they draft what followed the same tokens earlier.

- `ngram-simple`: the most recent earlier occurrence of the history's last n tokens; draft the m tokens
  that followed it (llama.cpp's common_ngram_simple_draft).
- `ngram-map-k`: the same lookup through a map kept per sequence, with llama.cpp's `--spec-ngram-min-hits`
  (a key must have been seen that often) and what each key's last draft earned (a key whose draft was
  refused outright waits until it recurs again).
- `ngram-cache`: llama.cpp's lookup decoding: next-token counts of 1- to 4-grams from the sequence's
  own tokens and from a cache shared by every request (filled with finished sequences: it persists
  across requests); a draft grows one token at a time while the longest matching n-gram's favourite is
  frequent enough.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.speculative.base import SpecParams, Speculator


def last_match_end(history: np.ndarray, n: int) -> int | None:
    """Where the most recent earlier occurrence of `history`'s last n tokens ends, or None.

    Vectorised (all windows compared at once): ~20 us for a 2k-token history at n = 12.
    """
    if history.size <= n:
        return None
    windows = sliding_window_view(history[:-1], n)  # every n-gram that ends before the last token
    hits = np.flatnonzero((windows == history[-n:]).all(axis=1))
    return int(hits[-1]) + n if hits.size else None


class NgramSimple(Speculator):
    """Each sequence's n-grams indexed as its history grows (where each was last followed), so a step's
    lookup is one dict probe: `last_match_end` over the whole history cost ~130 us a step in the engine
    (SmolLM2, 2% of a one-stream step), as much as the draft it looked for was worth on a chat."""

    name = "ngram-simple"
    cheap = True

    def __init__(self) -> None:
        self._index: dict[str, _Index] = {}

    def propose(self, key: str, history: Sequence[int], params: SpecParams, n: int) -> list[int]:
        size = params.ngram_n
        if len(history) <= size:
            return []
        end = self._indexed(key, history, size).last_end.get(tuple(history[-size:]))
        return [] if end is None else list(history[end : end + min(n, params.ngram_m)])

    def forget(self, key: str) -> None:
        self._index.pop(key, None)

    def _indexed(self, key: str, history: Sequence[int], size: int) -> _Index:
        """The index of every n-gram followed by at least one token; rebuilt when `history` is not the
        indexed one grown (another n, a context shift), as told by its length and last indexed token:
        a wrong index costs acceptance, never output (every draft is verified)."""
        index = self._index.get(key)
        if index is None or not index.extends(history, size):
            index = self._index[key] = _Index(size)
        for end in index.new_ends(history):
            index.last_end[tuple(history[end - size : end])] = end
        return index


@dataclass
class _Index:
    """One sequence's n-grams (ngram-simple): where each was last followed, up to `done` tokens."""

    n: int
    done: int = 0  # history positions indexed
    tail: int = -1  # the token at done - 1, to tell a grown history from another one
    last_end: dict[tuple[int, ...], int] = field(default_factory=dict)

    def extends(self, history: Sequence[int], n: int) -> bool:
        """Whether `history` is the one indexed, grown or not, for n-grams of n."""
        return (
            self.n == n
            and self.done <= len(history)
            and (self.done == 0 or history[self.done - 1] == self.tail)
        )

    def new_ends(self, history: Sequence[int]) -> range:
        """The ends of the n-grams not yet indexed; they count as indexed from here on."""
        ends = range(max(self.done, self.n), len(history))
        if history:
            self.done, self.tail = len(history), history[-1]
        return ends


@dataclass
class _KeyMap(_Index):
    """One sequence's n-gram keys (ngram-map-k): also how often each was seen, and its last result."""

    hits: Counter[tuple[int, ...]] = field(default_factory=Counter)
    refused: set[tuple[int, ...]] = field(default_factory=set)  # its last draft got nothing accepted
    last_key: tuple[int, ...] = ()  # the key of the draft being verified


class NgramMapK(Speculator):
    name = "ngram-map-k"
    cheap = True

    def __init__(self) -> None:
        self._maps: dict[str, _KeyMap] = {}

    def propose(self, key: str, history: Sequence[int], params: SpecParams, n: int) -> list[int]:
        keys = self._index(key, history, params.ngram_n)
        current = tuple(history[-params.ngram_n :])
        end = keys.last_end.get(current)
        if end is None or keys.hits[current] < params.min_hits or current in keys.refused:
            return []
        keys.last_key = current
        return list(history[end : end + min(n, params.ngram_m)])

    def accepted(self, key: str, history: Sequence[int], proposed: list[int], n_accepted: int) -> None:
        keys = self._maps.get(key)
        if keys is not None and n_accepted == 0:
            keys.refused.add(keys.last_key)

    def forget(self, key: str) -> None:
        self._maps.pop(key, None)

    def _index(self, key: str, history: Sequence[int], n: int) -> _KeyMap:
        """Index every key followed by at least one token (the current one is looked up, not indexed);
        rebuilt, hits and refusals too, when `history` is not the indexed one grown (a context shift)."""
        keys = self._maps.get(key)
        if keys is None or not keys.extends(history, n):
            keys = self._maps[key] = _KeyMap(n)
        for end in keys.new_ends(history):
            ngram = tuple(history[end - n : end])
            keys.last_end[ngram] = end
            keys.hits[ngram] += 1
            keys.refused.discard(ngram)  # seen again: worth another try
        return keys


NgramCounts = dict[tuple[int, ...], Counter[int]]
# llama.cpp's lookup thresholds per n-gram size 1..4 (ngram-cache.h): enough samples, a clear favourite.
_MIN_SAMPLES = {1: 2, 2: 2, 3: 1, 4: 1}
_MIN_PERCENT = {1: 66, 2: 50, 3: 50, 4: 50}
_SIZES = (4, 3, 2, 1)


def count_ngrams(counts: NgramCounts, tokens: Sequence[int], start: int) -> None:
    """Add the next-token counts of every 1- to 4-gram that ends at a position >= start."""
    for end in range(max(start, 1), len(tokens)):
        for size in _SIZES:
            if end - size >= 0:
                counts.setdefault(tuple(tokens[end - size : end]), Counter())[tokens[end]] += 1


def favourite(counts: NgramCounts, tokens: Sequence[int]) -> int | None:
    """The next token the longest matching n-gram makes likely enough, or None."""
    for size in _SIZES:
        seen = counts.get(tuple(tokens[-size:])) if len(tokens) >= size else None
        if not seen:
            continue
        token, count = seen.most_common(1)[0]
        total = sum(seen.values())
        if total >= _MIN_SAMPLES[size] and 100 * count >= _MIN_PERCENT[size] * total:
            return token
    return None


class NgramCache(Speculator):
    name = "ngram-cache"
    cheap = True

    def __init__(self) -> None:
        self.shared: NgramCounts = {}  # every finished sequence's n-grams: outlives requests
        self._own: dict[str, tuple[NgramCounts, list[int]]] = {}

    def propose(self, key: str, history: Sequence[int], params: SpecParams, n: int) -> list[int]:
        own, seen = self._own.setdefault(key, ({}, []))
        count_ngrams(own, history, len(seen))
        seen[:] = history
        draft: list[int] = []
        context = list(history[-4:])
        while len(draft) < n:
            token = favourite(own, context)
            if token is None:
                token = favourite(self.shared, context)
            if token is None:
                break
            draft.append(token)
            context = [*context[-3:], token]
        return draft

    def forget(self, key: str) -> None:
        _, tokens = self._own.pop(key, ({}, []))
        count_ngrams(self.shared, tokens, 0)
