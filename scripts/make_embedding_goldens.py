"""llama.cpp's embeddings and rerank scores, the reference tests/test_embeddings.py compares against.

Run it with the Python of a venv that has llama-cpp-python (outside the repository), after writing the
synthetic reranker with Llamba's venv:

    .venv/bin/python -m tests.synthetic_reranker /tmp/reranker.gguf
    .venv/bin/python scripts/dequantize_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2-f32.gguf
    .venv/bin/python scripts/dequantize_gguf.py gemma-3-270m-q4_k_m.gguf /tmp/gemma3-f32.gguf
    /work/llcpp-venv/bin/python scripts/make_embedding_goldens.py --reranker /tmp/reranker.gguf \\
        --float smollm2=/tmp/smollm2-f32.gguf --float gemma3=/tmp/gemma3-f32.gguf \\
        -o tests/golden/embeddings.json

For SmolLM2 and Gemma 3 and each pooling (none, mean, cls, last) it runs every input alone through
llama.cpp (`Llama(path, embedding=True, pooling_type=...)`, its low-level decode so the tokens are
exactly the ones recorded) and keeps the raw vectors (before any normalisation) as base64 float32. With
`--float`, the same inputs also run through the model's dequantized copy (float weights, so no int8
activations): the exact answer that both llama.cpp's and Llamba's quantized vectors approximate. For
the reranker it builds llama-server's rerank prompt (BOS query EOS document EOS) and keeps the score
(the first of the classifier's outputs). Nothing here imports Llamba.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
from pathlib import Path

import llama_cpp
import numpy as np

MODELS = Path.home() / ".cache" / "llamba" / "models"
FILES = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
POOLINGS = {
    "none": llama_cpp.LLAMA_POOLING_TYPE_NONE,
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
}
INPUTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors; similar texts land close together.",
    "def add(a, b):\n    return a + b\n",
]
N_PER_TOKEN = 2  # pooling none: per-token vectors of the first inputs only (they are large)
QUERY = "What do cats eat?"
DOCUMENTS = [
    "Cats are carnivores and eat mostly meat.",
    "Paris is the capital of France.",
    "A healthy cat diet includes protein from fish or chicken.",
    "The stock market fell sharply on Monday.",
    "Kittens drink their mother's milk.",
    "Quantum computers use qubits.",
]


def b64(vectors: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(vectors, dtype="<f4").tobytes()).decode()


def run(llm: llama_cpp.Llama, tokens: list[int], n_out: int, per_token: bool) -> np.ndarray:
    """Decode `tokens` as sequence 0 of a fresh context; its embeddings (rows per token or pooled)."""
    llm._ctx.kv_cache_clear()
    llm._batch.reset()
    llm._batch.add_sequence(tokens, 0, True)
    llm._ctx.decode(llm._batch)
    llm._batch.reset()
    if per_token:
        ptr = llama_cpp.llama_get_embeddings(llm._ctx.ctx)
        return np.array(ptr[: len(tokens) * n_out], dtype=np.float32).reshape(len(tokens), n_out)
    return np.array(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)[:n_out], dtype=np.float32)


def model_cases(path: Path, float_path: Path | None) -> dict:
    cases: dict = {"file": path.name, "poolings": poolings(path)}
    if float_path is not None:
        cases["float_poolings"] = poolings(float_path)
    return cases


def poolings(path: Path) -> dict:
    cases: dict = {}
    for name, pooling in POOLINGS.items():
        llm = llama_cpp.Llama(
            str(path), embedding=True, pooling_type=pooling, n_ctx=512, n_threads=2, verbose=False
        )
        inputs = INPUTS[:N_PER_TOKEN] if name == "none" else INPUTS
        rows = []
        for text in inputs:
            tokens = llm.tokenize(text.encode(), add_bos=True, special=True)
            vectors = run(llm, tokens, llm.n_embd(), per_token=name == "none")
            rows.append(
                {"text": text, "tokens": tokens, "shape": list(vectors.shape), "embedding": b64(vectors)}
            )
        cases[name] = rows
        del llm
    return cases


def rerank_cases(path: Path) -> dict:
    llm = llama_cpp.Llama(
        str(path),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
        n_ctx=512,
        n_threads=2,
        verbose=False,
    )
    n_out = llama_cpp.llama_model_n_cls_out(llm._model.model)
    query = llm.tokenize(QUERY.encode(), add_bos=False, special=False)
    rows = []
    for doc in DOCUMENTS:
        tokens = [llm.token_bos(), *query, llm.token_eos()]
        tokens += [*llm.tokenize(doc.encode(), add_bos=False, special=False), llm.token_eos()]
        scores = run(llm, tokens, n_out, per_token=False)
        rows.append({"document": doc, "tokens": tokens, "score": float(scores[0])})
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"sha256": sha, "query": QUERY, "n_cls_out": n_out, "documents": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reranker", type=Path, required=True, help="the synthetic reranker GGUF")
    parser.add_argument(
        "--float", action="append", default=[], metavar="MODEL=PATH", help="a model's dequantized GGUF"
    )
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    floats = {key: Path(path) for key, path in (item.split("=", 1) for item in args.float)}
    golden = {
        "llama_cpp_python": llama_cpp.__version__,
        "models": {key: model_cases(MODELS / name, floats.get(key)) for key, name in FILES.items()},
        "rerank": rerank_cases(args.reranker),
    }
    args.output.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
