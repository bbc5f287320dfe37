"""Seconds from process start to the first generated token (cold or warm JIT cache).

NUMBA_CACHE_DIR=$(mktemp -d) python scripts/first_token.py smollm2   # cold
python scripts/first_token.py smollm2                                # warm
"""

import time

START = time.perf_counter()

import sys  # noqa: E402

from engine.llm import LLM  # noqa: E402

llm = LLM.load(sys.argv[1] if len(sys.argv) > 1 else None)
(tokens,) = llm.generate_greedy([llm.tokenizer.encode("The capital of France is")], 1)
print(f"first token {tokens[0]} after {time.perf_counter() - START:.2f} s (load {llm.load_seconds:.2f} s)")
