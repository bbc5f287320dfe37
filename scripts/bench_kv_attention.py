"""The attention kernel alone over an f16 and a q8_0 KV cache: one decoding token at a depth.

    .venv/bin/python scripts/bench_kv_attention.py [-m smollm2] [-d 2048] [-t 1] [--reps 200] [--layers 1]

The calls a decode step makes (the model's heads, kv heads and head dimension), over `--layers`
separate caches (the model's layer count: its cells no longer fit the CPU's caches, as in a real
step), timed alternately for each cache type, `--reps` times; the minimum and the median per sweep
are printed, and their ratios. The minimum is what a busy machine still shows (preemptions only add
time), so the ratio of minimums is the figure to read when other work shares the cores.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import engine  # noqa: F401  (pins the threading environment before numba loads)
from engine.cpu import ops
from engine.gguf import GGUFFile
from engine.memory.kv_types import F16, Q8_0, CacheType, quantize_q8_0_reference
from engine.model_files import resolve
from engine.models.hparams import HParams


def cells(x: np.ndarray, t: CacheType) -> np.ndarray:
    return quantize_q8_0_reference(x) if t is Q8_0 else x.astype(np.float16)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="smollm2")
    p.add_argument("-d", "--depth", type=int, default=2048)
    p.add_argument("-t", "--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--layers", type=int, default=1, help="separate caches swept per timing")
    args = p.parse_args()
    import numba

    numba.set_num_threads(args.threads)
    hp = HParams.from_gguf(GGUFFile(resolve(args.model)))
    rng = np.random.default_rng(0)
    shape = (1, hp.n_kv_head, args.depth + 1, hp.head_dim)
    k, v = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    q = rng.standard_normal((1, hp.n_head, hp.head_dim)).astype(np.float32)
    out = np.empty_like(q)
    seq, pos = np.zeros(1, np.int32), np.array([args.depth], np.int32)
    caches = {t.name: [(cells(k, t), cells(v, t)) for _ in range(args.layers)] for t in (F16, Q8_0)}
    times: dict[str, list[float]] = {name: [] for name in caches}
    for _ in range(args.reps + 1):  # the first round compiles / loads the kernels
        for name, layers in caches.items():
            start = time.perf_counter()
            for kc, vc in layers:
                ops.attention(q, kc, vc, seq, pos, 0, hp.attn_scale, out)
            times[name].append(time.perf_counter() - start)
    heads = f"{hp.n_head} heads, {hp.n_kv_head} kv heads, head_dim {hp.head_dim}"
    print(f"{args.model}: {heads}, depth {args.depth}, {args.threads} thread(s), {args.layers} layer(s)")
    for name, ts in times.items():
        nbytes = sum(c.nbytes for layer in caches[name] for c in layer)
        best, median = min(ts[1:]) * 1e6, statistics.median(ts[1:]) * 1e6
        print(f"  {name:5} {nbytes / 2**20:6.2f} MiB of cells: min {best:8.1f} us, median {median:8.1f} us")
    f16, q8 = times["f16"][1:], times["q8_0"][1:]
    ratio_min = min(f16) / min(q8)
    ratio_med = statistics.median(f16) / statistics.median(q8)
    print(f"  q8_0 speed / f16 speed: {ratio_min:.2f} (minimums), {ratio_med:.2f} (medians)")


if __name__ == "__main__":
    main()
