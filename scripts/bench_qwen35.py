"""Where a Qwen3.5 step's time goes: the Gated DeltaNet kernels (engine/cpu/delta_net.py), every backend
kernel and each matmul by the weight it reads, at real layer sizes.

Without `-m`, writes a 4-layer model with Qwen3.5-4B's layer shapes (n_embd 2560, FFN 9216, attention 16
heads / 4 kv heads of 256 with 64 rotated dimensions; Gated DeltaNet 16 key heads, 32 value heads of 128,
conv 4: 8192 conv channels) in Q4_K_M (tests/synthetic_qwen35.py: random weights, the 320-token test
vocabulary), three linear-attention layers then one attention layer as in the real model's pattern; with
`-m GGUF` it loads that file (scripts/make_qwen35_bench_model.py's 2B- and 35B-A3B-shaped ones). Times a
prefill of `--prompt` tokens and `--decode` single-token steps, each kernel call timed:

    .venv/bin/python scripts/bench_qwen35.py [-m GGUF] [--prompt 512] [--decode 32] [--threads 2] [--all]

Prints per phase the step time, the Gated DeltaNet kernels' share (conv + gates + delta rule + the
output gate), the whole linear-attention block's share without its projections (the kernels plus the L2
and gated norms and the column split) and, with `--all`, every kernel's and weight's share, the rest
being Python between the calls ("host").
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
BACKEND = ("get_rows", "rmsnorm", "rope", "store_kv", "attention", "silu_mul", "add_inplace")
BACKEND += ("experts_matmul", "router_logits", "combine_experts")


def timed(spent: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            spent[name] += time.perf_counter() - start

    return run


def weight_names(model: Any) -> dict[int, str]:
    """id of a packed weight -> a label: the projection that reads it (with its type when mixed)."""
    names = {id(model.output): "matmul output"}
    for layer in model.layers:
        kind = "delta" if type(layer).__name__.find("DeltaNet") >= 0 else "attn"
        for attr in ("qkv", "attn_out", "gate_up", "down", "shexp_gate_up", "shexp_down"):
            projection = getattr(layer, attr, None)
            for group in getattr(projection, "groups", []):
                label = f"{attr} ({kind})" if attr in ("qkv", "attn_out") else attr
                names[id(group.weight)] = f"matmul {label}"
    return names


def instrument(model: Any, spent: dict[str, float]) -> None:
    """Time every kernel the model calls directly, each backend kernel (matmuls by weight), the
    linear-attention block and its projections."""
    import engine.models.qwen35 as qwen35

    be, names = model.backend, weight_names(model)
    for name in KERNELS:
        setattr(qwen35, name, timed(spent, name, getattr(qwen35, name)))
    model.delta_net = timed(spent, "delta_net block", model.delta_net)
    for layer in model.layers:
        if isinstance(layer, qwen35.DeltaNetLayer):
            layer.qkv = timed(spent, "block projections", layer.qkv)
    for name in BACKEND:
        if getattr(be, name, None) is not None:
            object.__setattr__(be, name, timed(spent, name, getattr(be, name)))
    matmul = be.matmul

    def labelled(x: Any, w: Any, out: Any) -> None:
        start = time.perf_counter()
        matmul(x, w, out)
        spent[names.get(id(w), "matmul other")] += time.perf_counter() - start

    object.__setattr__(be, "matmul", labelled)


def load(args: argparse.Namespace) -> Any:
    from engine.backend import cpu_backend
    from engine.gguf import GGUFFile
    from engine.models import load_model
    from tests.synthetic_qwen35 import Qwen35Case, write_gguf

    if args.model:
        return load_model(GGUFFile(Path(args.model)), cpu_backend(args.threads))
    case = Qwen35Case(
        "qwen35-4b-layers", "qwen35", "Q4_K_M", n_layer=4, full_attention_interval=4, n_embd=2560,
        n_head=16, n_kv_head=4, head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0), d_state=128,
        n_k_heads=16, n_v_heads=32, n_ff=9216,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        return load_model(GGUFFile(write_gguf(case, Path(tmp) / "m.gguf")), cpu_backend(args.threads))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-m", "--model", help="a qwen35 / qwen35moe GGUF (default: the 4-layer 4B one)")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--all", action="store_true", help="every kernel's and weight's share too")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from engine.batch import Batch, BatchPart
    from engine.cpu import isa

    model = load(args)
    tokens = np.random.default_rng(0).integers(3, 300, args.prompt + args.decode + 8).tolist()
    # Compile (or load) every kernel first, and pack a MoE's experts (packed on first use): a warm-up
    # prefill of the whole prompt and one decode step, as llama-bench warms up.
    warm = model.new_cache(1, args.prompt + 1)
    model.forward(Batch.of([BatchPart(0, 0, tokens[: args.prompt], "last")]), warm)
    model.forward(Batch.of([BatchPart(0, args.prompt, tokens[args.prompt : args.prompt + 1])]), warm)
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
    print(f"level {isa.current().level.name}, {args.threads} threads")
    for key, t in totals.items():
        kernels = sum(t[k] for k in KERNELS)
        block = t["delta_net block"] - t["block projections"]
        steps = args.decode if key == "decode" else 1
        each = ", ".join(f"{k} {100 * t[k] / t['step']:.1f}%" for k in KERNELS)
        print(
            f"{key}: {1000 * t['step'] / steps:.1f} ms a step; kernels {100 * kernels / t['step']:.1f}% "
            f"({each}); linear-attention block without its projections {100 * block / t['step']:.1f}%"
        )
        if args.all:
            leaves = {k: v for k, v in t.items() if k.startswith("matmul") or k in BACKEND + KERNELS}
            host = t["step"] - sum(leaves.values())
            for k, v in sorted([*leaves.items(), ("host", host)], key=lambda kv: -kv[1]):
                print(f"  {k}: {1000 * v / steps:.2f} ms ({100 * v / t['step']:.1f}%)")


if __name__ == "__main__":
    main()
