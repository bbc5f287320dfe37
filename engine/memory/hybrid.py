"""The hybrid memory of models that mix attention and recurrent layers (Qwen3.5, Qwen3-Next): a KV
cache for the attention layers and a recurrent state store for the others, at one position, with
checkpoints of the recurrent part so that a sequence can still be cut back to a shorter prefix.

Where snapshots are taken (`checkpoint_positions`, llama-server's choice in spirit): after every
end-of-turn token of a prompt (the end of each message, where the next turn of a chat shares the
history) at least `min_step` tokens apart, and 4 tokens before the prompt's end (a resent prompt, or
one whose last few tokens re-tokenize differently, restores it and processes 4 tokens).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from engine.memory.base import MemoryState
from engine.memory.checkpoints import DEFAULT_MAX_COUNT, Checkpoints
from engine.memory.kv import KVCache
from engine.memory.recurrent import RecurrentCache

END_OFFSET = 4  # llama-server checkpoints 4 tokens before a prompt's end (and n_ubatch + 4)
DEFAULT_MIN_STEP = 8192  # llama-server's --checkpoint-min-step default


class HybridMemory:
    def __init__(
        self, kv: KVCache, recurrent: RecurrentCache, max_checkpoints: int = DEFAULT_MAX_COUNT
    ) -> None:
        self.kv = kv
        self.recurrent = recurrent
        self.lengths = kv.lengths  # the same array: both parts hold the same tokens
        self.checkpoints = [Checkpoints(max_checkpoints) for _ in range(kv.n_seq)]

    @property
    def n_seq(self) -> int:
        return self.kv.n_seq

    @property
    def max_checkpoints(self) -> int:
        return self.checkpoints[0].max_count

    def limit_checkpoints(self, max_count: int) -> None:
        """--ctx-checkpoints: at most this many per sequence (0: none)."""
        for c in self.checkpoints:
            c.max_count = max_count

    @property
    def n_ctx(self) -> int:
        return self.kv.n_ctx

    @property
    def n_bytes(self) -> int:
        return self.kv.n_bytes + self.recurrent.n_bytes

    whole_inputs = False  # inputs may come in chunks (SequenceMemory)

    @property
    def can_shift(self) -> bool:
        return False

    def check_batch(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        self.kv.check_batch(seq_ids, positions)
        self.recurrent.check_batch(seq_ids, positions)

    def commit(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        self.kv.commit(seq_ids, positions)
        self.recurrent.commit(seq_ids, positions)

    def truncate(self, seq_id: int, length: int) -> int:
        """Keep the whole state, or restore the latest checkpoint at or below `length`, or clear."""
        if length >= self.lengths[seq_id]:
            return int(self.lengths[seq_id])
        snapshot = self.checkpoints[seq_id].at_or_below(length)
        if snapshot is None:
            self.clear(seq_id)
            return 0
        self.recurrent.write(seq_id, snapshot)
        self.kv.truncate(seq_id, snapshot.n_tokens)
        self.checkpoints[seq_id].drop_after(snapshot.n_tokens)
        return snapshot.n_tokens

    def clear(self, seq_id: int) -> None:
        self.kv.clear(seq_id)
        self.recurrent.clear(seq_id)
        self.checkpoints[seq_id].clear()

    def read(self, seq_id: int, n: int) -> MemoryState:
        """The whole state (n must be the length), with the sequence's checkpoints."""
        part = self.recurrent.read(seq_id, n)
        k, v = self.kv.read_cells(seq_id, n)
        return MemoryState(n, k, v, part.conv, part.ssm, tuple(self.checkpoints[seq_id].states))

    def write(self, seq_id: int, state: MemoryState) -> None:
        assert state.k is not None and state.v is not None
        self.kv.write_cells(seq_id, state.k, state.v)
        self.recurrent.write(seq_id, state)
        self.checkpoints[seq_id].clear()
        for snapshot in state.checkpoints:
            self.checkpoints[seq_id].add(snapshot)

    def copy(self, src: int, dst: int, n: int) -> None:
        self.write(dst, self.read(src, n))

    def checkpoint(self, seq_id: int) -> None:
        n = int(self.lengths[seq_id])
        if n > 0:
            self.checkpoints[seq_id].add(self.recurrent.read(seq_id, n))


def checkpoint_positions(
    prompt: Sequence[int], start: int, end_of_turn: Collection[int], min_step: int = DEFAULT_MIN_STEP
) -> list[int]:
    """Where the prompt's processing (from `start`) should pause for a snapshot, ascending: after each
    end-of-turn token at least `min_step` after the previous snapshot (the last one always), and
    END_OFFSET tokens before the end."""
    ends = [i + 1 for i, t in enumerate(prompt) if t in end_of_turn and start < i + 1 < len(prompt)]
    chosen: list[int] = []
    for i, p in enumerate(ends):
        if i == len(ends) - 1 or not chosen or p - chosen[-1] >= min_step:
            chosen.append(p)
    near_end = len(prompt) - END_OFFSET
    if near_end > start:
        chosen.append(near_end)
    return sorted(set(chosen))
