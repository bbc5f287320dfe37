"""Where a forward step's time goes, kernel by kernel, and how close decode and prefill come to the machine.

    .venv/bin/python scripts/profile_step.py -m smollm2 [-t 2] [--steps 20]

Every Backend kernel is wrapped with a timer (kernels are synchronous on the CPU, so wall time per call is
the kernel's time); matmuls are split by the weight they read. Four workloads, as llama-bench names
them: tg (one sequence decoding at depth 64), tg @ d2048, tg x16 (16 sequences decoding together) and
pp512. Then a roofline: bytes a decode step must read (weights + the KV cells it attends to) against
the read bandwidth of this machine (a numpy sum over 256 MiB, and a 2-thread Numba sum), and prefill's
FLOP/s against numpy's float32 matmul (BLAS) on the same cores; last, tg steps and the parallel sum
alternated (`--rounds`), each round's share of the bandwidth measured beside it. Run it on an idle
machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

import engine  # noqa: F401  (pins the threading environment before numba loads)
from engine.backend import Backend, cpu_backend
from engine.batch import Batch, BatchPart
from engine.gguf import GGUFFile
from engine.model_files import resolve
from engine.models import LlamaModel, load_model

KERNELS = ("matmul", "get_rows", "rmsnorm", "rope", "store_kv", "attention", "silu_mul", "gelu_mul")
KERNELS += ("add_inplace", "add_bias_inplace", "scale_inplace")


class Profiler:
    """Accumulates seconds per label; `wrap` makes a Backend whose kernels report to it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.weight_names: dict[int, str] = {}

    def timed(self, name: str, fn: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            fn(*args, **kwargs)
            label = name
            if name == "matmul":
                label = "matmul " + self.weight_names.get(id(args[1]), "?")
            self.seconds[label] += time.perf_counter() - start

        return run

    def wrap(self, backend: Backend) -> Backend:
        return dataclasses.replace(backend, **{k: self.timed(k, getattr(backend, k)) for k in KERNELS})

    def name_weights(self, model: LlamaModel) -> None:
        self.weight_names[id(model.output)] = "output"
        for layer in model.layers:
            for attr in ("qkv", "attn_out", "gate_up", "down"):
                for group in getattr(layer, attr).groups:
                    self.weight_names[id(group.weight)] = attr


def run_workload(model: LlamaModel, prof: Profiler, name: str, steps: int) -> tuple[float, float]:
    """Seconds per step and tokens per step of one workload, the profiler's totals reset before it."""
    n_seq, depth, n_tok = {"tg": (1, 64, 1), "tg @ d2048": (1, 2048, 1), "tg x16": (16, 64, 1)}.get(
        name, (1, 0, 512)
    )
    kv = model.new_cache(n_seq, depth + n_tok * (steps + 1) + 1)
    rng = np.random.default_rng(0)
    for s in range(n_seq):
        for start in range(0, depth, 512):
            chunk = rng.integers(0, model.hp.n_vocab, min(512, depth - start)).tolist()
            model.forward(Batch.of([BatchPart(s, start, chunk)]), kv)

    def step() -> None:
        parts = []
        for s in range(n_seq):
            kv.truncate(s, depth)  # every step at the same depth
            parts.append(BatchPart(s, depth, rng.integers(0, model.hp.n_vocab, n_tok).tolist()))
        model.forward(Batch.of(parts), kv)

    step()  # warm-up (JIT cache load, page faults)
    prof.seconds.clear()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps, n_seq * n_tok


def _parallel_sum() -> Callable[[np.ndarray], float]:
    from numba import njit, prange

    @njit(parallel=True, fastmath=True)
    def parallel_sum(a: np.ndarray) -> float:
        total = 0.0
        for i in prange(a.size):
            total += a[i]
        return total

    return parallel_sum


def read_bandwidth() -> tuple[float, float]:
    """GB/s reading 256 MiB: numpy's sum (one thread) and a parallel Numba sum (all threads)."""
    parallel_sum = _parallel_sum()
    a = np.ones(64 * 2**20, np.float32)
    rates = []
    for fn in (np.sum, parallel_sum):
        fn(a)
        start = time.perf_counter()
        for _ in range(5):
            fn(a)
        rates.append(5 * a.nbytes / (time.perf_counter() - start) / 1e9)
    return rates[0], rates[1]


def blas_gflops() -> float:
    """float32 GFLOP/s of numpy's matmul (BLAS) on 2048 x 2048 matrices."""
    a = np.ones((2048, 2048), np.float32)
    a @ a
    start = time.perf_counter()
    for _ in range(3):
        a @ a
    return 3 * 2 * 2048**3 / (time.perf_counter() - start) / 1e9


def print_profile(
    name: str, seconds: float, tokens: int, kernel_seconds: dict[str, float], steps: int
) -> None:
    print(f"### {name}: {seconds * 1e3:.2f} ms per step, {tokens / seconds:.1f} t/s")
    print("| kernel | ms per step | share |\n| --- | ---: | ---: |")
    total = sum(kernel_seconds.values())
    for label, s in sorted(kernel_seconds.items(), key=lambda item: -item[1]):
        print(f"| {label} | {s / steps * 1e3:.3f} | {s / total:.1%} |")
    print(f"| (outside kernels: Python, allocation) | {(seconds - total / steps) * 1e3:.3f} | |\n")


def print_roofline(
    results: dict[str, tuple[float, int]], weight_bytes: int, kv_cell_bytes: int, n_params: int
) -> None:
    one, many = read_bandwidth()
    peak = blas_gflops()
    print("### roofline")
    print(f"read bandwidth: numpy sum {one:.1f} GB/s, parallel sum {many:.1f} GB/s")
    print(f"numpy float32 matmul (BLAS): {peak:.1f} GFLOP/s\n")
    print("| workload | bytes read per step | achieved | share of parallel-sum bandwidth |")
    print("| --- | ---: | ---: | ---: |")
    for name, depth in (("tg", 64), ("tg @ d2048", 2048)):
        seconds, _ = results[name]
        step_bytes = weight_bytes + depth * kv_cell_bytes
        rate = step_bytes / seconds / 1e9
        print(f"| {name} | {step_bytes / 2**20:.1f} MiB | {rate:.1f} GB/s | {rate / many:.0%} |")
    seconds, tokens = results["pp512"]
    flops = 2 * n_params * tokens / seconds / 1e9
    print(
        f"\npp512: {flops:.1f} GFLOP/s (2 x layer params x tokens), {flops / peak:.0%} of numpy's f32 matmul"
    )


def same_minute_shares(model: LlamaModel, step_bytes: int, rounds: int) -> None:
    """The tg step's bandwidth against the parallel sum's, measured alternately: this VM's bandwidth
    moves by 10-30% from minute to minute, so a probe taken minutes apart can flatter or wrong a step."""
    parallel_sum, a = _parallel_sum(), np.ones(64 * 2**20, np.float32)
    parallel_sum(a)
    kv = model.new_cache(1, 128)
    model.forward(Batch.of([BatchPart(0, 0, list(range(64)))]), kv)
    shares = []
    for _ in range(rounds):
        start = time.perf_counter()
        parallel_sum(a)
        parallel_sum(a)
        probe = 2 * a.nbytes / (time.perf_counter() - start) / 1e9
        start = time.perf_counter()
        for _ in range(8):
            kv.truncate(0, 64)
            model.forward(Batch.of([BatchPart(0, 64, [7])]), kv)
        shares.append(step_bytes * 8 / (time.perf_counter() - start) / 1e9 / probe)
    text = ", ".join(f"{s:.0%}" for s in shares)
    print(f"\ntg against the parallel sum beside it, {rounds} rounds: median {np.median(shares):.0%}")
    print(f"({text})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", default="smollm2")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10, help="rounds of tg step and bandwidth probe alternated")
    args = p.parse_args()
    prof = Profiler()
    g = GGUFFile(resolve(args.model))
    model = load_model(g, prof.wrap(cpu_backend(args.threads)))
    prof.name_weights(model)
    hp = model.hp
    kv_cell_bytes = 2 * hp.n_layer * hp.n_kv_head * hp.head_dim * 2  # K and V, float16
    weights_mib, cell_kib = g.n_bytes / 2**20, kv_cell_bytes / 1024
    print(f"## {model.name}: {weights_mib:.1f} MiB of weights, {cell_kib:.1f} KiB of KV a cell\n")
    results = {}
    for name in ("tg", "tg @ d2048", "tg x16", "pp512"):
        steps = 3 if name == "pp512" else args.steps
        results[name] = run_workload(model, prof, name, steps)
        print_profile(name, *results[name], prof.seconds, steps)
    # A prompt token's matmuls: every layer weight once; the embedding table is looked up, not
    # multiplied, and the head runs for the last token only.
    tied = model.output is model.token_embd
    layer_params = model.n_params - hp.n_vocab * hp.n_embd * (1 if tied else 2)
    # A decode step reads every weight once, but a separate embedding table only for its token's row.
    step_bytes = g.n_bytes - (0 if tied else g.tensors["token_embd.weight"].n_bytes)
    print_roofline(results, step_bytes, kv_cell_bytes, layer_params)
    if args.rounds:
        same_minute_shares(model, step_bytes + 64 * kv_cell_bytes, args.rounds)


if __name__ == "__main__":
    main()
