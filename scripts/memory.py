"""Resident memory of a loaded model, after load and at full context, against the weights' size.

    .venv/bin/python scripts/memory.py -m qwen2.5-coder [-c 32768] [--mlock]

Prints VmRSS and its parts (anonymous: packed weights, KV cache, Python; file: mapped pages of the GGUF
that are resident) right after `LLM.load`, then after allocating a KV cache of the full context (the
model's training context unless -c says otherwise), running a 512-token prompt chunk and one decode step
that attends to every cell (the JIT's code and the step's buffers come on top). The target (issue
"Real-size models"): RSS after load, KV cache allocated, <= 1.15 x the GGUF's tensor bytes + KV + 200 MB,
i.e. the weights are held once.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import engine  # noqa: F401  (pins the threading environment before numba loads)
from engine.batch import Batch, BatchPart
from engine.llm import LLM

MiB = 2**20


def rss() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile and VmLck of this process, in bytes."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmLck", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def show(label: str, fields: dict[str, int]) -> None:
    parts = ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in fields.items())
    print(f"{label}: {parts}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", default="smollm2")
    p.add_argument("-c", "--ctx-size", type=int, default=0, help="context of the KV cache (0: the model's)")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--mlock", action="store_true", help="lock the packed weights in RAM (-lm mlock)")
    args = p.parse_args()
    base = rss()["VmRSS"]
    start = time.perf_counter()
    llm = LLM.load(args.model, n_threads=args.threads, mlock=args.mlock)
    seconds = time.perf_counter() - start
    weights = llm.gguf.n_bytes
    print(f"## {llm.model.name}: {weights / MiB:.0f} MiB of tensors, loaded in {seconds:.1f} s")
    print(f"before load (Python, numpy, numba imported): {base / MiB:.0f} MiB")
    after_load = rss()
    show("after load", after_load)
    hp = llm.model.hp
    n_ctx = args.ctx_size or hp.n_ctx_train
    kv = llm.new_cache(1, n_ctx)
    with_kv = rss()
    show(f"with the KV cache ({n_ctx} cells, {kv.n_bytes / MiB:.0f} MiB; a server has it from load)", with_kv)
    rng = np.random.default_rng(0)
    llm.prefill(kv, 0, rng.integers(0, hp.n_vocab, 512).tolist())
    kv.lengths[0] = n_ctx - 1  # every cell counts as written: the decode below attends to all of them
    llm.model.forward(Batch.of([BatchPart(0, n_ctx - 1, [1])]), kv)
    show("after a 512-token prompt and a decode step over every cell", rss())
    target = 1.15 * weights + kv.n_bytes + 200 * MiB
    verdict = "within" if with_kv["VmRSS"] <= target else "OVER"
    print(f"target 1.15 x tensors + KV + 200 MiB = {target / MiB:.0f} MiB: {verdict}")


if __name__ == "__main__":
    main()
