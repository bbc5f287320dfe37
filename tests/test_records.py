"""engine/cpu/records.py: Q4_K as one stream of super-block records, Q6_K in row quads. Both hold the
field arrays' bytes where the module's docstring says, and the kernels give bitwise the field arrays'
products and rows on them, alone and in a whole model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine import quant
from engine.backend import cpu_backend
from engine.batch import Batch, BatchPart
from engine.cpu import matmul as mm
from engine.cpu import records
from engine.cpu.huge_pages import pack_weight_in_huge_pages
from engine.gguf import GGUFFile
from engine.models import load_model
from engine.quant import ROWS, QType
from tests.test_matmul import BYTE_DOT_ONLY, run_matmul
from tests.test_quant import random_blocks

pytestmark = pytest.mark.every_level  # kernels against numpy, on each level (tests/conftest.py)

SHAPES = [(32, 256), (100, 512), (1792, 1536), (96, 8960)]  # 100: a padded last group; 8960: 35 super-blocks


def q4k(shape: tuple[int, int]) -> quant.PackedWeight:
    return quant.pack_weight(random_blocks(QType.Q4_K, *shape), QType.Q4_K, shape)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_records_are_the_field_bytes_where_documented(shape: tuple[int, int]) -> None:
    w = q4k(shape)
    rec = records.q4k_records(w)
    assert rec.repacked and rec.nbytes == w.nbytes and rec.mn is w.mn
    assert rec.qs.shape == (w.n_groups, shape[1] // 256 * records.Q4K_RECORD)
    assert records.Q4K_PAIR % 64 == 0 and records.Q4K_RECORD % 64 == 0, "parts start on cache lines"
    rng = np.random.default_rng(0)
    for _ in range(200):
        g, sb, bb = rng.integers(w.n_groups), rng.integers(shape[1] // 256), rng.integers(8)
        j, r = rng.integers(16), rng.integers(ROWS)
        b = sb * 8 + bb
        pair = sb * records.Q4K_RECORD + (bb // 2) * records.Q4K_PAIR
        first = pair + 2 * ROWS + (bb % 2) * 16 * ROWS
        quad = first + (j // 4) * 4 * ROWS + (r // 16) * 64  # the 64 bytes of rows 16L.. at positions 4q..
        assert rec.qs[g, quad + (r % 16) * 4 + j % 4] == w.qs[g, (b * 16 + j) * ROWS + r]
        assert records.q4k_nibble_at(first, j, r) == quad + (r % 16) * 4 + j % 4
        assert rec.qs[g, pair + (bb % 2) * ROWS + r] == w.sc[g, b * ROWS + r]
        lanes = rec.qs[g].view(np.uint16)[(sb * records.Q4K_RECORD + records.Q4K_D) // 2 :]
        assert lanes[r] == w.d[g, sb * ROWS + r] and lanes[ROWS + r] == w.m[g, sb * ROWS + r]


@BYTE_DOT_ONLY
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K], ids=["Q4_K", "Q6_K"])
def test_matmul_and_rows_are_bitwise_the_field_arrays(shape: tuple[int, int], qtype: QType) -> None:
    w = quant.pack_weight(random_blocks(qtype, *shape), qtype, shape)
    rec = records.q4k_records(w) if qtype == QType.Q4_K else records.q6k_row_quads(w)
    x = np.random.default_rng(1).standard_normal((64, shape[1])).astype(np.float32)
    for n_tok in (1, 2, 3, 4, 5, 8, 13, 64):  # every tile size and their mixes
        np.testing.assert_array_equal(run_matmul(rec, x[:n_tok]), run_matmul(w, x[:n_tok]))
    ids = np.array([0, 5, shape[0] - 1, 31], np.int32)
    rows = [np.zeros((len(ids), shape[1]), np.float32) for _ in range(2)]
    mm.get_rows(w, ids, rows[0])
    mm.get_rows(rec, ids, rows[1])
    np.testing.assert_array_equal(rows[1], rows[0])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_q6_k_row_quads_are_the_field_bytes_where_documented(shape: tuple[int, int]) -> None:
    w = quant.pack_weight(random_blocks(QType.Q6_K, *shape), QType.Q6_K, shape)
    quads = records.q6k_row_quads(w)
    assert quads.repacked and quads.nbytes == w.nbytes and quads.sc is w.sc and quads.d is w.d
    assert quads.qs.flags.c_contiguous and quads.qh.flags.c_contiguous  # as the kernels are compiled for
    rng = np.random.default_rng(0)
    for _ in range(200):
        g, b, j, r = (
            rng.integers(w.n_groups),
            rng.integers(shape[1] // 32),
            rng.integers(32),
            rng.integers(ROWS),
        )
        k = j % 16
        quad = b * 16 * ROWS + (k // 4) * 4 * ROWS + (r // 16) * 64  # the 64 bytes of rows 16L.. at 4q..
        nibbles = quads.qs[g, quad + (r % 16) * 4 + k % 4]
        assert nibbles == w.qs[g, (b * 16 + k) * ROWS + r]
        assert records.q4k_nibble_at(b * 16 * ROWS, k, r) == quad + (r % 16) * 4 + k % 4
        # the field arrays: byte k // 2 of the block, bits 4 x (k % 2) + 2 x (j // 16)
        top = (w.qh[g, (b * 8 + k // 2) * ROWS + r] >> (4 * (k % 2) + 2 * (j // 16))) & 3
        at, shift = records.q6k_top_at(b, j, r)
        assert at == b * 8 * ROWS + (k // 4) * 2 * ROWS + (r % 16) * 4 + k % 4
        assert shift == 2 * (2 * (r // 16) + j // 16) and (quads.qh[g, at] >> shift) & 3 == top


def test_the_cpu_backend_repacks_q4_k_and_q6_k_where_the_byte_kernels_run() -> None:
    shape = (4096, 1024)
    be = cpu_backend()
    for qtype in (QType.Q4_K, QType.Q6_K):
        assert be.pack_weight(random_blocks(qtype, *shape), qtype, shape).repacked == mm.BYTE_DOT
    other = be.pack_weight(random_blocks(QType.Q5_K, *shape), QType.Q5_K, shape)
    assert not other.repacked


def test_a_whole_model_gives_the_same_logits_on_records(gemma3_gguf: GGUFFile) -> None:
    """Gemma 3 270M Q4_K_M (Q4_K layers beside Q6_K and Q8_0 ones): a prompt and decode steps."""
    be = cpu_backend()
    fields = dataclasses.replace(be, pack_weight=pack_weight_in_huge_pages)
    logits = []
    for backend in (be, fields):
        model = load_model(gemma3_gguf, backend)
        kv = model.new_cache(1, 64)
        steps = [model.forward(Batch.of([BatchPart(0, 0, list(range(100, 120)))]), kv)]
        steps += [model.forward(Batch.of([BatchPart(0, 20 + i, [7 + i])]), kv) for i in range(3)]
        logits.append(np.concatenate(steps))
    np.testing.assert_array_equal(logits[0], logits[1])
