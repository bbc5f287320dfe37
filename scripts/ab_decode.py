"""Two ways of packing the weights, one model, in one process: decode steps (or prefill chunks) of the
two copies alternated round by round, the time ratio B / A per round, its median, how many rounds B
won, and whether the two copies give bitwise the same logits.

    .venv/bin/python scripts/ab_decode.py -m qwen2.5-coder \
        --a engine.cpu.huge_pages:pack_weight_in_huge_pages --b engine.cpu.records:pack_weight_for_cpu \
        [--rounds 40] [--steps 4] [--depth 64] [--prefill 0] [-t 2]

A and B are `module:function`s with `Backend.pack_weight`'s signature, (data, qtype, shape) -> packed
weight; both copies run the CPU backend's kernels, which pick theirs by the packed form (the example
compares Q4_K's field arrays with its records). `--prefill N` times an N-token prompt per round instead
of `--steps` decode steps at `--depth`. Why one process and rounds: this VM's speed moves by 10-30% from
one minute to the next (docs/performance-log.md), so two figures taken apart compare the minutes; a ratio
taken within a round, repeated, compares the code. The order inside a round alternates, so neither side
always runs first. Two copies of the weights must fit in memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import engine  # noqa: F401  (pins the threading environment before numba loads)
from engine.backend import cpu_backend
from engine.batch import Batch, BatchPart
from engine.gguf import GGUFFile
from engine.memory.kv import KVCache
from engine.model_files import resolve
from engine.models import LlamaModel, load_model


def packer(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def first_logits(model: LlamaModel, kv: KVCache, depth: int) -> np.ndarray:
    """A prompt of `depth` tokens (the decode steps' context), then one step's logits."""
    model.forward(Batch.of([BatchPart(0, 0, list(range(100, 100 + depth)))]), kv)
    return model.forward(Batch.of([BatchPart(0, depth, [7])]), kv)


def timed_round(model: LlamaModel, kv: KVCache, args: argparse.Namespace, rng: np.random.Generator) -> float:
    """Seconds per decode step (or for the prefill) of one round."""
    start = time.perf_counter()
    if args.prefill:
        kv.truncate(0, 0)
        model.forward(Batch.of([BatchPart(0, 0, rng.integers(0, 1000, args.prefill).tolist())]), kv)
        return time.perf_counter() - start
    for _ in range(args.steps):
        kv.truncate(0, args.depth)
        model.forward(Batch.of([BatchPart(0, args.depth, [int(rng.integers(0, 1000))])]), kv)
    return (time.perf_counter() - start) / args.steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", default="smollm2")
    p.add_argument("--a", required=True, help="module:function packing the weights of copy A")
    p.add_argument("--b", required=True, help="module:function packing the weights of copy B")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--steps", type=int, default=4, help="decode steps a round")
    p.add_argument("--depth", type=int, default=64, help="the decode steps' context")
    p.add_argument("--prefill", type=int, default=0, help="time an N-token prompt a round instead")
    p.add_argument("-t", "--threads", type=int, default=2)
    args = p.parse_args()
    backend = cpu_backend(args.threads)
    copies = {
        side: load_model(
            GGUFFile(resolve(args.model)), dataclasses.replace(backend, pack_weight=packer(spec))
        )
        for side, spec in (("A", args.a), ("B", args.b))
    }
    caches = {side: m.new_cache(1, max(args.depth, args.prefill) + 2) for side, m in copies.items()}
    logits = [first_logits(m, caches[side], args.depth) for side, m in copies.items()]
    print(f"{args.model}: A {args.a}, B {args.b}; same logits: {np.array_equal(*logits)}")
    rng = np.random.default_rng(0)
    seconds: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
            seconds[side].append(timed_round(copies[side], caches[side], args, rng))
    a, b = (np.array(seconds[side]) for side in ("A", "B"))
    what = f"{args.prefill}-token prefill" if args.prefill else f"decode step at depth {args.depth}"
    print(f"{what}: A median {np.median(a) * 1e3:.2f} ms, B median {np.median(b) * 1e3:.2f} ms")
    print(f"B / A per round: median {np.median(b / a):.3f}, B faster in {(b < a).sum()} of {args.rounds}")


if __name__ == "__main__":
    main()
