"""Mixture-of-experts speed, decode bytes and memory against llama.cpp, on a Qwen3-30B-A3B-shaped GGUF.

    .venv/bin/python scripts/bench_moe.py --llama-python /work/llcpp-native/bin/python [--layers 16]

One command for issue #43's acceptance:

1. writes (once) the synthetic model of scripts/make_moe_bench_model.py (Qwen3-30B-A3B's widths, Q4_K
   experts, a Q4_K_M mix for the rest, `--layers` of its 48 layers) to ~/.cache/llamba/bench;
2. in a fresh Llamba process: the resident set (RssAnon: packed weights, KV, Python; RssFile: the GGUF's
   mapped pages) after load, after an 8-token prompt and after a 512-token one, with how many of the
   experts have been packed (they are packed on first use, engine/cpu/experts.py); then decode steps
   with every weight-reading kernel call counted (the bytes of the packed rows each call's kernel walks:
   a dense matmul its whole weight, the experts' one call `runs x one expert's bytes`, the router its
   float matrix, the embedding its rows), against the roofline: the GGUF's bytes of the dense tensors
   and one embedding row, plus per layer the 8 routed experts' Q4_K bytes (gate, up and down);
3. pp512 and tg128 in alternating single repetitions of Llamba and llama.cpp, both warm
   (scripts/bench_pairs.py --interleave, 2 threads), with each round's ratio and their median.

Check the machine's load (uptime, printed first) before reading the figures: the timings compare the
same seconds, but a busy machine slows the two unevenly.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MiB = 2**20


def rss() -> dict[str, int]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def packed_experts(llm: Any) -> tuple[int, int]:
    """(experts packed, experts) over every layer's expert tensors."""
    done = total = 0
    for layer in llm.model.layers:
        for matrices in (layer.moe.gate_up, layer.moe.down):
            for prepare in matrices.prepare:
                flags = prepare.__self__.packed
                done, total = done + int(flags.sum()), total + len(flags)
    return done, total


def show(label: str, llm: Any) -> None:
    fields = ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in rss().items())
    done, total = packed_experts(llm)
    print(f"RSS {label}: {fields}; experts packed {done} of {total}", flush=True)


class ByteCounter:
    """Wraps the backend's weight-reading kernels, adding up the bytes of the packed rows each call walks."""

    def __init__(self, backend: Any) -> None:
        self.bytes = 0
        self.backend = backend
        for name in ("matmul", "experts_matmul", "router_logits", "get_rows"):
            object.__setattr__(backend, name, getattr(self, name)(getattr(backend, name)))

    def matmul(self, kernel: Any) -> Any:
        def counted(x: Any, w: Any, out: Any) -> None:
            self.bytes += w.nbytes
            kernel(x, w, out)

        return counted

    def experts_matmul(self, kernel: Any) -> Any:
        def counted(x: Any, w: Any, rows: int, runs: np.ndarray, out: Any) -> bool:
            done = kernel(x, w, rows, runs, out)
            if done:  # else the per-expert matmuls that follow are counted
                self.bytes += len(runs) * w.nbytes * rows // w.n_rows
            return done

        return counted

    def router_logits(self, kernel: Any) -> Any:
        def counted(x: Any, w: np.ndarray, out: Any) -> None:
            self.bytes += w.nbytes
            kernel(x, w, out)

        return counted

    def get_rows(self, kernel: Any) -> Any:
        def counted(w: Any, ids: Any, out: Any) -> None:
            self.bytes += len(ids) * w.nbytes // w.n_rows
            kernel(w, ids, out)

        return counted


def roofline(llm: Any) -> tuple[float, float]:
    """(the GGUF bytes a decode token must read: dense tensors, one embedding row, 8 routed experts per
    layer; of which the experts)."""
    g = llm.gguf
    dense = experts = 0.0
    for name, t in g.tensors.items():
        if name == "token_embd.weight":
            dense += t.data.nbytes / t.shape[0]
        elif "_exps." in name:
            experts += t.data.nbytes * llm.model.layers[0].moe.routing.n_used / t.shape[0]
        else:
            dense += t.data.nbytes
    return dense + experts, experts


def measure(path: str, n_steps: int) -> None:
    """The fresh process's half: RSS after load and prompts, and the decode bytes per token."""
    from engine.batch import Batch, BatchPart
    from engine.llm import LLM

    before = rss()["VmRSS"]
    start = time.perf_counter()
    llm = LLM.load(path, n_threads=2)
    print(f"loaded in {time.perf_counter() - start:.1f} s; RSS before load {before / MiB:.0f} MiB")
    print(f"GGUF tensors: {llm.gguf.n_bytes / MiB:.0f} MiB")
    show("after load", llm)
    kv = llm.new_cache(1, 1024)
    rng = np.random.default_rng(0)
    llm.prefill(kv, 0, [1, *rng.integers(3, 151936, 7).tolist()])
    show("after an 8-token prompt", llm)
    kv = llm.new_cache(1, 1024)
    prompt = [1, *rng.integers(3, 151936, 511).tolist()]
    llm.prefill(kv, 0, prompt)
    show("after a 512-token prompt", llm)
    counter = ByteCounter(llm.model.backend)
    for i in range(n_steps):
        llm.model.forward(Batch.of([BatchPart(0, 512 + i, [int(rng.integers(3, 151936))])]), kv)
    per_token = counter.bytes / n_steps
    need, experts = roofline(llm)
    print(
        f"decode bytes per token: {per_token / MiB:.1f} MiB read by the kernels, "
        f"roofline {need / MiB:.1f} MiB "
        f"(routed experts {experts / MiB:.1f} MiB + dense {(need - experts) / MiB:.1f} MiB): "
        f"{per_token / need:.3f} x"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--llama-python", default=os.environ.get("LLAMA_CPP_PYTHON"), help="a Python with llama_cpp"
    )
    p.add_argument("--layers", type=int, default=16, help="layers of the synthetic model (default 16)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds of pp512 and tg128")
    p.add_argument("--measure", metavar="GGUF", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=16, help="decode steps counted for the bytes per token")
    args = p.parse_args()
    if args.measure:
        measure(args.measure, args.steps)
        return
    if not args.llama_python:
        p.error("--llama-python (or LLAMA_CPP_PYTHON) must name a Python with llama-cpp-python")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    make = [sys.executable, str(ROOT / "scripts" / "make_moe_bench_model.py"), "--layers", str(args.layers)]
    path = subprocess.run(make, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    print(f"model: {path}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    me = [sys.executable, str(Path(__file__).resolve())]
    subprocess.run([*me, "--measure", path, "--steps", str(args.steps)], check=True, env=env)
    pairs = [sys.executable, str(ROOT / "scripts" / "bench_pairs.py"), "-m", path]
    pairs += ["--llama-python", args.llama_python, "--interleave", "--pairs", str(args.rounds)]
    subprocess.run([*pairs, "--", "-p", "512", "-n", "128", "-t", "2"], check=True, env=env, cwd=ROOT)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
