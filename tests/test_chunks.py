"""engine/cpu/chunks.py: the chunks cover every row group once, shrink, and the shared counter hands
each chunk to exactly one thread; the chunked kernels' outputs do not depend on the thread count."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import njit, prange

from engine import quant
from engine.cpu.chunks import chunk_starts, take_next
from engine.cpu.matmul import dispatch
from engine.cpu.records import pack_weight_for_cpu
from engine.quant import QType
from tests.test_matmul import run_matmul
from tests.test_quant import random_blocks

pytestmark = pytest.mark.every_level  # kernels against numpy, on each level (tests/conftest.py)


@pytest.mark.parametrize(("n_groups", "n_threads"), [(1, 2), (3, 2), (48, 2), (560, 2), (560, 1), (97, 8)])
def test_chunks_cover_every_group_once_and_shrink(n_groups: int, n_threads: int) -> None:
    starts = chunk_starts(n_groups, n_threads)
    sizes = np.diff(starts)
    assert starts[0] == 0 and starts[-1] == n_groups and (sizes >= 1).all()
    assert (np.diff(sizes) <= 0).all(), "chunks never grow"
    assert sizes[0] <= max(1, n_groups // (2 * n_threads))


@njit(parallel=True, cache=False)
def _take_all(n: int, n_threads: int) -> tuple[np.ndarray, np.ndarray]:
    owner, counts = np.full(n, -1, np.int64), np.zeros(n_threads, np.int64)
    taken = np.zeros(1, np.int64)
    for t in prange(n_threads):
        c = take_next(taken)
        while c < n:
            owner[c] = t
            counts[t] += 1
            c = take_next(taken)
    return owner, counts


def test_every_chunk_is_taken_by_exactly_one_thread() -> None:
    n_threads = numba.get_num_threads()
    for _ in range(20):
        owner, counts = _take_all(100_000, n_threads)
        assert (owner >= 0).all(), "every index taken"
        assert counts.sum() == 100_000, "and none twice"


@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K], ids=lambda q: q.name)
def test_chunked_kernels_do_not_depend_on_the_thread_count(qtype: QType) -> None:
    shape = (8176, 2048)  # 256 row groups, the last one padded; 9.7-13.8 MB: chunked
    w = pack_weight_for_cpu(random_blocks(qtype, *shape), qtype, shape)  # repacked where VNNI runs
    assert dispatch._chunked(w)
    x = np.random.default_rng(2).standard_normal((5, shape[1])).astype(np.float32)
    before = numba.get_num_threads()
    try:
        outs = []
        for n in sorted({1, before}):
            numba.set_num_threads(n)
            outs.append([run_matmul(w, x[:t]) for t in (1, 2, 5)])
    finally:
        numba.set_num_threads(before)
    for a, b in zip(outs[0], outs[-1], strict=True):
        np.testing.assert_array_equal(a, b)


def test_small_weights_keep_the_static_split() -> None:
    """Under CHUNKED_MIN_BYTES the counter's atomics cost more than the split loses (matmul/dispatch.py)."""
    shape = (2048, 768)
    assert not dispatch._chunked(quant.pack_weight(random_blocks(QType.Q4_K, *shape), QType.Q4_K, shape))
