"""llama.cpp's encoder outputs, which tests/test_encoders.py compares against (tests/golden/encoders.json).

Run it with the Python of a venv that has llama-cpp-python 0.3.36 (outside the repository), after writing
the synthetic files with Llamba's venv and fetching the two real encoders (`llamba-models fetch`):

    .venv/bin/python -m tests.synthetic_encoders /tmp/encoders
    .venv/bin/python -m tests.synthetic_reranker /tmp/encoders/qwen3-reranker.gguf
    .venv/bin/python scripts/dequantize_gguf.py all-MiniLM-L6-v2-Q8_0.gguf /tmp/minilm-f32.gguf
    /tmp/llcpp-avx2/bin/python scripts/make_encoder_goldens.py --synthetic /tmp/encoders \\
        --float all-minilm-l6-v2=/tmp/minilm-f32.gguf -o tests/golden/encoders.json

What it records, every input run alone through llama.cpp (`Llama(path, embedding=True,
pooling_type=...)`, its low-level decode so the tokens are exactly the ones recorded; flash attention
off, llama-cpp-python's default, so attention is float32 throughout; 2 threads):

- the real files (all-MiniLM-L6-v2 Q8_0, nomic-embed-text-v1.5 F16): the 100 sentences of
  scripts/encoder_sentences.py tokenized by llama.cpp (with [CLS]/[SEP]) and each one's vector in the
  file's own pooling (mean), before normalisation, as float16 (cosines to 1e-7 of the float32 ones);
  with `--float`, also the same through the quantized file's dequantized copy (float weights, so no
  int8 activations): the exact answer both engines' Q8_0 vectors approximate;
- each synthetic family (tests/synthetic_encoders.py, and Qwen3 as an embedder and reranker:
  tests/synthetic_reranker.py): 8 inputs in poolings mean, cls and last, two of them per token
  (pooling none), as float32; for files with a classifier, llama-server's rerank prompts of one query
  and six documents (format_prompt_rerank: the vocabulary's BOS, EOS and SEP flags) and their scores.

Each file's sha256 is kept: the test and the golden describe the same bytes. Nothing here imports Llamba.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from pathlib import Path

import llama_cpp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from encoder_sentences import sentences  # noqa: E402  (beside this script; plain data)

MODELS = Path.home() / ".cache" / "llamba" / "models"
REAL = {
    "all-minilm-l6-v2": "all-MiniLM-L6-v2-Q8_0.gguf",
    "nomic-embed-text-v1.5": "nomic-embed-text-v1.5.f16.gguf",
}
SYNTHETIC = ("bge-reranker", "jina-bert-v2", "modern-bert", "gemma-embedding", "qwen3-reranker")
POOLINGS = {
    "none": llama_cpp.LLAMA_POOLING_TYPE_NONE,
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK,
}
# The synthetic files' inputs: short and long sentences of the set (the long ones past the sliding windows).
SYNTHETIC_INPUTS = [0, 3, 15, 21, 26, 55, 63, 97]
N_PER_TOKEN = 2
QUERY = "What do cats eat?"
DOCUMENTS = [
    "Cats are carnivores and eat mostly meat.",
    "Paris is the capital of France.",
    "A healthy cat diet includes protein from fish or chicken.",
    "The stock market fell sharply on Monday.",
    "Kittens drink their mother's milk.",
    "Quantum computers use qubits.",
]


def b64(vectors: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(vectors, dtype=dtype).tobytes()).decode()


def load(path: Path, pooling: int) -> llama_cpp.Llama:
    return llama_cpp.Llama(
        str(path), embedding=True, pooling_type=pooling, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2,
        verbose=False,
    )  # fmt: skip


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


def tokenize(llm: llama_cpp.Llama, text: str) -> list[int]:
    """llama-server's tokenize_input_subprompt: special tokens parsed, the vocabulary's BOS/EOS (or
    WordPiece's [CLS]/[SEP]) added."""
    return llm.tokenize(text.encode(), add_bos=True, special=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def real_case(path: Path) -> dict:
    """The 100 sentences through a real file in its own pooling: tokens and float16 vectors."""
    print(f"{path.name} ...", file=sys.stderr, flush=True)
    llm = load(path, llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED)
    pooling = next(name for name, value in POOLINGS.items() if value == llm.pooling_type())
    tokens = [tokenize(llm, text) for text in sentences()]
    vectors = np.stack([run(llm, t, llm.n_embd(), per_token=False) for t in tokens])
    return {
        "file": path.name,
        "sha256": sha256(path),
        "pooling": pooling,
        "tokens": tokens,
        "dtype": "float16",
        "shape": list(vectors.shape),
        "vectors": b64(vectors, "<f2"),
    }


def float_vectors(path: Path, tokens: list[list[int]]) -> str:
    """The sentences' vectors through a dequantized copy of a real file, float16 base64."""
    print(f"{path.name} ...", file=sys.stderr, flush=True)
    llm = load(path, llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED)
    return b64(np.stack([run(llm, t, llm.n_embd(), per_token=False) for t in tokens]), "<f2")


def pooling_rows(path: Path, name: str, inputs: list[str]) -> list[dict]:
    llm = load(path, POOLINGS[name])
    rows = []
    for text in inputs[:N_PER_TOKEN] if name == "none" else inputs:
        tokens = tokenize(llm, text)
        vectors = run(llm, tokens, llm.n_embd(), per_token=name == "none")
        rows.append(
            {"text": text, "tokens": tokens, "shape": list(vectors.shape), "embedding": b64(vectors, "<f4")}
        )
    return rows


def rerank_tokens(llm: llama_cpp.Llama, doc: str) -> list[int]:
    """llama-server's format_prompt_rerank without a rerank template: [BOS] query [EOS] [SEP] doc [EOS],
    each special token where the vocabulary's flags add it (EOS falling back to SEP)."""
    vocab = llm._model.vocab
    eos = llama_cpp.llama_vocab_eos(vocab)
    eos = eos if eos >= 0 else llama_cpp.llama_vocab_sep(vocab)
    add_eos = [eos] if llama_cpp.llama_vocab_get_add_eos(vocab) else []
    tokens = [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
    tokens += llm.tokenize(QUERY.encode(), add_bos=False, special=False) + add_eos
    tokens += [llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
    return tokens + llm.tokenize(doc.encode(), add_bos=False, special=False) + add_eos


def rerank_case(path: Path) -> dict | None:
    print(f"{path.name} rerank ...", file=sys.stderr, flush=True)
    llm = load(path, llama_cpp.LLAMA_POOLING_TYPE_RANK)
    n_out = llama_cpp.llama_model_n_cls_out(llm._model.model)
    rows = []
    for doc in DOCUMENTS:
        tokens = rerank_tokens(llm, doc)
        scores = run(llm, tokens, n_out, per_token=False)
        rows.append({"document": doc, "tokens": tokens, "scores": scores.tolist()})
    return {"query": QUERY, "n_cls_out": n_out, "documents": rows}


def synthetic_case(path: Path) -> dict:
    print(f"{path.name} ...", file=sys.stderr, flush=True)
    inputs = [sentences()[i] for i in SYNTHETIC_INPUTS]
    case: dict = {"file": path.name, "sha256": sha256(path)}
    case["default_pooling"] = next(
        name for name, value in POOLINGS.items() if value == load(path, -1).pooling_type()
    )
    case["poolings"] = {name: pooling_rows(path, name, inputs) for name in ("none", "mean", "cls", "last")}
    case["rerank"] = rerank_case(path)
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", type=Path, required=True, help="tests.synthetic_encoders' folder")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--reuse-real", type=Path, help="take the real files' part from this earlier output")
    parser.add_argument(
        "--float", action="append", default=[], metavar="NAME=PATH", help="a dequantized copy"
    )
    args = parser.parse_args()
    reused = json.loads(args.reuse_real.read_text())["real"] if args.reuse_real else None
    golden = {
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp": "0c1e570 (vendored by llama-cpp-python 0.3.36)",
        "settings": "embedding=True, flash_attn=False, n_ctx=n_batch=n_ubatch=512, n_threads=2",
        "system_info": llama_cpp.llama_print_system_info().decode(),
        "sentences": sentences(),
        "real": reused,
    }
    if reused is None:  # minutes: kept beside the output, for --reuse-real
        golden["real"] = {name: real_case(MODELS / file) for name, file in REAL.items()}
        args.output.with_suffix(".real.json").write_text(json.dumps(golden) + "\n")
    for name, path in (item.split("=", 1) for item in args.float):
        golden["real"][name]["float_vectors"] = float_vectors(Path(path), golden["real"][name]["tokens"])
    golden["synthetic"] = {name: synthetic_case(args.synthetic / f"{name}.gguf") for name in SYNTHETIC}
    args.output.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
