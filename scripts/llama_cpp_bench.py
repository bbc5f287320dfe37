"""llama.cpp's speed on the same machine, for side-by-side figures with llamba-bench.

Run it with a Python that has llama-cpp-python (built from PyPI, in its own venv):
    python -m venv /tmp/llcpp && /tmp/llcpp/bin/pip install llama-cpp-python
    /tmp/llcpp/bin/python scripts/llama_cpp_bench.py -m ~/.cache/llamba/models/X.gguf -p 512 -n 128 -t 2
It follows llama-bench's method: random tokens (BOS first when the model adds it), pp = one prompt of p
tokens in n_batch chunks, tg = n single-token decodes, the KV cache cleared before each repetition,
one warm-up run, t/s as mean ± stddev over -r repetitions.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import llama_cpp


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-p", type=int, default=512)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("-t", type=int, default=2)
    p.add_argument("-r", type=int, default=5)
    p.add_argument("-b", type=int, default=512)
    args = p.parse_args()
    llm = llama_cpp.Llama(
        args.model,
        n_ctx=args.p + args.n + 16,
        n_batch=args.b,
        n_ubatch=args.b,
        n_threads=args.t,
        n_threads_batch=args.t,
        verbose=False,
    )
    vocab = llm.n_vocab()
    rng = random.Random(0)
    prompt = [rng.randrange(vocab) for _ in range(args.p)]
    if llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true":
        prompt[0] = llm.token_bos()

    def pp() -> None:
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(prompt)

    def tg() -> None:
        llm.reset()
        llm._ctx.kv_cache_clear()
        for _ in range(args.n):
            llm.eval([llm.token_bos()])

    for name, fn, n in (("pp", pp, args.p), ("tg", tg, args.n)):
        fn()  # warm-up
        rates = [n / timed(fn) for _ in range(args.r)]
        print(f"llama.cpp {name}{n}: {statistics.mean(rates):.2f} ± {statistics.stdev(rates):.2f} t/s")


if __name__ == "__main__":
    main()
