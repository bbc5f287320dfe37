"""Context shift: make room in a full slot by dropping the middle of its context, as llama-server does.

The first n_keep tokens stay; half of the rest is discarded (prompt truncation drops whole blocks of
half the free context). Cached keys carry RoPE rotations of their old positions, so the keys that move
are rotated by the shift (rotations compose: R(p - d) = R(-d) R(p)); values just move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from engine.backend import Backend

Rotate = Callable[[Any, Any], None]


def truncate_prompt(tokens: list[int], n_ctx: int, n_keep: int) -> list[int]:
    """llama-server's rule for a prompt that does not fit: keep n_keep (-1: all the prompt, as far as the
    context less 4 allows), erase whole blocks after it."""
    n_keep = max(0, min(len(tokens) if n_keep < 0 else n_keep, n_ctx - 4))
    block = max(1, (n_ctx - n_keep) // 2)
    erased = (len(tokens) - n_keep - block) // block
    return tokens[:n_keep] + tokens[n_keep + erased * block :]


def keep_count(n_keep: int, n_prompt: int, add_bos: bool, n_ctx: int) -> int:
    """The tokens a context shift keeps at the start, as llama-server counts them: the request's n_keep
    (-1: the whole prompt's `n_prompt`), one more where the model adds BOS, at most the slot's context
    `n_ctx` less 4."""
    kept = (n_prompt if n_keep < 0 else n_keep) + int(add_bos)
    return max(0, min(n_ctx - 4, kept))


def discard_count(n_past: int, n_keep: int, asked: int = 0) -> int:
    """How many tokens after the kept prefix a shift drops: `asked` (a request's n_discard, at most all
    but one of the rest), else half of the rest, as llama-server."""
    left = n_past - n_keep
    if asked > 0:
        return max(1, min(asked, left - 1))
    return max(1, left // 2)


def shift_cells(
    backend: Backend, k: Any, v: Any, start: int, end: int, delta: int, rotate: Rotate, head_dim: int
) -> None:
    """Move cells [start, end) of one sequence's k/v [n_kv_heads, n_ctx, row] by delta (< 0) positions.

    Both ranges are staged (float32, exact for float16 values and for q8_0's numbers, which quantize
    back to the same bytes) before any cell is written, so the move is right however the source and
    destination overlap, on any backend. `rotate(keys, positions)` applies RoPE in place to the staged
    keys [n, heads, head_dim]; they are rotated by delta (q8_0 keys are then quantized anew, as llama.cpp
    does when it shifts a quantized K cache).
    """
    n = end - start
    keys = backend.gather_cells(k, start, n, head_dim)
    values = backend.gather_cells(v, start, n, head_dim)
    rotate(keys, backend.upload(np.full(n, delta, dtype=np.int32)))
    backend.scatter_cells(keys, k, start + delta)
    backend.scatter_cells(values, v, start + delta)
