"""The KV cache: per layer, keys and values of every sequence (slot), indexed by position."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.backend import Backend


class KVCache:
    """Keys/values as float16 (llama.cpp's default cache type) [n_layer, n_seq, n_kv_heads, n_ctx, head_dim].

    A sequence's cell i holds position i, so a prefix is reused by keeping the first n cells and a
    sequence is truncated by lowering its length. The attention kernel reads one contiguous run of
    positions per kv head. The cells live where the backend computes; it copies them to and from the
    host (prompt cache, slot files).
    """

    def __init__(
        self, n_layer: int, n_seq: int, n_ctx: int, n_kv_heads: int, head_dim: int, backend: Backend
    ) -> None:
        shape = (n_layer, n_seq, n_kv_heads, n_ctx, head_dim)
        self.backend = backend
        self.k = backend.zeros(shape, np.float16)
        self.v = backend.zeros(shape, np.float16)
        self.lengths = np.zeros(n_seq, dtype=np.int64)

    @property
    def n_seq(self) -> int:
        return self.k.shape[1]

    @property
    def n_ctx(self) -> int:
        return self.k.shape[3]

    @property
    def n_bytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def truncate(self, seq_id: int, length: int) -> None:
        """Forget everything of `seq_id` from position `length` on."""
        self.lengths[seq_id] = min(int(self.lengths[seq_id]), length)

    def clear(self, seq_id: int) -> None:
        self.lengths[seq_id] = 0

    def read_cells(self, seq_id: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the first n cells of `seq_id`, each [n_layer, n_kv_heads, n, head_dim]."""
        return self.backend.read_cells(self.k, seq_id, n), self.backend.read_cells(self.v, seq_id, n)

    def write_cells(self, seq_id: int, k: np.ndarray, v: np.ndarray) -> None:
        """Replace `seq_id`'s cells with k/v ([n_layer, n_kv_heads, n, head_dim]); its length becomes n."""
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
