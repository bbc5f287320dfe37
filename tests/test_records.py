"""engine/cpu/records.py: Q4_K as one stream of super-block records. The records hold the field arrays'
bytes where the module's docstring says, and the kernels give bitwise the field arrays' products and
rows on them, alone and in a whole model."""

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
from tests.test_matmul import run_matmul
from tests.test_quant import random_blocks

SHAPES = [(32, 256), (100, 512), (1792, 1536), (96, 8960)]  # 100: a padded last group; 8960: 35 super-blocks


def q4k(shape: tuple[int, int]) -> quant.PackedWeight:
    return quant.pack_weight(random_blocks(QType.Q4_K, *shape), QType.Q4_K, shape)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_records_are_the_field_bytes_where_documented(shape: tuple[int, int]) -> None:
    w = q4k(shape)
    rec = records.q4k_records(w)
    assert rec.records and rec.nbytes == w.nbytes and rec.mn is w.mn
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


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matmul_and_rows_are_bitwise_the_field_arrays(shape: tuple[int, int]) -> None:
    w = q4k(shape)
    rec = records.q4k_records(w)
    x = np.random.default_rng(1).standard_normal((64, shape[1])).astype(np.float32)
    for n_tok in (1, 2, 3, 4, 5, 8, 13, 64):  # every tile size and their mixes
        np.testing.assert_array_equal(run_matmul(rec, x[:n_tok]), run_matmul(w, x[:n_tok]))
    ids = np.array([0, 5, shape[0] - 1, 31], np.int32)
    rows = [np.zeros((len(ids), shape[1]), np.float32) for _ in range(2)]
    mm.get_rows(w, ids, rows[0])
    mm.get_rows(rec, ids, rows[1])
    np.testing.assert_array_equal(rows[1], rows[0])


def test_the_cpu_backend_packs_q4_k_as_records_where_vnni_runs() -> None:
    shape = (4096, 1024)
    be = cpu_backend()
    w = be.pack_weight(random_blocks(QType.Q4_K, *shape), QType.Q4_K, shape)
    assert w.records == mm.HAS_VNNI
    other = be.pack_weight(random_blocks(QType.Q6_K, *shape), QType.Q6_K, shape)
    assert not other.records


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
