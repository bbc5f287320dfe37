"""Llamba's embeddings against llama.cpp's (tests/golden/embeddings.json), at this process's CPU level.

    LLAMBA_CPU_LEVEL=avx2 .venv/bin/python -m scripts.embedding_cosines gemma3 smollm2

Prints per model: the level, the mean of 1 - cosine over every per-token vector (pooling none), the
worst token's cosine, and each input's cosine per pooling (docs/numerics.md, "Every level the same bits").
"""

from __future__ import annotations

import sys

import numpy as np

import engine  # noqa: F401  (Numba's settings first)
from engine.cpu import isa
from engine.embedding import pool
from engine.llm import LLM
from engine.model_files import resolve
from tests.test_embeddings import cases, cosine, golden_vectors, hidden_states, similarity


def report(model: str) -> str:
    llm = LLM.load(str(resolve(model)))
    per_input, token_errors = [], []
    for pooling, row in cases(model):
        ours, theirs = pool(hidden_states(llm, row["tokens"]), pooling), golden_vectors(row)
        if pooling == "none":
            token_errors += [1 - cosine(a, b) for a, b in zip(ours, theirs, strict=True)]
        per_input.append(f"{pooling} {similarity(ours, theirs, pooling):.5f}")
    worst = min(float(item.split()[1]) for item in per_input if item.startswith("none"))
    return (
        f"{model} {isa.current().level.name}: mean 1 - cos {np.mean(token_errors):.5f}, "
        f"worst token {worst:.5f}; " + ", ".join(per_input)
    )


if __name__ == "__main__":
    for name in sys.argv[1:] or ["gemma3", "smollm2"]:
        print(report(name))
