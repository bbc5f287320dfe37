"""Row groups handed to a matmul's threads in shrinking chunks from a shared counter.

A static split gives each thread a fixed half of the rows, so a region ends when the slower thread
ends: on this VM a thread is preempted some 20 times a second (its nonvoluntary context switches while
decoding), and each time the other one waits at the join. Taking chunks from a counter, as llama.cpp's
matmuls do, lets the thread that runs take the work of the one that does not; the chunks shrink
(remaining / 2n threads) so the last ones are small. Qwen2.5-Coder 1.5B decode, the Q4_K and Q6_K
kernels one way then the other on one model in one process, rounds of 4 steps (2026-12-04, 40 rounds
each): in a slow phase of the VM (38-40 ms steps) 0.959 and 0.946 of the static split's step time,
the slowest tenth of the rounds 50.0 -> 40.4 ms; in a fast one (25 ms) 1.029, then 1.005 (33 ms). The
counter's atomics cost a small matrix more than its static split loses (Gemma 3 270M 1.024x with
every Q4_K/Q6_K matmul chunked), so only weights of CHUNKED_MIN_BYTES and more take chunks (Gemma
1.006 then). Kept for the slow phases, when Llamba falls behind llama.cpp (whose matmuls share a
counter too); on a calm machine it costs up to 3% where Llamba leads by more. Each output row is
still computed by one thread in one order, so outputs do not depend on which thread took it.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def take_next(typingctx, counter):  # type: ignore[no-untyped-def]
    """counter[0] += 1, atomically; returns its value before (the index of the chunk taken)."""

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        array = context.make_array(sig.args[0])(context, builder, args[0])
        zero = ir.Constant(ir.IntType(64), 0)
        ptr = cgutils.get_item_pointer(context, builder, sig.args[0], array, [zero], wraparound=False)
        return builder.atomic_rmw("add", ptr, ir.Constant(ir.IntType(64), 1), "monotonic")

    return types.int64(counter), codegen


@njit(cache=True, nogil=True)
def chunk_starts(n_groups: int, n_threads: int) -> np.ndarray:
    """Chunk k covers row groups starts[k] .. starts[k + 1]: remaining / (2 n_threads) groups, at least 1."""
    starts = np.empty(n_groups + 1, np.int64)
    n, at = 0, 0
    while at < n_groups:
        starts[n] = at
        n += 1
        at += max(1, (n_groups - at) // (2 * n_threads))
    starts[n] = n_groups
    return starts[: n + 1]
