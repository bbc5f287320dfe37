"""Read-only passes over Qwen-shaped Q4_K row groups: five arrays (PackedWeight's fields) against the
same bytes as one array of records (engine/cpu/records.py), in the kernel's order, alternated pass by
pass in one process. The measurement behind the records.

    .venv/bin/python scripts/bench_streams.py [--passes 30] [--threads 2]

Per 32-block of a row group the fields pass reads 512 nibble bytes, 32 scale and 32 min bytes, and per
super-block 64 bytes each of d and dmin, from five arrays; the records pass reads every byte of one array
in order. Prints the median GB/s of each (the first two passes dropped).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit, prange, set_num_threads

# Qwen2.5-Coder 1.5B's layer matrices (rows, cols): Q|K, attn_output, gate|up, down; 8 layers, 206 MiB.
SHAPES = [(1792, 1536), (1536, 1536), (17920, 1536), (1536, 8960)] * 8


@njit(parallel=True, nogil=True, fastmath=True)
def fields_pass(qs, sc, mn, d, m, total) -> None:  # type: ignore[no-untyped-def]
    for g in prange(qs.shape[0]):
        s = np.uint32(0)
        for b in range(sc.shape[1] // 32):
            if b % 8 == 0:
                for r in range(32):
                    s += d[g, (b // 8) * 32 + r] + m[g, (b // 8) * 32 + r]
            for i in range(512):
                s += qs[g, b * 512 + i]
            for r in range(32):
                s += sc[g, b * 32 + r] + mn[g, b * 32 + r]
        total[g] = s


@njit(parallel=True, nogil=True, fastmath=True)
def records_pass(records, total) -> None:  # type: ignore[no-untyped-def]
    for g in prange(records.shape[0]):
        s = np.uint32(0)
        for i in range(records.shape[1]):
            s += records[g, i]
        total[g] = s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--passes", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    fields, records = [], []
    for rows, cols in SHAPES:
        g, nb, ns = rows // 32, cols // 32, cols // 256
        u8 = [rng.integers(0, 255, (g, n), np.uint8) for n in (nb * 512, nb * 32, nb * 32)]
        u16 = [rng.integers(0, 65535, (g, ns * 32), np.uint16) for _ in range(2)]
        fields.append((*u8, *u16, np.zeros(g, np.uint32)))
        records.append((rng.integers(0, 255, (g, nb * 576 + ns * 128), np.uint8), np.zeros(g, np.uint32)))
    nbytes = sum(a.nbytes for f in fields for a in f[:5])
    rates: dict[str, list[float]] = {"fields": [], "records": []}
    for n in range(args.passes):
        order = [("fields", fields, fields_pass), ("records", records, records_pass)]
        for name, mats, fn in order if n % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            for a in mats:
                fn(*a)
            rates[name].append(nbytes / (time.perf_counter() - start) / 1e9)
    print(f"{nbytes / 2**20:.1f} MiB, {args.threads} threads, median of {args.passes - 2} passes:")
    for name, r in rates.items():
        print(f"  {name}: {np.median(r[2:]):.1f} GB/s")


if __name__ == "__main__":
    main()
