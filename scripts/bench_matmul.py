"""Times the CPU matmul kernels on the real models' weight matrices.

    .venv/bin/python scripts/bench_matmul.py [--model smollm2|gemma3|all] [--threads 2] [--repeat 7]
        [--prefill-tokens 512] [--spin N] [--fuse]
    .venv/bin/python scripts/bench_matmul.py --types [Q4_K Q5_K ...] [--shape 4096x2048]

(a) decode: one token (T = 1) through every weight matrix of the model (and the tied output head),
    in ms per token and effective GB/s over the bytes of the packed weights;
    then the same step for 4 and 16 tokens (batched decode of several sequences);
(b) prefill: T tokens through every layer matrix (not the head), in GFLOP/s (2 * N * K * T per matrix).
With --types, one random matrix (tests/synthetic_quant_gguf.py) per tensor type instead of a model: T=1
(matvec: ms, GB/s over the packed bytes) and T=16 (ms, its ratio to T=1), one table row per type.
With --fuse, q|k|v and gate|up of a layer are concatenated into one matrix each (where their types
match), as the model code may do: fewer, larger calls.

The machine's two cores are shared, so each figure is the best of --repeat runs, with the median
beside it and the load average at the start. --spin N sets GOMP_SPINCOUNT before Numba starts its
OpenMP threads: with OMP_WAIT_POLICY=PASSIVE alone, entering each parallel region wakes a sleeping
worker, which costs tens of microseconds on this VM per matmul call.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass
class Timing:
    best: float
    median: float


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["smollm2", "gemma3", "all"], default="all")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--spin", type=int, default=None, help="GOMP_SPINCOUNT for the OpenMP workers")
    p.add_argument("--fuse", action="store_true", help="concatenate q|k|v and gate|up as a model may")
    p.add_argument("--types", nargs="*", default=None, help="bench these tensor types (all when none named)")
    p.add_argument("--shape", default="4096x2048", help="rows x columns of the --types matrix")
    return p.parse_args()


def time_it(fn, repeat: int) -> Timing:  # type: ignore[no-untyped-def]
    fn()  # compile / warm caches
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return Timing(min(runs), statistics.median(runs))


# Matrices a model multiplies by the same input, which it may concatenate row-wise into one call.
FUSABLE = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))


def fused_tensors(tensors: list):  # type: ignore[no-untyped-def,type-arg]
    """(ggml type, raw rows, shape) per matmul, with q|k|v and gate|up concatenated where the types match."""
    import numpy as np

    by_name = {t.name: t for t in tensors}
    done: set[str] = set()
    out = []
    for t in tensors:
        if t.name in done:
            continue
        prefix, _, kind = t.name.rpartition(".weight")[0].rpartition(".")
        group = next((g for g in FUSABLE if kind in g), (kind,))
        members = [by_name.get(f"{prefix}.{k}.weight") for k in group]
        if len(members) > 1 and all(m is not None and m.ggml_type == t.ggml_type for m in members):
            rows = sum(m.shape[0] for m in members)
            out.append((t.ggml_type, np.concatenate([m.data for m in members]), (rows, t.shape[1])))
            done.update(m.name for m in members)
        else:
            out.append((t.ggml_type, t.data, t.shape))
            done.add(t.name)
    return out


def load_weights(name: str, fuse: bool):  # type: ignore[no-untyped-def]
    from engine import quant
    from engine.gguf import GGUFFile
    from engine.model_files import resolve

    f = GGUFFile(resolve(name))
    t0 = time.perf_counter()
    matrices = [t for t in f.tensors.values() if len(t.shape) == 2]
    head_t = f.tensors.get("output.weight") or f.tensors["token_embd.weight"]
    body = [t for t in matrices if t.name not in ("token_embd.weight", "output.weight")]
    specs = fused_tensors(body) if fuse else [(t.ggml_type, t.data, t.shape) for t in body]
    layers = [quant.pack_weight(data, qtype, shape) for qtype, data, shape in specs]
    head = quant.pack_weight(head_t.data, head_t.ggml_type, head_t.shape)
    what = f"{len(body)} matrices as {len(layers)} fused" if fuse else f"{len(layers)} matrices"
    print(f"{name}: packed {what} + head in {time.perf_counter() - t0:.2f} s")
    return layers, head


def bench_model(name: str, args: argparse.Namespace) -> None:
    import numpy as np

    from engine.cpu.matmul import matmul
    from engine.quant import QType

    layers, head = load_weights(name, args.fuse)
    rng = np.random.default_rng(0)
    kinds = sorted({QType(w.qtype).name for w in layers})
    print(f"  layer types {', '.join(kinds)}; head {QType(head.qtype).name} {head.n_rows}x{head.n_cols}")

    def run_all(weights, xs, outs) -> None:  # type: ignore[no-untyped-def]
        for w, x, o in zip(weights, xs, outs, strict=True):
            matmul(x, w, o)

    def inputs(weights, n_tok: int):  # type: ignore[no-untyped-def]
        xs = [rng.standard_normal((n_tok, w.n_cols)).astype(np.float32) for w in weights]
        outs = [np.empty((n_tok, w.n_rows), np.float32) for w in weights]
        return xs, outs

    every = [*layers, head]
    xs, outs = inputs(every, 1)
    n_bytes = sum(w.nbytes for w in every)
    t = time_it(lambda: run_all(every, xs, outs), args.repeat)
    hx, ho = inputs([head], 1)
    th = time_it(lambda: run_all([head], hx, ho), args.repeat)
    print(
        f"  (a) decode T=1, {len(every)} matmuls, {n_bytes / 1e6:.1f} MB: {t.best * 1e3:.2f} ms"
        f" (median {t.median * 1e3:.2f}), {n_bytes / t.best / 1e9:.1f} GB/s;"
        f" head alone {th.best * 1e3:.2f} ms, {head.nbytes / th.best / 1e9:.1f} GB/s"
    )
    batched = []
    for n_tok in (4, 16):  # several sequences decoding in one step: the weights are still read once
        bx, bo = inputs(every, n_tok)
        tb = time_it(lambda bx=bx, bo=bo: run_all(every, bx, bo), args.repeat)
        batched.append(f"T={n_tok} {tb.best * 1e3:.2f} ms ({tb.best / t.best:.2f}x T=1)")
    print(f"      batched decode: {', '.join(batched)}")
    n_tok = args.prefill_tokens
    xs, outs = inputs(layers, n_tok)
    flops = sum(2.0 * w.n_rows * w.n_cols * n_tok for w in layers)
    t = time_it(lambda: run_all(layers, xs, outs), max(2, args.repeat // 3))
    print(
        f"  (b) prefill T={n_tok}, {len(layers)} matmuls: {t.best * 1e3:.1f} ms"
        f" (median {t.median * 1e3:.1f}), {flops / t.best / 1e9:.1f} GFLOP/s"
    )
    for kind in kinds:
        sub = [w for w in layers if QType(w.qtype).name == kind]
        sx, so = inputs(sub, n_tok)
        t = time_it(lambda sub=sub, sx=sx, so=so: run_all(sub, sx, so), 2)
        f = sum(2.0 * w.n_rows * w.n_cols * n_tok for w in sub)
        print(f"      {kind}: {len(sub)} matmuls {f / t.best / 1e9:.1f} GFLOP/s")


BENCH_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
BENCH_TYPES += ["IQ4_NL", "IQ4_XS", "F16", "BF16"]


def bench_types(args: argparse.Namespace) -> None:
    """A markdown table: each type's matvec (T = 1) and 16-token tile (T = 16) on one random matrix."""
    import numpy as np

    from engine import quant
    from engine.cpu.matmul import matmul
    from tests.synthetic_quant_gguf import random_matrix

    rows, cols = (int(v) for v in args.shape.split("x"))
    rng = np.random.default_rng(0)
    print(f"{rows} x {cols} weights, best of {args.repeat} (median in brackets)\n")
    print("| type | packed MB | T=1 ms | T=1 GB/s | T=16 ms | T=16 / T=1 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.types or BENCH_TYPES:
        qtype = quant.QType[name]
        w = quant.pack_weight(random_matrix(rng, name, rows, cols, 0.02), qtype, (rows, cols))
        t = {}
        for n_tok in (1, 16):
            x = rng.standard_normal((n_tok, cols)).astype(np.float32)
            out = np.empty((n_tok, rows), np.float32)
            t[n_tok] = time_it(lambda x=x, w=w, out=out: matmul(x, w, out), args.repeat)
        print(
            f"| {name} | {w.nbytes / 1e6:.1f} | {t[1].best * 1e3:.3f} ({t[1].median * 1e3:.3f}) |"
            f" {w.nbytes / t[1].best / 1e9:.1f} | {t[16].best * 1e3:.3f} ({t[16].median * 1e3:.3f}) |"
            f" {t[16].best / t[1].best:.2f} |"
        )


def main() -> None:
    args = parse_args()
    if args.spin is not None:
        os.environ["GOMP_SPINCOUNT"] = str(args.spin)
    importlib.import_module("engine")  # pins Numba's settings before numba loads
    import numba

    numba.set_num_threads(args.threads)
    load = os.getloadavg()
    env = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    print(
        f"threads {args.threads}, layer {numba.config.THREADING_LAYER}, {env},"
        f" load average {load[0]:.2f} {load[1]:.2f}"
    )
    if args.types is not None:
        bench_types(args)
        return
    for name in ["smollm2", "gemma3"] if args.model == "all" else [args.model]:
        bench_model(name, args)


if __name__ == "__main__":
    main()
