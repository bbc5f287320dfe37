"""What the slots, the scheduler, the prompt cache and slot files ask of a model's memory.

A model's memory (`model.new_cache`) is one of four kinds, as llama.cpp separates them:
- `KVCache` (kv.py): keys and values per position; any prefix can be kept, so truncation is free;
- `RecurrentCache` (recurrent.py): a fixed-size state per sequence (a short convolution's tail and a
  Gated DeltaNet's matrix per head) that has absorbed every token; it cannot be cut back to a shorter
  prefix, only restored from a checkpoint (checkpoints.py) or cleared;
- `HybridMemory` (hybrid.py): both, for models that mix attention and recurrent layers (Qwen3.5);
- `StatelessMemory` (stateless.py): none at all, for encoders (BERT and kin), which read each input
  whole in one pass; its `whole_inputs` tells the scheduler so (llama.cpp creates no memory for them).

Every kind moves a sequence's memory through the host as a `MemoryState`, and keeps one length per
sequence: the tokens its memory has absorbed, which is also the next position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class MemoryState:
    """A host copy of one sequence's memory after `n_tokens` tokens. KV cells are [n_layer, n_kv_heads,
    n_tokens, row] in the cache's types; a recurrent state is [n_layer, ...] per part (conv, ssm)."""

    n_tokens: int
    k: np.ndarray | None = None
    v: np.ndarray | None = None
    conv: np.ndarray | None = None
    ssm: np.ndarray | None = None
    # Recurrent snapshots at earlier positions (engine/memory/checkpoints.py), ascending: the prefixes
    # this state can be cut back to.
    checkpoints: tuple[MemoryState, ...] = ()

    @property
    def recurrent(self) -> bool:
        return self.conv is not None

    @property
    def n_bytes(self) -> int:
        own = sum(a.nbytes for a in (self.k, self.v, self.conv, self.ssm) if a is not None)
        return own + sum(c.n_bytes for c in self.checkpoints)

    def restorable(self, n: int) -> int:
        """The longest prefix of at most n tokens this state can give: any for KV cells; for a recurrent
        state, its whole length or a checkpoint's (0 when none fits)."""
        if not self.recurrent or n >= self.n_tokens:
            return min(n, self.n_tokens)
        fits = [c.n_tokens for c in self.checkpoints if c.n_tokens <= n]
        return fits[-1] if fits else 0

    def prefix(self, n: int) -> MemoryState:
        """The state after the first n tokens (n from `restorable`): KV cells are cut; a recurrent part
        is the checkpoint of exactly n tokens."""
        if n == self.n_tokens:
            return self
        k = None if self.k is None else self.k[:, :, :n]
        v = None if self.v is None else self.v[:, :, :n]
        if not self.recurrent:
            return MemoryState(n, k, v)
        (snapshot,) = [c for c in self.checkpoints if c.n_tokens == n]
        earlier = tuple(c for c in self.checkpoints if c.n_tokens < n)
        return MemoryState(n, k, v, snapshot.conv, snapshot.ssm, earlier)


class SequenceMemory(Protocol):
    """The interface every memory kind keeps (KVCache, RecurrentCache, HybridMemory)."""

    lengths: np.ndarray  # int64 [n_seq]: tokens each sequence's memory holds

    @property
    def n_seq(self) -> int: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def n_bytes(self) -> int: ...

    @property
    def can_shift(self) -> bool:
        """Whether cells can be moved to other positions (context shift); recurrent state cannot."""
        ...

    # True for an encoder's memory (stateless.py): each input must come whole, in one step, from
    # position 0, and nothing is kept, so nothing generates, speculates or goes to a slot file.
    whole_inputs: bool

    def check_batch(self, seq_ids: np.ndarray, positions: np.ndarray) -> None: ...

    def commit(self, seq_ids: np.ndarray, positions: np.ndarray) -> None: ...

    def truncate(self, seq_id: int, length: int) -> int:
        """Keep at most the first `length` tokens of `seq_id`: the number actually kept (a recurrent
        memory keeps the nearest checkpoint at or below `length`, or nothing)."""
        ...

    def clear(self, seq_id: int) -> None: ...

    def read(self, seq_id: int, n: int) -> MemoryState:
        """A host copy of the first n tokens' memory (a recurrent memory: n must be its length)."""
        ...

    def write(self, seq_id: int, state: MemoryState) -> None:
        """Replace `seq_id`'s memory with `state`; its length becomes state.n_tokens."""
        ...

    def copy(self, src: int, dst: int, n: int) -> None:
        """Give `dst` the memory of `src`'s first n tokens (`n` choices of one prompt)."""
        ...

    def checkpoint(self, seq_id: int) -> None:
        """Snapshot what cannot be truncated at the sequence's current length (nothing for KV)."""
        ...
