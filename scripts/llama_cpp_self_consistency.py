"""llama.cpp against itself: per-token embeddings of a prompt decoded in one batch vs in chunks.

The noise floor any other engine's embeddings are measured against (docs/numerics.md, Embeddings): a
different batch split sends llama.cpp down other kernel paths (matrix-vector vs matrix-matrix), whose last
bits differ, and the int8 activation roundings amplify that. Run it with a venv that has llama-cpp-python:

    /work/llcpp-venv/bin/python -m scripts.llama_cpp_self_consistency ~/.cache/llamba/models/X.gguf

Nothing here imports Llamba.
"""

from __future__ import annotations

import argparse

import llama_cpp
import numpy as np

from scripts.make_embedding_goldens import INPUTS


def decode(llm: llama_cpp.Llama, tokens: list[int], chunk: int) -> np.ndarray:
    """Every token's final hidden state, the prompt fed `chunk` tokens per decode."""
    llm._ctx.kv_cache_clear()
    n_embd, rows = llm.n_embd(), []
    for start in range(0, len(tokens), chunk):
        part = tokens[start : start + chunk]
        llm._batch.reset()
        batch = llm._batch.batch
        for i, token in enumerate(part):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, 1
        batch.n_tokens = len(part)
        llm._ctx.decode(llm._batch)
        ptr = llama_cpp.llama_get_embeddings(llm._ctx.ctx)
        rows.append(np.array(ptr[: len(part) * n_embd], dtype=np.float32).reshape(len(part), n_embd))
    return np.concatenate(rows)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a GGUF file")
    parser.add_argument("--chunks", default="1,4", help="chunk sizes to compare with one whole batch")
    args = parser.parse_args()
    llm = llama_cpp.Llama(
        args.model,
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
        n_ctx=512,
        n_threads=2,
        verbose=False,
    )
    for text in INPUTS:
        tokens = llm.tokenize(text.encode(), add_bos=True, special=True)
        whole = decode(llm, tokens, len(tokens))
        for chunk in (int(c) for c in args.chunks.split(",")):
            part = decode(llm, tokens, chunk)
            per_token = cosines(whole, part)
            mean = cosines(whole.mean(0), part.mean(0))
            print(
                f"{len(tokens)} tokens, chunks of {chunk}: per-token min {per_token.min():.5f}, "
                f"mean-pooled {mean:.5f}, last {per_token[-1]:.5f}, first {per_token[0]:.6f}"
            )


if __name__ == "__main__":
    main()
