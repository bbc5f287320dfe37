"""Digests of the matmul products of the byte-kernel types at every tile size, for comparing levels.

    LLAMBA_CPU_LEVEL=avx2 .venv/bin/python -m tests.level_products

Prints one line per type with byte dot-product kernels: its name and the sha256 of the float32 outputs
of a fixed random matrix times fixed activations of 1-13 tokens (every tile size and their mixes).
tests/test_cpu_levels.py runs it on every level the machine executes and compares: the levels' integer
sums are the same, so on levels that contract the float scaling alike (FMA: avx2 and up) the products
must be the same bits.
"""

from __future__ import annotations

import hashlib

import numpy as np

from engine.cpu import matmul as mm
from engine.cpu.records import pack_weight_for_cpu
from engine.quant import QType
from tests.test_quant import random_blocks

# The types with byte dot-product kernels. Q2_K and Q3_K run the same int16 kernel on every level, and
# gave other bits from a freshly compiled kernel than from the same kernel loaded from Numba's cache
# (2026-12-05, avx2: every other type the same; not found why), which would fail a comparison of a
# level compiled now with one cached.
TYPES = [QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q8_0, QType.Q4_K, QType.Q5_K, QType.Q6_K]
TYPES += [QType.IQ4_NL, QType.IQ4_XS]


def digests(rows: int = 70, cols: int = 512) -> dict[str, str]:
    out = {}
    for qtype in TYPES:
        data = random_blocks(qtype, rows, cols)
        w = pack_weight_for_cpu(data, qtype, (rows, cols))
        x = np.random.default_rng(7).standard_normal((13, cols)).astype(np.float32)
        h = hashlib.sha256()
        for n_tok in (1, 2, 3, 4, 8, 13):
            y = np.empty((n_tok, rows), np.float32)
            mm.matmul(x[:n_tok], w, y)
            h.update(y.tobytes())
        out[qtype.name] = h.hexdigest()
    return out


if __name__ == "__main__":
    for name, digest in digests().items():
        print(name, digest)
