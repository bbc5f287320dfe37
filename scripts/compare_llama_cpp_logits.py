"""How far Llamba's logits are from llama.cpp's, next to how far llama.cpp's two attention paths are apart.

Teacher-forced over the golden chat case "Hi" (prompt + llama-server's reply), SmolLM2:

    # 1. llama.cpp's logits, flash attention off and on (llama-cpp-python from PyPI in its own venv)
    /tmp/llcpp/bin/python scripts/compare_llama_cpp_logits.py --dump-llama-cpp /tmp/llcpp-logits
    # 2. Llamba's, and the table
    .venv/bin/python scripts/compare_llama_cpp_logits.py --compare /tmp/llcpp-logits

Prints the mean KL divergence between every pair, and at the reply's 6th token the log-probability gap
between " help" (llama-server's choice) and " assist".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "smollm2.json"
MODEL = Path.home() / ".cache" / "llamba" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
HELP, ASSIST = 724, 4237


def case_tokens(tokenize) -> list[int]:  # type: ignore[no-untyped-def]
    case = json.loads(GOLDEN.read_text())["chat"][0]
    return tokenize(case["prompt"], True) + tokenize(case["greedy_reply"], False)


def dump_llama_cpp(out_dir: Path) -> None:
    import llama_cpp

    out_dir.mkdir(parents=True, exist_ok=True)
    for flash in (False, True):
        llm = llama_cpp.Llama(
            str(MODEL), n_ctx=512, n_threads=2, verbose=False, logits_all=True, flash_attn=flash
        )

        def tokenize(text: str, special: bool, llm: llama_cpp.Llama = llm) -> list[int]:
            return llm.tokenize(text.encode(), add_bos=False, special=special)

        tokens = case_tokens(tokenize)
        llm.eval(tokens)
        np.save(out_dir / f"flash_{'on' if flash else 'off'}.npy", np.array(llm.scores[: len(tokens)]))
    (out_dir / "tokens.json").write_text(json.dumps(tokens))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def compare(dump_dir: Path) -> None:
    from engine.batch import Batch, BatchPart
    from engine.llm import LLM

    tokens = json.loads((dump_dir / "tokens.json").read_text())
    llm = LLM.load("smollm2")
    logits = llm.model.forward(Batch.of([BatchPart(0, 0, tokens, "all")]), llm.new_cache(1, len(tokens)))
    runs = {
        "llama.cpp flash off": log_softmax(np.load(dump_dir / "flash_off.npy")),
        "llama.cpp flash on": log_softmax(np.load(dump_dir / "flash_on.npy")),
        "Llamba": log_softmax(logits),
    }
    at = tokens.index(HELP) - 1  # the row that predicts the reply's " help"
    print("| run | KL vs flash off (x1e-4) | KL vs flash on (x1e-4) | help - assist at the tie |")
    print("| --- | ---: | ---: | ---: |")
    for name, lp in runs.items():
        kl = [(np.exp(lp) * (lp - runs[ref])).sum(axis=1).mean() * 1e4 for ref in list(runs)[:2]]
        print(f"| {name} | {kl[0]:.1f} | {kl[1]:.1f} | {lp[at, HELP] - lp[at, ASSIST]:+.3f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--dump-llama-cpp", type=Path, metavar="DIR")
    g.add_argument("--compare", type=Path, metavar="DIR")
    args = p.parse_args()
    if args.dump_llama_cpp:
        dump_llama_cpp(args.dump_llama_cpp)
    else:
        compare(args.compare)


if __name__ == "__main__":
    main()
