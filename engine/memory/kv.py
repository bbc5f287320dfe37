"""The KV cache: per layer, keys and values of every sequence (slot), indexed by position."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.memory.base import MemoryState
from engine.memory.kv_types import F16, CacheType, check_head_dim

if TYPE_CHECKING:
    from engine.backend import Backend


@dataclass(frozen=True)
class CacheTypes:
    """The cell types of keys and values (`-ctk`, `-ctv`; engine/memory/kv_types.py)."""

    k: CacheType = F16
    v: CacheType = F16


DEFAULT_CACHE_TYPES = CacheTypes()  # f16 / f16, llama.cpp's default


class KVCache:
    """Keys/values [n_layer, n_seq, n_kv_heads, n_ctx, row] in their cache types: float16 rows of head_dim
    (llama.cpp's default) or Q8_0 bytes (engine/memory/kv_types.py), keys and values each their own.

    A sequence's cell i holds position i, so a prefix is reused by keeping the first n cells and a
    sequence is truncated by lowering its length. The attention kernel reads one contiguous run of
    positions per kv head. The cells live where the backend computes; it copies them (raw, in their
    type) to and from the host (prompt cache, slot files).
    """

    def __init__(
        self,
        n_layer: int,
        n_seq: int,
        n_ctx: int,
        n_kv_heads: int,
        head_dim: int,
        backend: Backend,
        types: CacheTypes = DEFAULT_CACHE_TYPES,
    ) -> None:
        for t in (types.k, types.v):
            check_head_dim(t, head_dim)
        self.backend = backend
        self.types = types
        self.head_dim = head_dim
        self.k = backend.zeros((n_layer, n_seq, n_kv_heads, n_ctx, types.k.row_size(head_dim)), types.k.dtype)
        self.v = backend.zeros((n_layer, n_seq, n_kv_heads, n_ctx, types.v.row_size(head_dim)), types.v.dtype)
        self.lengths = np.zeros(n_seq, dtype=np.int64)

    @property
    def n_layer(self) -> int:
        return self.k.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.k.shape[2]

    @property
    def n_seq(self) -> int:
        return self.k.shape[1]

    @property
    def n_ctx(self) -> int:
        return self.k.shape[3]

    @property
    def n_bytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    whole_inputs = False  # inputs may come in chunks (SequenceMemory)

    @property
    def can_shift(self) -> bool:
        return True

    def truncate(self, seq_id: int, length: int) -> int:
        """Forget everything of `seq_id` from position `length` on; the tokens kept."""
        self.lengths[seq_id] = min(int(self.lengths[seq_id]), length)
        return int(self.lengths[seq_id])

    def checkpoint(self, seq_id: int) -> None:
        """Nothing to snapshot: any prefix of KV cells can be kept."""

    def read(self, seq_id: int, n: int) -> MemoryState:
        return MemoryState(n, *self.read_cells(seq_id, n))

    def write(self, seq_id: int, state: MemoryState) -> None:
        assert state.k is not None and state.v is not None
        self.write_cells(seq_id, state.k, state.v)

    def copy(self, src: int, dst: int, n: int) -> None:
        self.copy_cells(src, dst, n)

    def clear(self, seq_id: int) -> None:
        self.lengths[seq_id] = 0

    def read_cells(self, seq_id: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the first n cells of `seq_id`, each [n_layer, n_kv_heads, n, row] in its type."""
        return self.backend.read_cells(self.k, seq_id, n), self.backend.read_cells(self.v, seq_id, n)

    def write_cells(self, seq_id: int, k: np.ndarray, v: np.ndarray) -> None:
        """Replace `seq_id`'s cells with k/v ([n_layer, n_kv_heads, n, row], the cache's types); its length
        becomes n."""
        self.backend.write_cells(self.k, seq_id, k)
        self.backend.write_cells(self.v, seq_id, v)
        self.lengths[seq_id] = k.shape[2]

    def copy_cells(self, src: int, dst: int, n: int) -> None:
        """Give sequence `dst` the first n cells of `src` (through the host: a set-up step, not per token)."""
        self.write_cells(dst, *self.read_cells(src, n))

    def check_batch(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        """Reject a batch that writes outside the cache or leaves a gap in a sequence."""
        if len(seq_ids) == 0:
            return
        if seq_ids.min() < 0 or seq_ids.max() >= self.n_seq:
            raise ValueError("sequence id outside the KV cache")
        if positions.min() < 0 or positions.max() >= self.n_ctx:
            raise ValueError(f"position outside the context of {self.n_ctx} cells")
        for s in np.unique(seq_ids):
            first = int(positions[seq_ids == s].min())
            if first > self.lengths[s]:
                raise ValueError(f"sequence {s}: position {first} leaves a gap after {self.lengths[s]}")

    def commit(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        """Record that the batch's tokens are now cached."""
        for s in np.unique(seq_ids):
            self.lengths[s] = max(int(self.lengths[s]), int(positions[seq_ids == s].max()) + 1)
