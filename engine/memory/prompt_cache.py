"""The host prompt cache (`--cache-ram`): slot states kept in RAM after another conversation took the slot.

Chat clients resend the whole conversation every turn; with more conversations than slots, a slot's
cells are overwritten in between. Saving them here first lets the conversation's next turn load its
prefix back and process only what is new. Entries are evicted least recently used first, so the bytes
held never exceed the limit.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.lora import shared_cells
from engine.memory.base import MemoryState

MIN_KEEP = 0.25  # llama-server skips an entry when less than this share of its tokens would be kept


@dataclass(frozen=True)
class CacheEntry:
    tokens: tuple[int, ...]
    state: MemoryState  # host memory: KV cells, recurrent state and its checkpoints
    # The LoRA adapter set the cells were computed under (engine/lora.py), from position `tag_from` on
    # (an aLoRA's activation; the cells before it are the base's): reused as engine/lora.py's shared_cells
    # allows
    tag: tuple[tuple[int, float], ...] = ()
    tag_from: int = 0

    @property
    def key(self) -> tuple[Any, tuple[int, ...]]:
        return (self.tag, self.tag_from), self.tokens

    @property
    def n_bytes(self) -> int:
        return self.state.n_bytes + 8 * len(self.tokens)


@dataclass(frozen=True)
class CacheHit:
    entry: CacheEntry
    n_keep: int  # tokens of the entry that match the prompt


def mib_to_bytes(cache_ram_mib: int) -> int | None:
    """--cache-ram in MiB -> a byte limit; -1 (any negative) is None, no limit; 0 turns the cache off."""
    return None if cache_ram_mib < 0 else cache_ram_mib * 1024 * 1024


class PromptCache:
    def __init__(self, limit_bytes: int | None) -> None:
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[tuple[Any, tuple[int, ...]], CacheEntry] = (
            OrderedDict()
        )  # oldest use first
        self.n_bytes = 0

    @property
    def enabled(self) -> bool:
        return self.limit_bytes is None or self.limit_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def prompts(self) -> list[tuple[int, ...]]:
        """The token sequences whose states are kept (a cluster replica's cache summary)."""
        return [entry.tokens for entry in self._entries.values()]

    def save(
        self,
        tokens: list[int],
        state: MemoryState,
        tag: tuple[tuple[int, float], ...] = (),
        tag_from: int = 0,
    ) -> bool:
        """Keep a slot's state (computed under LoRA set `tag` from position `tag_from` on); False when it is
        empty, covered by an entry already, or over the limit."""
        entry = CacheEntry(tuple(tokens), state, tag, tag_from)
        if not tokens or not self._fits(entry.n_bytes):
            return False
        if any(_covers(old, entry) for old in self._entries.values()):
            return False  # an entry already holds this state and more
        for old in [e.key for e in self._entries.values() if _covers(entry, e)]:
            self._remove(old)  # the new entry extends it: the old one is redundant
        self._entries[entry.key] = entry
        self.n_bytes += entry.n_bytes
        self._evict()
        return True

    def best(
        self, prompt: list[int], tag: tuple[tuple[int, float], ...] = (), tag_from: int = 0
    ) -> CacheHit | None:
        """The entry sharing the longest prefix with `prompt` computed alike (under LoRA set `tag` from
        `tag_from` on), if it keeps at least MIN_KEEP of its tokens."""
        best: CacheHit | None = None
        for entry in self._entries.values():
            alike = shared_cells(entry.tag, entry.tag_from, tag, tag_from)
            n = entry.state.restorable(int(min(common_prefix(entry.tokens, prompt), alike)))
            if n >= MIN_KEEP * len(entry.tokens) and n > 0 and (best is None or n > best.n_keep):
                best = CacheHit(entry, n)
        if best is not None:
            self._entries.move_to_end(best.entry.key)
        return best

    def _fits(self, n_bytes: int) -> bool:
        return self.limit_bytes is None or n_bytes <= self.limit_bytes

    def _evict(self) -> None:
        while self.limit_bytes is not None and self.n_bytes > self.limit_bytes:
            self._remove(next(iter(self._entries)))

    def _remove(self, key: tuple[Any, tuple[int, ...]]) -> None:
        self.n_bytes -= self._entries.pop(key).n_bytes


def _covers(entry: CacheEntry, other: CacheEntry) -> bool:
    """Whether `entry` can give `other`'s state: its tokens under the same LoRA set from the same position
    (a recurrent one only at a checkpoint)."""
    n, tokens = len(other.tokens), other.tokens
    return (
        (entry.tag, entry.tag_from) == (other.tag, other.tag_from)
        and n <= len(entry.tokens)
        and entry.tokens[:n] == tokens
        and entry.state.restorable(n) == n
    )


def common_prefix(a: list[int] | tuple[int, ...], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n
