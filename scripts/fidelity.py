"""Fidelity figures against llama.cpp: teacher-forced agreement on the golden files and perplexity.

    .venv/bin/python scripts/fidelity.py [smollm2] [gemma3] [qwen2.5-coder]

The same measures tests/test_model.py asserts bounds on, printed as numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/

from cli.perplexity import perplexity  # noqa: E402
from engine.llm import LLM  # noqa: E402
from tests.conftest import GPL3, load_golden  # noqa: E402
from tests.test_model import LLAMA_CPP_PPL, teacher_forced_agreement  # noqa: E402


def main() -> None:
    for name in sys.argv[1:] or ["smollm2", "gemma3"]:
        llm = LLM.load(name)
        rate, gap, misses = teacher_forced_agreement(llm, load_golden(name))
        tokens = llm.tokenizer.encode(GPL3.read_text(), add_special=True, parse_special=False)
        *_, final = perplexity(llm, tokens, n_ctx=512, n_chunks=8)
        print(
            f"{name}: top-token agreement {rate:.1%}, median |dlogprob| {gap:.4f}, confident misses {misses}"
        )
        golden = load_golden(name)
        reference = golden["perplexity"]["ppl"] if "perplexity" in golden else LLAMA_CPP_PPL[name]
        print(f"{name}: PPL {final.ppl:.4f} (llama.cpp {reference:.4f})")


if __name__ == "__main__":
    main()
