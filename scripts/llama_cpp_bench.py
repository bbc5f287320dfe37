"""llama.cpp's speed on the same machine, for side-by-side figures with llamba-bench.

Run it with a Python that has llama-cpp-python (built from PyPI, in its own venv):
    python -m venv /tmp/llcpp && /tmp/llcpp/bin/pip install llama-cpp-python
    /tmp/llcpp/bin/python scripts/llama_cpp_bench.py -m ~/.cache/llamba/models/X.gguf -p 512 -n 128 -t 2
It follows llama-bench's method: random tokens (BOS first when the model adds it), pp = one prompt of p
tokens in n_batch chunks, tg = n single-token decodes, the KV cache cleared before each repetition,
one warm-up run, t/s as mean ± stddev over -r repetitions. With -d N[,M...] every test first fills the
cache with N tokens (not timed), as llama-bench's -d does, once per depth; -ctk/-ctv set the KV cache
types as llama-bench's do.

LLAMA_ARG_REPACK=0 in the environment loads the weights without ggml's extra buffer types (its repacked
and AMX layouts), as llama-server and llama-bench's `--repack 0` do: a build for this VM's own CPU lists
AMX, whose tiles crash here. LLAMA_CPP_LIB_PATH (llama-cpp-python's own variable) runs another build's
libllama.so, e.g. a native cmake build of the same llama.cpp commit.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

import llama_cpp

# llama-cpp-python's type_k/type_v take ggml type ids (a quantized V cache needs flash attention).
CACHE_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}


def no_repack() -> None:
    """LLAMA_ARG_REPACK=0: every model loads with use_extra_bufts off (Llama() takes no such argument)."""
    if os.environ.get("LLAMA_ARG_REPACK", "1").lower() not in ("0", "false", "off"):
        return
    default = llama_cpp.llama_cpp.llama_model_default_params

    def params():  # type: ignore[no-untyped-def]
        p = default()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_cpp.llama_model_default_params = params


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def depths(value: str) -> list[int]:
    return [int(d) for d in value.split(",")]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-p", type=int, default=512)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("-t", type=int, default=2)
    p.add_argument("-r", type=int, default=5)
    p.add_argument("-b", type=int, default=512)
    p.add_argument("-d", type=depths, default=[0], help="context depths before each test (e.g. 0,4096)")
    # llama-bench and llama-server default to flash attention "auto" (on for the CPU), llama-cpp-python off.
    p.add_argument(
        "-fa", type=int, choices=[0, 1], default=1, help="flash attention (default 1, llama-bench's auto)"
    )
    p.add_argument("-ctk", choices=sorted(CACHE_TYPES), default="f16", help="KV cache key type")
    p.add_argument("-ctv", choices=sorted(CACHE_TYPES), default="f16", help="KV cache value type")
    p.add_argument("--stdin", action="store_true", help="one repetition per test named on stdin")
    args = p.parse_args()
    no_repack()
    llm = llama_cpp.Llama(
        args.model,
        n_ctx=max(args.d) + args.p + args.n + 16,
        n_batch=args.b,
        n_ubatch=args.b,
        n_threads=args.t,
        n_threads_batch=args.t,
        flash_attn=bool(args.fa),
        type_k=CACHE_TYPES[args.ctk],
        type_v=CACHE_TYPES[args.ctv],
        verbose=False,
    )
    if args.stdin:
        serve_repetitions(llm, args)
        return
    for depth in args.d:
        run_tests(llm, args, depth)


def tests(llm: llama_cpp.Llama, args: argparse.Namespace, n_depth: int) -> dict[str, Callable[[], float]]:
    """The pp and tg tests at one depth, by llama-bench's name: each runs one repetition (the cache
    cleared and the depth filled first, untimed) and returns its t/s."""
    vocab = llm.n_vocab()
    rng = random.Random(0)
    prompt = [rng.randrange(vocab) for _ in range(args.p)]
    depth = [rng.randrange(vocab) for _ in range(n_depth)]
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

    def repetition(fn: Callable[[], None], n: int) -> Callable[[], float]:
        def run() -> float:
            fill()
            return n / timed(fn)

        return run

    suffix = f" @ d{n_depth}" if n_depth else ""
    named = (("pp", pp, args.p), ("tg", tg, args.n))
    return {f"{name}{n}{suffix}": repetition(fn, n) for name, fn, n in named if n}


def run_tests(llm: llama_cpp.Llama, args: argparse.Namespace, n_depth: int) -> None:
    for name, repetition in tests(llm, args, n_depth).items():
        repetition()  # the warm-up
        rates = [repetition() for _ in range(args.r)]
        mean, spread = statistics.mean(rates), statistics.stdev(rates)
        types = f" (-ctk {args.ctk} -ctv {args.ctv})" if (args.ctk, args.ctv) != ("f16", "f16") else ""
        print(f"llama.cpp {name}{types}: {mean:.2f} ± {spread:.2f} t/s", flush=True)


def serve_repetitions(llm: llama_cpp.Llama, args: argparse.Namespace) -> None:
    """--stdin: each test warmed up once, "ready" printed, then one repetition of the test each line on
    stdin names, its t/s printed (scripts/bench_pairs.py --interleave drives this)."""
    by_name = {name: rep for depth in args.d for name, rep in tests(llm, args, depth).items()}
    for repetition in by_name.values():
        repetition()
    print("ready", flush=True)
    for line in sys.stdin:
        print(f"{by_name[line.strip()]():.4f}", flush=True)


if __name__ == "__main__":
    main()
