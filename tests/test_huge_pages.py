"""engine/cpu/huge_pages.py: the CPU backend's packed weights move into 2 MiB-aligned mappings advised
MADV_HUGEPAGE, unchanged bit for bit, and the kernels give the same products on them."""

from __future__ import annotations

import numpy as np
import pytest

from engine import quant
from engine.backend import cpu_backend
from engine.cpu import huge_pages
from engine.quant import QType
from tests.test_matmul import run_matmul
from tests.test_quant import random_blocks

FIELDS = quant.PACKED_FIELDS


@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K, QType.Q4_0, QType.F16], ids=lambda q: q.name)
def test_moved_weight_is_bitwise_the_same_and_aligned(qtype: QType) -> None:
    shape = (2048, 2048)  # 2-8 MiB packed: over one huge page
    packed = quant.pack_weight(random_blocks(qtype, *shape), qtype, shape)
    moved = huge_pages.move_to_huge_pages(packed)
    arrays = [(getattr(packed, f), getattr(moved, f)) for f in FIELDS]
    used = [(a, b) for a, b in arrays if a.nbytes]
    assert all(a is not b for a, b in used), "every array is a copy in the mapping"
    for a, b in arrays:
        assert a.dtype == b.dtype and a.shape == b.shape and b.flags.c_contiguous
        np.testing.assert_array_equal(a, b)
    first = used[0][1]
    assert first.ctypes.data % huge_pages.HUGE_PAGE == 0, "the mapping's data starts on a 2 MiB boundary"
    assert all(b.ctypes.data % 64 == 0 for _, b in used), "each array starts on a cache line"
    x = np.random.default_rng(1).standard_normal((3, shape[1])).astype(np.float32)
    for n_tok in (1, 3):
        np.testing.assert_array_equal(run_matmul(moved, x[:n_tok]), run_matmul(packed, x[:n_tok]))


def test_small_weights_stay_where_they_are() -> None:
    shape = (64, 256)
    packed = quant.pack_weight(random_blocks(QType.Q4_K, *shape), QType.Q4_K, shape)
    moved = huge_pages.move_to_huge_pages(packed)
    assert all(getattr(moved, f) is getattr(packed, f) for f in FIELDS)


def test_moved_arrays_outlive_everything_but_the_weight() -> None:
    """The arrays keep their mapping alive on their own (nothing else holds it), so it is freed with them."""
    shape = (4096, 1024)
    moved = huge_pages.pack_weight_in_huge_pages(random_blocks(QType.Q4_0, *shape), QType.Q4_0, shape)
    qs = moved.qs
    del moved
    assert int(qs.sum(dtype=np.int64)) > 0  # still readable: the mapping lives while an array does


def test_the_cpu_backend_packs_into_huge_pages() -> None:
    shape = (4096, 1024)
    w = cpu_backend().pack_weight(random_blocks(QType.Q4_K, *shape), QType.Q4_K, shape)
    assert w.qs.ctypes.data % huge_pages.HUGE_PAGE == 0
