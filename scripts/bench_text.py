"""Times the text side of a request on both models: tokenizer build and encode, and the sampler per token.

    .venv/bin/python scripts/bench_text.py [--model smollm2|gemma3|all] [--repeat 15]
        [--part all|tokenizer|sampler] [--baseline GIT_REV]

Per model: building the tokenizer from the GGUF file; encoding the GPL-3 text (about 7,600 tokens) with
cold caches (a fresh tokenizer) and warm ones; encoding a 2,000-token prompt; then one sampler draw on
the model's whole vocabulary after 64 accepted tokens, for the sampler settings a server request meets
(llama-server's defaults with penalties, no top-k, no top-k nor min-p), then for each stage beyond the
default chain (DRY, XTC, typical-p, top-n-sigma, dynamic temperature, mirostat, the general path), with
top-k on and off. The tests check what these do, never how fast (tests/test_tokenizer.py,
tests/test_sampling*.py); these figures are what to watch.

--baseline REV times the sampler of that git revision (engine/sampling.py or engine/sampling/, loaded
under another name) against the working tree's in the same run, alternating, for the settings both know;
the ratio column is new / baseline.

The machine's cores are shared, so each figure is the best of --repeat runs, with the median beside it.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine.sampling as current  # noqa: E402
from engine.gguf import GGUFFile  # noqa: E402
from engine.model_files import resolve  # noqa: E402
from engine.sampling import DryVocabulary, SamplingParams  # noqa: E402
from engine.text.tokenizer import Tokenizer  # noqa: E402

GPL3 = Path("/usr/share/common-licenses/GPL-3")
REPO = Path(__file__).resolve().parents[1]
# The default chain's settings: what the fast path must keep fast (and what a baseline also knows).
DEFAULT_CHAIN = {
    "defaults+penalties": {"repeat_penalty": 1.1, "frequency_penalty": 0.1, "logit_bias": {1: -math.inf}},
    "defaults": {},
    "no top-k": {"top_k": 0},
    "no top-k, no min-p": {"top_k": 0, "min_p": 0.0},
}
# The stages beyond it, with llama-server's default top-k 40 and with top-k off.
NEW_STAGES = {
    "general path (min_keep 1)": {"min_keep": 1},
    "dry": {"dry_multiplier": 0.8},
    "dry, whole 4096-token history": {"dry_multiplier": 0.8, "dry_penalty_last_n": -1, "history": 4096},
    "xtc (always fires)": {"xtc_probability": 1.0},
    "typical 0.9": {"typical_p": 0.9},
    "top-n-sigma 1": {"top_n_sigma": 1.0},
    "dynatemp 0.5": {"dynatemp_range": 0.5},
    "no top-k: general path": {"top_k": 0, "min_keep": 1},
    "no top-k: xtc": {"top_k": 0, "xtc_probability": 1.0},
    "no top-k: typical 0.9": {"top_k": 0, "typical_p": 0.9},
    "no top-k: top-n-sigma 1": {"top_k": 0, "top_n_sigma": 1.0},
    "no top-k: dynatemp 0.5": {"top_k": 0, "dynatemp_range": 0.5},
    "no top-k, no min-p: dynatemp": {"top_k": 0, "min_p": 0.0, "dynatemp_range": 0.5},
    "mirostat 1": {"mirostat": 1},
    "mirostat 2": {"mirostat": 2},
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


def baseline_sampling(rev: str) -> Any:
    """The sampling module of git revision `rev`, importable beside the current one: its files are
    extracted to a temporary directory with `engine.sampling` renamed."""
    root = Path(tempfile.mkdtemp(prefix="llamba-baseline-"))
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "engine/sampling.py", "engine/sampling"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if not listing:
        raise SystemExit(f"{rev} has no engine/sampling.py nor engine/sampling/")
    for name in listing:
        text = subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=REPO, capture_output=True, text=True, check=True
        )
        target = root / name.replace("engine/sampling", "llamba_baseline_sampling", 1)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.stdout.replace("engine.sampling", "llamba_baseline_sampling"))
    sys.path.insert(0, str(root))
    return importlib.import_module("llamba_baseline_sampling")


def prepared(module: Any, fields: dict, n_vocab: int, dry: DryVocabulary | None, history: np.ndarray) -> Any:
    params = module.SamplingParams(**fields)
    if dry is not None and "dry" in params.chain():
        sampler = module.Sampler(params, n_vocab, dry.breakers(params.dry_sequence_breakers))
    else:
        sampler = module.Sampler(params, n_vocab)
    for token in history:
        sampler.accept(int(token))
    return sampler


def bench_sampler(tok: Tokenizer, repeat: int, baseline: Any | None) -> None:
    n_vocab = tok.n_vocab
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
    history = rng.integers(0, n_vocab, 64)
    dry = DryVocabulary(tok)
    start = time.perf_counter()
    dry.breakers(SamplingParams().dry_sequence_breakers)
    row("DRY breaker tables (first request)", (time.perf_counter() - start,) * 2)
    for name, fields in DEFAULT_CHAIN.items():
        samplers = [prepared(current, fields, n_vocab, dry, history)]
        if baseline is not None:
            samplers.append(prepared(baseline, fields, n_vocab, None, history))
        for s in samplers:
            s.sample(logits)  # first call: Numba compiles or loads its cache
        runs = alternating([lambda s=s: s.sample(logits) for s in samplers], repeat)
        row(f"sampler per token: {name}", runs[0])
        if baseline is not None:
            row(f"  baseline {name}", runs[1])
            print(f"  {'  ratio new / baseline (median)':<40} {runs[0][1] / runs[1][1]:9.2f}")
    for name, fields in NEW_STAGES.items():
        fields = dict(fields)
        # a repetitive history (64-token period) so that DRY finds repeats to penalise
        longer = np.tile(history, fields.pop("history", 64) // 64)
        sampler = prepared(current, fields, n_vocab, dry, longer)
        sampler.sample(logits)
        row(f"sampler per token: {name}", alternating([lambda s=sampler: s.sample(logits)], repeat)[0])


def alternating(fns: list[Callable[[], object]], repeat: int) -> list[tuple[float, float]]:
    """(best, median) seconds of each function, called in turn `repeat` times (so load drifts hit all)."""
    runs: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, times in zip(fns, runs, strict=True):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return [(min(t), statistics.median(t)) for t in runs]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["smollm2", "gemma3", "all"], default="all")
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--part", choices=["all", "tokenizer", "sampler"], default="all")
    p.add_argument("--baseline", metavar="GIT_REV", help="also time this revision's sampler, alternating")
    args = p.parse_args()
    baseline = baseline_sampling(args.baseline) if args.baseline else None
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for name in ("smollm2", "gemma3") if args.model == "all" else (args.model,):
        gguf = GGUFFile(resolve(name))
        print(f"{name}:")
        if args.part in ("all", "tokenizer"):
            tok = bench_tokenizer(gguf, GPL3.read_text(), args.repeat)
        else:
            tok = Tokenizer.from_gguf(gguf)
        if args.part in ("all", "sampler"):
            bench_sampler(tok, args.repeat, baseline)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
