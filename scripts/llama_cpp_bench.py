"""llama.cpp's speed on the same machine, for side-by-side figures with llamba-bench.

Run it with a Python that has llama-cpp-python (built from PyPI, in its own venv):
    python -m venv /tmp/llcpp && /tmp/llcpp/bin/pip install llama-cpp-python
    /tmp/llcpp/bin/python scripts/llama_cpp_bench.py -m ~/.cache/llamba/models/X.gguf -p 512 -n 128 -t 2
It follows llama-bench's method: random tokens (BOS first when the model adds it), pp = one prompt of p
tokens in n_batch chunks, tg = n single-token decodes, the KV cache cleared before each repetition,
one warm-up run, t/s as mean ± stddev over -r repetitions. With -d N every test first fills the cache
with N tokens (not timed), as llama-bench's -d does.
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
    p.add_argument("-d", type=int, default=0, help="context depth before each test")
    args = p.parse_args()
    llm = llama_cpp.Llama(
        args.model,
        n_ctx=args.d + args.p + args.n + 16,
        n_batch=args.b,
        n_ubatch=args.b,
        n_threads=args.t,
        n_threads_batch=args.t,
        verbose=False,
    )
    vocab = llm.n_vocab()
    rng = random.Random(0)
    prompt = [rng.randrange(vocab) for _ in range(args.p)]
    depth = [rng.randrange(vocab) for _ in range(args.d)]
    if llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true":
        (depth or prompt or [0])[0] = llm.token_bos()

    def fill() -> None:
        llm.reset()
        llm._ctx.kv_cache_clear()
        if depth:
            llm.eval(depth)

    def pp() -> None:
        llm.eval(prompt)

    def tg() -> None:
        for _ in range(args.n):
            llm.eval([llm.token_bos()])

    suffix = f" @ d{args.d}" if args.d else ""
    for name, fn, n in (("pp", pp, args.p), ("tg", tg, args.n)):
        if n == 0:
            continue
        rates = []
        for rep in range(args.r + 1):  # the first is the warm-up
            fill()
            seconds = timed(fn)
            if rep:
                rates.append(n / seconds)
        mean, spread = statistics.mean(rates), statistics.stdev(rates)
        print(f"llama.cpp {name}{n}{suffix}: {mean:.2f} ± {spread:.2f} t/s")


if __name__ == "__main__":
    main()
