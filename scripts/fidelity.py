"""Fidelity figures against llama.cpp: teacher-forced agreement on the golden files and perplexity.

    .venv/bin/python scripts/fidelity.py [-ctk q8_0] [-ctv q8_0] [smollm2] [gemma3] [qwen2.5-coder]

The same measures tests/test_model.py asserts bounds on, printed as numbers; -ctk/-ctv run them with
that KV cache type (the goldens are llama.cpp's with its default f16 cache).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/

from cli.perplexity import perplexity  # noqa: E402
from engine.llm import LLM  # noqa: E402
from engine.memory.kv import CacheTypes  # noqa: E402
from engine.memory.kv_types import cache_type  # noqa: E402
from tests.conftest import GPL3, load_golden  # noqa: E402
from tests.test_model import teacher_forced_agreement  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["smollm2", "gemma3"])
    parser.add_argument("-ctk", "--cache-type-k", default="f16")
    parser.add_argument("-ctv", "--cache-type-v", default="f16")
    args = parser.parse_args()
    types = CacheTypes(cache_type(args.cache_type_k), cache_type(args.cache_type_v))
    for name in args.models:
        llm = LLM.load(name)
        rate, gap, misses = teacher_forced_agreement(llm, load_golden(name), types)
        tokens = llm.tokenizer.encode(GPL3.read_text(), add_special=True, parse_special=False)
        *_, final = perplexity(llm, tokens, n_ctx=512, n_chunks=8, types=types)
        print(
            f"{name} (-ctk {args.cache_type_k} -ctv {args.cache_type_v}): top-token agreement {rate:.1%}, "
            f"median |dlogprob| {gap:.4f}, confident misses {misses}"
        )
        reference = load_golden(name)["perplexity"]["ppl"]
        print(f"{name}: PPL {final.ppl:.4f} (llama.cpp {reference:.4f})")


if __name__ == "__main__":
    main()
