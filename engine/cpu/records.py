"""The CPU backend's own weight layouts: Q4_K as one stream of super-block records, Q6_K in row quads.

engine.quant.PackedWeight keeps a Q4_K matrix in five arrays (qs, sc, mn, d, m), so a decode matmul
walks five streams at once in each thread. A read-only pass in the kernel's order over Qwen2.5-Coder's
layer shapes (206 MiB, 2 threads, median of 28 passes, 4 runs on 2026-12-04): the five arrays 28.6,
30.6, 29.0, 31.4 GB/s; the same bytes as one array of records 31.8, 32.7, 31.4, 34.0. The CPU backend
repacks Q4_K into records where its byte dot-product kernels run (every level but portable,
engine/cpu/isa.py; every Q4_K matmul, at every T). Whole model
(/tmp scripts: two copies of Qwen2.5-Coder 1.5B in one process, decode steps at depth 64 alternated,
medians of 30-40 rounds of 4 steps): 0.906 and 0.880 of the field arrays' step time, faster in 36 of 40
and 25 of 30 rounds; the logits bitwise the same. Q6_K in records of its own (scales, low nibbles, top
bits per block, d last) gained nothing: 0.999 of Q4_K's records alone, faster in 21 of 40 rounds; not
kept.

Record of super-block sb in row group g (Q4K_RECORD = 4480 bytes), in the order the kernel reads it:
for each pair of its 8 blocks (Q4K_PAIR = 1088 bytes) the two blocks' 32 scales each, then their 16 x 32
nibble bytes each; after the 4 pairs the 32 rows' d (f16), then their dmin (f16). Every pair starts on
a 64-byte line. A block's nibble bytes are qs's (position j of the 32 rows at j * 32) in row quads: per 4
positions 4q .. 4q + 3, rows 0-15 then 16-31, each row's 4 bytes together (`q4k_nibble_at`), as the
vpdpbusd tiles need them. The field arrays' kernel shuffles every 128 bytes into that order in
registers (vpermt2b); stored so, the T = 1 tile took 0.68x the time in L2 (1536 x 1536, one
thread, 2026-12-04). The mins stay in their own array, read once per super-block: inside the
records the same kernel took 1.5-1.9x the time of the field arrays' in L2 (256 x 1536, one thread), all
of it in _k_superblock_lanes' mins loop (LLVM left that loop as 32 scalar chains; an intrinsic since
2026-12-06, engine/cpu/matmul/q4k.py).
PackedWeight(repacked=True) holds the records in qs (uint8 (g, ns * 4480)) and the mins in mn; its sc,
d and m are empty.

Q6_K keeps its four arrays (records of its own gained nothing, above) but stores its nibble bytes in
the same row quads, and its top bits in the matching order: per block and quad q, 64 bytes (rows 0-15,
positions 4q .. 4q + 3), whose bit pairs hold the tops of weights (j, j + 16) of rows r and r + 16
(`q6k_top_at`). The field arrays' tile shuffled both (two vpermt2b for the nibbles and two for the top
bits every 128 weights) and took even and odd positions' tops apart with masks; in row quads each
weight vector is a mask, a shift and an or. The T = 1 tile in L2 (1536 x 1536, one thread,
2026-12-04): 61.4 -> 43.8 us (0.71x). Qwen2.5-Coder 1.5B (38% of its decode bytes are Q6_K) with
scripts/ab_decode.py against Q4_K's records alone, one process, alternated: decode at depth 64 0.961
of the step time (faster in 34 of 40 rounds, 24.7 ms steps), a 256-token prefill 0.978 (10 of 10);
Gemma 3 270M decode 0.996 (24 of 40); logits bitwise the same.
PackedWeight(repacked=True) of type Q6_K holds qs and qh so permuted; sc and d as engine.quant packs them.

The vpdpbusd kernels of Q4_K and Q6_K read only these layouts (the field arrays' VNNI kernels, which
shuffled in registers, were removed 2026-12-05). Field arrays, where no VNNI runs or as
engine.quant.pack_weight leaves them, take the int16 kernels: the same integers, the same outputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numba import njit

from engine.cpu import isa
from engine.cpu.huge_pages import move_to_huge_pages
from engine.quant import ROWS, PackedWeight, QType, pack_weight

Q4K_PAIR = 2 * ROWS + 2 * 16 * ROWS  # two blocks' scales, then their nibble bytes
Q4K_D = 4 * Q4K_PAIR  # the super-block's d lanes after its 4 pairs of blocks, then its dmin lanes
Q4K_RECORD = Q4K_D + 2 * 2 * ROWS


@njit(inline="always")
def q4k_block_at(at: int, bb: int) -> tuple[int, int]:
    """(scales, nibble bytes) offsets of block bb of the record starting at `at`."""
    pair = at + (bb >> 1) * Q4K_PAIR
    return pair + (bb & 1) * ROWS, pair + 2 * ROWS + (bb & 1) * 16 * ROWS


@njit(inline="always")
def q4k_nibble_at(first: int, j: int, r: int) -> int:
    """Offset of the byte of position j (0-15; j + 16 in its high nibble) and row r of the block whose
    nibble bytes start at `first`."""
    return first + (j >> 2) * 4 * ROWS + (r >> 4) * 64 + (r & 15) * 4 + (j & 3)


def _row_quads(qs: np.ndarray, g: int, ns: int) -> np.ndarray:
    """qs's nibble bytes (g, ns * 8 blocks, position, row) in row quads: (g, ns, 4 block pairs, 2 x 512)."""
    quads = qs.reshape(g, ns * 8, 4, 4, 2, 16)  # block, quad q, position k in it, lane, row in the lane
    return quads.transpose(0, 1, 2, 4, 5, 3).reshape(g, ns, 4, -1)


