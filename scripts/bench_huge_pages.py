"""Decode matmuls streaming from DRAM: Qwen2.5-Coder 1.5B's layer shapes, working set well over L3.

    .venv/bin/python scripts/bench_huge_pages.py [--threads 2] [--layers 8] [--type Q4_K] [--small-pages]

Random matrices of one type in Qwen2.5-1.5B's layer shapes (q|k|v 2048x1536, attn_out 1536x1536,
gate|up 17920x1536, down 1536x8960) for --layers layers, one token through all of them in turn, so
every call reads its weights from memory, not from cache. Prints GB/s over the packed bytes (best and
median of 15 passes) and the median per matrix shape, and the machine's parallel read bandwidth over
the same bytes for the ratio. --small-pages keeps numpy's memory (4 KiB pages) instead of the CPU
backend's huge-page mappings (engine/cpu/huge_pages.py). --against-small-pages builds both and
alternates them pass by pass in this one process: this VM's bandwidth moves by a third between runs
minutes apart, so two separate runs cannot tell a 10% difference (docs/performance-log.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.cpu.huge_pages import move_to_huge_pages  # noqa: E402
from engine.cpu.matmul import matmul  # noqa: E402
from engine.quant import PackedWeight, QType, pack_weight  # noqa: E402
from tests.synthetic_quant_gguf import random_matrix  # noqa: E402

SHAPES = {"qkv": (2048, 1536), "attn_out": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}


@njit(parallel=True, nogil=True, cache=True)
def _parallel_sum(a: np.ndarray) -> int:
    total = 0
    for i in prange(a.shape[0]):
        total += a[i]
    return total


def build(type_name: str, layers: int, small_pages: bool) -> list[dict[str, PackedWeight]]:
    rng = np.random.default_rng(0)
    raws = {n: random_matrix(rng, type_name, r, c, 0.02) for n, (r, c) in SHAPES.items()}
    model = []
    for _ in range(layers):
        layer = {n: pack_weight(raws[n].copy(), int(QType[type_name]), SHAPES[n]) for n in SHAPES}
        model.append(layer if small_pages else {n: move_to_huge_pages(w) for n, w in layer.items()})
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--type", default="Q4_K")
    p.add_argument("--small-pages", action="store_true")
    p.add_argument("--against-small-pages", action="store_true", help="alternate both in one process")
    args = p.parse_args()
    numba.set_num_threads(args.threads)
    if args.against_small_pages:
        compare_pages(args.type, args.layers)
        return
    model = build(args.type, args.layers, args.small_pages)
    total = sum(w.nbytes for layer in model for w in layer.values())
    xs, outs = one_token()
    per_shape: dict[str, list[float]] = {n: [] for n in SHAPES}
    passes = []
    for i in range(16):
        start = time.perf_counter()
        for layer in model:
            for n, w in layer.items():
                t0 = time.perf_counter()
                matmul(xs[n], w, outs[n])
                if i:
                    per_shape[n].append(time.perf_counter() - t0)
        if i:  # the first pass compiles
            passes.append(time.perf_counter() - start)
    ones = np.ones(total // 8, np.int64)
    _parallel_sum(ones)
    read = min(timed(lambda: _parallel_sum(ones)) for _ in range(7))
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    pages = "4 KiB pages" if args.small_pages else "huge pages"
    size_mib = total / 2**20
    print(
        f"{args.type}, {args.layers} layers, {size_mib:.0f} MiB, {args.threads} threads, {pages}, load {load}"
    )
    best, median = min(passes), statistics.median(passes)
    print(f"  all: best {total / best / 1e9:.1f} GB/s, median {total / median / 1e9:.1f} GB/s")
    for n, ts in per_shape.items():
        size = model[0][n].nbytes
        print(f"  {n:9s} {size / 2**20:5.1f} MiB  median {size / statistics.median(ts) / 1e9:.1f} GB/s")
    print(f"  parallel read, same bytes: {total / read / 1e9:.1f} GB/s; median pass at {read / median:.0%}")


def one_token() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One token's input and output row for each shape."""
    rng = np.random.default_rng(1)
    xs = {n: rng.standard_normal((1, c)).astype(np.float32) for n, (_, c) in SHAPES.items()}
    return xs, {n: np.empty((1, r), np.float32) for n, (r, _) in SHAPES.items()}


def one_pass(
    model: list[dict[str, PackedWeight]], xs: dict[str, np.ndarray], outs: dict[str, np.ndarray]
) -> float:
    start = time.perf_counter()
    for layer in model:
        for n, w in layer.items():
            matmul(xs[n], w, outs[n])
    return time.perf_counter() - start


def compare_pages(type_name: str, layers: int, passes: int = 30) -> None:
    """Huge and 4 KiB pages alternated pass by pass: the median GB/s of each."""
    models = {"huge pages": build(type_name, layers, False), "4 KiB pages": build(type_name, layers, True)}
    total = sum(w.nbytes for layer in models["huge pages"] for w in layer.values())
    xs, outs = one_token()
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for i in range(passes + 1):
        for name, model in models.items():
            took = one_pass(model, xs, outs)
            if i:  # the first pass compiles
                seconds[name].append(took)
    print(f"{type_name}, {layers} layers, {total / 2**20:.0f} MiB each, alternated {passes} passes")
    for name, ts in seconds.items():
        median, best = total / statistics.median(ts) / 1e9, total / min(ts) / 1e9
        print(f"  {name:12s} median {median:.1f} GB/s, best {best:.1f}")


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
