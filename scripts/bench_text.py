"""Times the text side of a request on both models: tokenizer build and encode, and the sampler per token.

    .venv/bin/python scripts/bench_text.py [--model smollm2|gemma3|all] [--repeat 15]

Per model: building the tokenizer from the GGUF file; encoding the GPL-3 text (about 7,600 tokens) with
cold caches (a fresh tokenizer) and warm ones; encoding a 2,000-token prompt; then one sampler draw on
the model's whole vocabulary after 64 accepted tokens, for the sampler settings a server request meets
(llama-server's defaults with penalties, no top-k, no top-k nor min-p). The tests check what these do,
never how fast (tests/test_tokenizer.py, tests/test_sampling.py); these figures are what to watch.

The machine's cores are shared, so each figure is the best of --repeat runs, with the median beside it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.gguf import GGUFFile  # noqa: E402
from engine.model_files import resolve  # noqa: E402
from engine.sampling import Sampler, SamplingParams  # noqa: E402
from engine.text.tokenizer import Tokenizer  # noqa: E402

GPL3 = Path("/usr/share/common-licenses/GPL-3")
SAMPLERS = {
    "defaults+penalties": SamplingParams(
        repeat_penalty=1.1, frequency_penalty=0.1, logit_bias={1: -math.inf}
    ),
    "no top-k": SamplingParams(top_k=0),
    "no top-k, no min-p": SamplingParams(top_k=0, min_p=0.0),
}


def timed(
    fn: Callable[[Any], object], repeat: int, setup: Callable[[], Any] = lambda: None
) -> tuple[float, float]:
    """(best, median) seconds of `repeat` calls of fn(setup()), setup not counted."""
    runs = []
    for _ in range(repeat):
        arg = setup()
        start = time.perf_counter()
        fn(arg)
        runs.append(time.perf_counter() - start)
    return min(runs), statistics.median(runs)


def row(what: str, seconds: tuple[float, float], unit: str = "ms", per: float = 1.0) -> None:
    best, median = (s * 1e3 / per for s in seconds)
    print(f"  {what:<40} {best:9.2f} {unit} (median {median:.2f})")


def bench_tokenizer(gguf: GGUFFile, text: str, repeat: int) -> Tokenizer:
    def build(_: None = None) -> Tokenizer:
        return Tokenizer.from_gguf(gguf)

    row("tokenizer build", timed(build, repeat))
    tok = build()
    n = len(tok.encode(text))
    row(f"encode GPL-3, cold caches ({n} tokens)", timed(lambda fresh: fresh.encode(text), repeat, build))
    warm = timed(lambda _: tok.encode(text), repeat)
    row("encode GPL-3, warm caches", warm)
    row("encode throughput, warm caches", warm, "us/token", per=n / 1e3)
    prompt = text[: len(text) * 2000 // n]
    row(
        f"encode a {len(tok.encode(prompt))}-token prompt (warm)", timed(lambda _: tok.encode(prompt), repeat)
    )
    return tok


def bench_sampler(n_vocab: int, repeat: int) -> None:
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
    for name, params in SAMPLERS.items():
        sampler = Sampler(params, n_vocab)
        for token in rng.integers(0, n_vocab, 64):
            sampler.accept(int(token))
        sampler.sample(logits)  # first call: Numba compiles or loads its cache
        row(f"sampler per token: {name}", timed(lambda _, s=sampler: s.sample(logits), repeat))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["smollm2", "gemma3", "all"], default="all")
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args()
    text = GPL3.read_text()
    for name in ("smollm2", "gemma3") if args.model == "all" else (args.model,):
        gguf = GGUFFile(resolve(name))
        print(f"{name}:")
        tok = bench_tokenizer(gguf, text, args.repeat)
        bench_sampler(tok.n_vocab, args.repeat)


if __name__ == "__main__":
    main()
