"""llamba-perplexity: llama-perplexity's method on a text file.

The tokenized file is cut into chunks of n_ctx tokens; each chunk is evaluated from an empty context
(its first token replaced by BOS when the model adds one) and only the second half of each chunk is
scored, so every scored token sees at least n_ctx/2 tokens of context. Several chunks run together as
separate sequences of one batch (n_batch / n_ctx of them, as llama-perplexity does).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cli import quiet_engine_logs
from engine.batch import Batch, BatchPart
from engine.llm import LLM
from engine.memory.kv import DEFAULT_CACHE_TYPES, CacheTypes, KVCache


@dataclass(frozen=True)
class PerplexityResult:
    ppl: float
    stderr: float
    n_chunks: int
    n_scored: int


def chunk_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of each target under the matching row of logits (float64 for the sums)."""
    rows = logits.astype(np.float64)
    peak = rows.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(rows - peak).sum(axis=1)) + peak[:, 0]
    return log_z - rows[np.arange(len(targets)), targets]


def perplexity(
    llm: LLM,
    tokens: list[int],
    n_ctx: int,
    n_chunks: int = -1,
    n_batch: int = 2048,
    types: CacheTypes = DEFAULT_CACHE_TYPES,
) -> Iterator[PerplexityResult]:
    """Yield the running estimate after each chunk (the last one is the final estimate); `types`: the KV
    cache's cell types."""
    available = len(tokens) // n_ctx
    total = available if n_chunks < 0 else min(n_chunks, available)
    if total == 0:
        raise ValueError(f"need at least {n_ctx} tokens, the file has {len(tokens)}")
    n_parallel = max(1, n_batch // n_ctx)
    first = n_ctx // 2
    kv = llm.new_cache(n_parallel, n_ctx, types)
    nll: list[np.ndarray] = []
    for group_start in range(0, total, n_parallel):
        chunks = [
            tokens[i * n_ctx : (i + 1) * n_ctx]
            for i in range(group_start, min(total, group_start + n_parallel))
        ]
        for chunk_nlls in _score_chunks(llm, kv, chunks, first):
            nll.append(chunk_nlls)
            yield _estimate(nll)


def _score_chunks(llm: LLM, kv: KVCache, chunks: list[list[int]], first: int) -> list[np.ndarray]:
    n_ctx = len(chunks[0])
    parts = []
    for s, chunk in enumerate(chunks):
        kv.clear(s)
        if llm.tokenizer.add_bos:
            chunk = [llm.tokenizer.bos_id, *chunk[1:]]
        parts.append(BatchPart(s, 0, chunk))
    batch = Batch.of(parts)
    # Only the scored half of each chunk needs logits: rows first .. n_ctx-2 predict tokens first+1 ..
    rows = np.concatenate([np.arange(first, n_ctx - 1) + s * n_ctx for s in range(len(chunks))])
    batch = Batch(batch.tokens, batch.positions, batch.seq_ids, rows.astype(np.int32))
    logits = llm.model.forward(batch, kv)
    per_chunk = n_ctx - 1 - first
    return [
        chunk_nll(logits[s * per_chunk : (s + 1) * per_chunk], np.asarray(chunk[first + 1 :], dtype=np.int64))
        for s, chunk in enumerate(chunks)
    ]


def _estimate(nll: list[np.ndarray]) -> PerplexityResult:
    values = np.concatenate(nll)
    mean = float(values.mean())
    # llama-perplexity's uncertainty: the standard error of the mean NLL, propagated through exp.
    stderr = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    ppl = math.exp(mean)
    return PerplexityResult(ppl, ppl * stderr, len(nll), len(values))


def main(argv: list[str] | None = None) -> int:
    with quiet_engine_logs():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="llamba-perplexity", description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=None, help="model name (smollm2, gemma3, qwen) or GGUF path")
    parser.add_argument("-f", "--file", required=True, help="text file to score")
    parser.add_argument("-c", "--ctx-size", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=-1, help="max chunks to score (-1 = all)")
    parser.add_argument(
        "-b", "--batch-size", type=int, default=2048, help="tokens per batch (chunks in parallel)"
    )
    parser.add_argument("-t", "--threads", type=int, default=None)
    args = parser.parse_args(argv)
    llm = LLM.load(args.model, n_threads=args.threads)
    text = Path(args.file).read_text(encoding="utf-8", errors="replace")
    tokens = llm.tokenizer.encode(text, add_special=True, parse_special=False)
    print(f"perplexity: tokenized {len(tokens)} tokens, n_ctx={args.ctx_size}", file=sys.stderr)
    start = time.perf_counter()
    result = None
    for result in perplexity(llm, tokens, args.ctx_size, args.chunks, args.batch_size):
        print(f"[{result.n_chunks}]{result.ppl:.4f},", end="", flush=True)
    assert result is not None
    print(f"\nFinal estimate: PPL = {result.ppl:.4f} +/- {result.stderr:.5f}")
    print(f"perplexity: {time.perf_counter() - start:.2f} s for {result.n_chunks} chunks", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
