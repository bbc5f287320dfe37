"""Context shift: make room in a full slot by dropping the middle of its context, as llama-server does.

The first n_keep tokens stay; half of the rest is discarded (prompt truncation drops whole blocks of
half the free context). Cached keys carry RoPE rotations of their old positions, so the keys that move
are rotated by the shift (rotations compose: R(p - d) = R(-d) R(p)); values just move.
"""

from __future__ import annotations

import numpy as np


def truncate_prompt(tokens: list[int], n_ctx: int, n_keep: int) -> list[int]:
    """llama-server's rule for a prompt that does not fit: keep n_keep, erase whole blocks after it."""
    n_keep = min(max(n_keep, 0), n_ctx - 4)
    block = max(1, (n_ctx - n_keep) // 2)
    erased = (len(tokens) - n_keep - block) // block
    return tokens[:n_keep] + tokens[n_keep + erased * block :]


def discard_count(n_past: int, n_keep: int) -> int:
    """How many tokens after the kept prefix a shift drops: half of the rest."""
    return max(1, (n_past - n_keep) // 2)


def shift_cells(k: np.ndarray, v: np.ndarray, start: int, end: int, delta: int, rotate) -> None:  # type: ignore[no-untyped-def]
    """Move cells [start, end) of one sequence's k/v [n_kv_heads, n_ctx, dim] by delta (< 0) positions.

    `rotate(keys[n, heads, dim], positions[n])` applies RoPE in place; it rotates the moved keys by delta.
    """
    keys = np.ascontiguousarray(k[:, start:end, :].transpose(1, 0, 2), dtype=np.float32)  # RoPE works in f32
    rotate(keys, np.full(end - start, delta, dtype=np.int32))
    k[:, start + delta : end + delta, :] = keys.transpose(1, 0, 2)
    v[:, start + delta : end + delta, :] = v[:, start:end, :].copy()
