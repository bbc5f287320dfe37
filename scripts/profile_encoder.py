"""Where an encoder's forward pass spends its time, kernel by kernel, on one and on two threads.

    .venv/bin/python scripts/profile_encoder.py -m all-minilm-l6-v2 [--inputs 4] [--tokens 128] [--rounds 8]

One pass of `--inputs` random inputs of `--tokens` tokens each (as the scheduler packs an encoder's whole
inputs), every Backend kernel wrapped with a timer (CPU kernels are synchronous: wall time per call is the
kernel's), matmuls also by weight shape. One and two threads alternate pass by pass in this process
(numba.set_num_threads): this VM's speed drifts 20-30% between minutes, so runs in separate processes
cannot tell a thread's worth from the drift. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numba  # noqa: E402
import numpy as np  # noqa: E402

import engine  # noqa: E402, F401  (pins the threading environment before numba loads)
from engine.backend import cpu_backend  # noqa: E402
from engine.batch import Batch, BatchPart  # noqa: E402
from engine.gguf import GGUFFile  # noqa: E402
from engine.model_files import resolve  # noqa: E402
from engine.models import load_model  # noqa: E402

KERNELS = ("matmul", "get_rows", "layernorm", "gelu", "gelu_mul", "silu_mul", "encoder_attention", "rope")
KERNELS += ("add_inplace", "add_bias_inplace", "scale_inplace")


@dataclasses.dataclass
class Timers:
    threads: int = 1
    seconds: dict[int, dict[str, float]] = dataclasses.field(
        default_factory=lambda: {1: defaultdict(float), 2: defaultdict(float)}
    )

    def timed(self, name: str, fn: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            fn(*args, **kwargs)
            spent = time.perf_counter() - start
            self.seconds[self.threads][name] += spent
            if name == "matmul":
                self.seconds[self.threads][f"  matmul {args[1].n_rows}x{args[1].n_cols}"] += spent

        return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="all-minilm-l6-v2")
    p.add_argument("--inputs", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    timers = Timers()
    base = cpu_backend()
    backend = dataclasses.replace(
        base, **{k: timers.timed(k, getattr(base, k)) for k in KERNELS if getattr(base, k) is not None}
    )
    model = load_model(GGUFFile(str(resolve(args.model))), backend)
    rng = np.random.default_rng(0)
    parts = [
        BatchPart(i, 0, rng.integers(1000, 20000, args.tokens).tolist(), "none", want_hidden=True)
        for i in range(args.inputs)
    ]
    batch, memory = Batch.of(parts), model.new_cache(args.inputs, args.inputs * args.tokens)
    passes: dict[int, list[float]] = {1: [], 2: []}
    for rnd in range(args.rounds + 1):  # the first round warms up (kernels from the cache, buffers)
        for threads in (1, 2):
            numba.set_num_threads(threads)
            timers.threads = threads
            start = time.perf_counter()
            model.run(batch, memory)
            if rnd:
                passes[threads].append(time.perf_counter() - start)
            else:
                timers.seconds[threads].clear()
    one, two = (statistics.median(passes[n]) for n in (1, 2))
    tokens = args.inputs * args.tokens
    print(f"{args.model}: pass of {args.inputs} x {args.tokens} tokens, medians of {args.rounds}")
    rate = tokens / two
    print(
        f"  1 thread {one * 1e3:.1f} ms, 2 threads {two * 1e3:.1f} ms ({rate:.0f} tokens/s), x{one / two:.2f}"
    )
    for name, spent in sorted(timers.seconds[2].items(), key=lambda kv: -kv[1]):
        alone = timers.seconds[1][name]
        one_ms, two_ms = alone / args.rounds * 1e3, spent / args.rounds * 1e3
        print(f"  {name:24s} 1t {one_ms:8.2f} ms  2t {two_ms:8.2f} ms  x{alone / spent:.2f}")


if __name__ == "__main__":
    main()
