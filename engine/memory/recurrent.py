"""The recurrent state store: per layer and sequence, a fixed-size state that has absorbed every token.

A Gated DeltaNet layer (Qwen3.5, Qwen3-Next) keeps two parts per sequence: the causal convolution's
tail (the last d_conv - 1 inputs of its channels) and the delta rule's matrix per value head. Both are
float32, as llama.cpp keeps them. The state after n tokens cannot be turned back into the state after
fewer, so `truncate` below the length clears the sequence (a HybridMemory restores checkpoints first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.memory.base import MemoryState

if TYPE_CHECKING:
    from engine.backend import Backend


@dataclass(frozen=True)
class RecurrentShape:
    """One recurrent layer's state per sequence: the conv tail's and the delta-net matrix's shapes."""

    conv: tuple[int, ...]  # (d_conv - 1, conv channels)
    ssm: tuple[int, ...]  # (n_v_heads, head_v_dim, head_k_dim): the model's kernel decides the order


class RecurrentCache:
    """conv [n_layer, n_seq, *shape.conv] and ssm [n_layer, n_seq, *shape.ssm], float32, on the host
    (the recurrent kernels are CPU kernels), and each sequence's length."""

    def __init__(self, n_layer: int, n_seq: int, n_ctx: int, shape: RecurrentShape, backend: Backend) -> None:
        self.shape = shape
        self.conv = backend.zeros((n_layer, n_seq, *shape.conv), np.float32)
        self.ssm = backend.zeros((n_layer, n_seq, *shape.ssm), np.float32)
        self.lengths = np.zeros(n_seq, dtype=np.int64)
        self._n_ctx = n_ctx

    @property
    def n_seq(self) -> int:
        return self.conv.shape[1]

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_bytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes

    @property
    def seq_bytes(self) -> int:
        """One sequence's state: what a checkpoint costs."""
        return self.n_bytes // self.n_seq

    whole_inputs = False  # inputs may come in chunks (SequenceMemory)

    @property
    def can_shift(self) -> bool:
        return False

    def check_batch(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        """Each sequence's tokens must continue its state exactly: no gap, and no position it has
        already absorbed (the state cannot take a token twice)."""
        if len(seq_ids) == 0:
            return
        if seq_ids.min() < 0 or seq_ids.max() >= self.n_seq:
            raise ValueError("sequence id outside the recurrent state store")
        if positions.max() >= self.n_ctx:
            raise ValueError(f"position outside the context of {self.n_ctx} cells")
        for s in np.unique(seq_ids):
            mine = positions[seq_ids == s]
            if int(mine[0]) != self.lengths[s] or np.any(np.diff(mine) != 1):
                raise ValueError(
                    f"sequence {s}: positions from {mine[0]} do not continue its state at {self.lengths[s]}"
                )

    def commit(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        for s in np.unique(seq_ids):
            self.lengths[s] = int(positions[seq_ids == s].max()) + 1

    def truncate(self, seq_id: int, length: int) -> int:
        """The state stays whole when `length` covers it, else the sequence starts over (0 kept)."""
        if length >= self.lengths[seq_id]:
            return int(self.lengths[seq_id])
        self.clear(seq_id)
        return 0

    def clear(self, seq_id: int) -> None:
        self.conv[:, seq_id] = 0
        self.ssm[:, seq_id] = 0
        self.lengths[seq_id] = 0

    def read(self, seq_id: int, n: int) -> MemoryState:
        if n != self.lengths[seq_id]:
            raise ValueError(f"the recurrent state holds {self.lengths[seq_id]} tokens, not {n}")
        return MemoryState(n, conv=self.conv[:, seq_id].copy(), ssm=self.ssm[:, seq_id].copy())

    def write(self, seq_id: int, state: MemoryState) -> None:
        assert state.conv is not None and state.ssm is not None
        self.conv[:, seq_id] = state.conv
        self.ssm[:, seq_id] = state.ssm
        self.lengths[seq_id] = state.n_tokens

    def copy(self, src: int, dst: int, n: int) -> None:
        self.write(dst, self.read(src, n))

    def checkpoint(self, seq_id: int) -> None:
        """Checkpoints are the hybrid memory's (it pairs them with the KV cells' positions)."""