def q4k_records(w: PackedWeight) -> PackedWeight:
    """A Q4_K PackedWeight as records and its mins (the same bytes, 148 a row and super-block)."""
    g, ns = w.n_groups, w.n_cols // 256
    pairs = np.concatenate([w.sc.reshape(g, ns, 4, -1), _row_quads(w.qs, g, ns)], axis=3)
    lanes = [a.reshape(g, ns, -1).view(np.uint8) for a in (w.d, w.m)]
    records = np.concatenate([pairs.reshape(g, ns, -1), *lanes], axis=2).reshape(g, ns * Q4K_RECORD)
    empty_u8, empty_u16 = np.zeros((g, 0), np.uint8), np.zeros((g, 0), np.uint16)
    return dataclasses.replace(w, qs=records, sc=empty_u8, d=empty_u16, m=empty_u16, repacked=True)


@njit(inline="always")
def q6k_top_at(block: int, j: int, r: int) -> tuple[int, int]:
    """(byte offset, shift) of the top two bits of weight j (0-31) and row r of Q6_K block `block` in
    row quads: byte (block, quad j % 16 // 4, row r % 16, position j % 4), bit pair 2 x lane + j // 16
    (lane r // 16)."""
    k = j & 15
    at = block * 8 * ROWS + (k >> 2) * 2 * ROWS + (r & 15) * 4 + (k & 3)
    return at, 2 * (2 * (r >> 4) + (j >> 4))


def q6k_row_quads(w: PackedWeight) -> PackedWeight:
    """A Q6_K PackedWeight with its nibble bytes in row quads (as Q4_K's records hold theirs) and its top
    bits in the matching order: per block and quad q, 64 bytes (row r of 16, position 4q + k), each the
    top bits of weights (4q + k, 4q + k + 16) of rows r and r + 16 (`q6k_top_at`)."""
    g, nb = w.n_groups, w.n_cols // 32
    qs = _row_quads(w.qs, g, nb // 8).reshape(g, -1)
    # The field arrays' qh byte p of a block: bits 0-3 the tops of weights (2p, 2p + 16), 4-7 of the next two.
    qh = w.qh.reshape(g, nb, 8, 1, ROWS)
    tops = np.concatenate([qh & 15, qh >> 4], axis=3).reshape(g, nb, 4, 4, 2, 16)  # (quad, k, lane, row)
    qh = (tops[:, :, :, :, 0] | (tops[:, :, :, :, 1] << 4)).transpose(0, 1, 2, 4, 3)  # (quad, row, k)
    return dataclasses.replace(w, qs=qs, qh=qh.reshape(g, -1), repacked=True)  # reshaped transposes: copies


def pack_weight_for_cpu(data: np.ndarray, qtype: int, shape: tuple[int, int]) -> PackedWeight:
    """The CPU backend's pack_weight: `repack_for_cpu`, the arrays then moved into huge pages
    (engine/cpu/huge_pages.py)."""
    return move_to_huge_pages(repack_for_cpu(data, qtype, shape))


def repack_for_cpu(data: np.ndarray, qtype: int, shape: tuple[int, int]) -> PackedWeight:
    """engine.quant's pack_weight, Q4_K as records and Q6_K in row quads where the byte dot-product
    kernels run (every level but portable, engine/cpu/isa.py)."""
    byte_dot = isa.current().level.byte_dot
    w = pack_weight(data, qtype, shape)
    if byte_dot and w.qtype == QType.Q4_K:
        w = q4k_records(w)
    elif byte_dot and w.qtype == QType.Q6_K:
        w = q6k_row_quads(w)
    return w
