"""`StatelessMemory`: the memory of an encoder, which holds nothing between forward passes.

An encoder (BERT and kin) reads its input whole in one pass, every token attending to every other, and
keeps no keys or values afterwards (llama.cpp creates no memory for these architectures). The slots and
the scheduler still speak `SequenceMemory`; this kind answers them truthfully: every sequence holds 0
tokens, a batch must bring each of its sequences' inputs whole from position 0 (`check_batch`), nothing
can be kept, copied, restored or shifted, and a host copy is always empty. So a slot never reuses a
prefix, the prompt cache never stores a state, and the scheduler knows to take an input all at once
(`whole_inputs`).
"""

from __future__ import annotations

import numpy as np

from engine.memory.base import MemoryState


class StatelessMemory:
    """The `SequenceMemory` of a model without a cache: n_seq slots of n_ctx positions, all empty."""

    whole_inputs = True  # a sequence's tokens must come in one batch part (the scheduler reads this)

    def __init__(self, n_seq: int, n_ctx: int) -> None:
        self._n_seq = n_seq
        self._n_ctx = n_ctx
        self.lengths = np.zeros(n_seq, dtype=np.int64)  # always 0: nothing is held

    @property
    def n_seq(self) -> int:
        return self._n_seq

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_bytes(self) -> int:
        return 0

    @property
    def can_shift(self) -> bool:
        return False

    def check_batch(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        """Each sequence of the batch must be one whole input: positions 0, 1, ... n - 1 in order."""
        if len(seq_ids) == 0:
            return
        if seq_ids.min() < 0 or seq_ids.max() >= self._n_seq:
            raise ValueError("sequence id outside the slots")
        if positions.max() >= self._n_ctx:
            raise ValueError(f"position outside the context of {self._n_ctx} tokens")
        for s in np.unique(seq_ids):
            at = positions[seq_ids == s]
            if not np.array_equal(at, np.arange(len(at))):
                raise ValueError(f"sequence {s}: an encoder's input must come whole, from position 0")

    def commit(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        """Nothing is kept: the pass's keys and values are gone with it."""

    def truncate(self, seq_id: int, length: int) -> int:
        return 0

    def clear(self, seq_id: int) -> None:
        """Nothing to clear."""

    def read(self, seq_id: int, n: int) -> MemoryState:
        return MemoryState(0)

    def write(self, seq_id: int, state: MemoryState) -> None:
        if state.n_tokens:
            raise ValueError("an encoder holds no memory to restore")

    def copy(self, src: int, dst: int, n: int) -> None:
        """Nothing to copy."""

    def checkpoint(self, seq_id: int) -> None:
        """Nothing to snapshot."""
