"""How much of a Qwen3.5 step the Gated DeltaNet kernels take (engine/cpu/delta_net.py), at real layer sizes.

Writes a 4-layer model with Qwen3.5-4B's layer shapes (n_embd 2560, FFN 9216, attention 16 heads / 4 kv
heads of 256 with 64 rotated dimensions; Gated DeltaNet 16 key heads, 32 value heads of 128, conv 4:
8192 conv channels) in Q4_K_M (tests/synthetic_qwen35.py: random weights, the 320-token test
vocabulary), three linear-attention layers then one attention layer as in the real model's pattern, and
times a prefill of `--prompt` tokens and `--decode` single-token steps, each kernel call timed:

    .venv/bin/python scripts/bench_qwen35.py [--prompt 512] [--decode 32] [--threads 2]

Prints per phase the step time, the kernels' share (conv + gates + delta rule + the output gate) and the
whole linear-attention block's share without its two projections (the kernels plus the L2 and gated
norms and the column split).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("conv1d_silu", "decay_and_beta", "gated_delta_rule", "sigmoid_mul")


def timed(spent: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            spent[name] += time.perf_counter() - start

    return run


def instrument(model: Any, spent: dict[str, float]) -> None:
    """Time every kernel the model calls directly, the linear-attention block and its projections."""
    import engine.models.qwen35 as qwen35

    for name in KERNELS:
        setattr(qwen35, name, timed(spent, name, getattr(qwen35, name)))
    model.delta_net = timed(spent, "delta_net block", model.delta_net)
    for layer in model.layers:
        if isinstance(layer, qwen35.DeltaNetLayer):
            layer.qkv = timed(spent, "block projections", layer.qkv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from engine.backend import cpu_backend
    from engine.batch import Batch, BatchPart
    from engine.gguf import GGUFFile
    from engine.models import load_model
    from tests.synthetic_qwen35 import Qwen35Case, write_gguf

    case = Qwen35Case(
        "qwen35-4b-layers", "qwen35", "Q4_K_M", n_layer=4, full_attention_interval=4, n_embd=2560,
        n_head=16, n_kv_head=4, head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0), d_state=128,
        n_k_heads=16, n_v_heads=32, n_ff=9216,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(GGUFFile(write_gguf(case, Path(tmp) / "m.gguf")), cpu_backend(args.threads))
    tokens = np.random.default_rng(0).integers(0, 300, args.prompt + args.decode + 8).tolist()
    warm = model.new_cache(1, 64)  # compile (or load) every kernel first
    model.forward(Batch.of([BatchPart(0, 0, tokens[:8], "last")]), warm)
    spent: dict[str, float] = defaultdict(float)
    instrument(model, spent)
    memory = model.new_cache(1, args.prompt + args.decode)
    phases = {"prefill": [BatchPart(0, 0, tokens[: args.prompt], "last")]}
    for i in range(args.decode):
        phases[f"decode {i}"] = [BatchPart(0, args.prompt + i, [tokens[args.prompt + i]])]
    totals: dict[str, dict[str, float]] = {}
    for name, parts in phases.items():
        spent.clear()
        start = time.perf_counter()
        model.forward(Batch.of(parts), memory)
        spent["step"] = time.perf_counter() - start
        key = "decode" if name.startswith("decode") else name
        for k, v in spent.items():
            totals.setdefault(key, defaultdict(float))[k] += v
    for key, t in totals.items():
        kernels = sum(t[k] for k in KERNELS)
        block = t["delta_net block"] - t["block projections"]
        steps = args.decode if key == "decode" else 1
        each = ", ".join(f"{k} {100 * t[k] / t['step']:.1f}%" for k in KERNELS)
        print(
            f"{key}: {1000 * t['step'] / steps:.1f} ms a step; kernels {100 * kernels / t['step']:.1f}% "
            f"({each}); linear-attention block without its projections {100 * block / t['step']:.1f}%"
        )


if __name__ == "__main__":
    main()
