"""The engine's side of issue #53's speed point, without HTTP or scheduling: 16-row decode steps of
Qwen2.5-Coder 1.5B without adapters and with the rows spread over 4 rank-16 adapters (row s under adapter
s % 4), alternated, medians of 12 each.

    .venv/bin/python scripts/bench_lora.py -m qwen2.5-coder --rounds 1   # writes the 4 SYNTHETIC adapters
    .venv/bin/python scripts/bench_lora_step.py
"""

import glob
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402, F401  (pins the threading environment before numba loads)
from engine.batch import Batch, BatchPart  # noqa: E402
from engine.llm import LLM  # noqa: E402
from engine.lora import attach_adapters, load_adapter  # noqa: E402

llm = LLM.load("qwen2.5-coder")
model = llm.model
paths = sorted(glob.glob(str(Path.home() / ".cache/llamba/bench-lora/qwen2.5-coder-*-r16-f16-*.gguf")))
assert len(paths) == 4, "run scripts/bench_lora.py once first: it writes the adapters"
attach_adapters(model, [load_adapter(p, llm.gguf) for p in paths])
kv = model.new_cache(16, 200)
rng = np.random.default_rng(0)
for s in range(16):
    model.forward(Batch.of([BatchPart(s, 0, rng.integers(0, 1000, 64).tolist())]), kv)


def step(with_lora: bool) -> None:
    parts = []
    for s in range(16):
        kv.truncate(s, 64)  # every step at the same depth
        lora = ((s % 4, 1.0),) if with_lora else ()
        parts.append(BatchPart(s, 64, [int(rng.integers(0, 1000))], lora=lora))
    model.forward(Batch.of(parts), kv)


for with_lora in (False, True):  # warm-up
    step(with_lora)
times: dict[bool, list[float]] = {False: [], True: []}
for _ in range(12):
    for with_lora in (False, True):
        start = time.perf_counter()
        step(with_lora)
        times[with_lora].append(time.perf_counter() - start)
for with_lora, label in ((False, "base"), (True, "4 adapters")):
    ms = 1e3 * np.asarray(times[with_lora])
    print(f"{label}: median {np.median(ms):.1f} ms a step (min {ms.min():.1f})")
print(f"base / 4 adapters, medians: {np.median(times[False]) / np.median(times[True]):.3f}")
