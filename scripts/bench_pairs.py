"""Llamba against llama.cpp in alternating pairs: the ratio of each pair and their median.

    .venv/bin/python scripts/bench_pairs.py -m qwen2.5-coder --llama-python /tmp/llcpp/bin/python \
        --pairs 6 -- -p 0 -n 128 -t 2 -r 2

Each pair runs `llamba-bench -o json` and `scripts/llama_cpp_bench.py` (with the Python of a venv that
has llama-cpp-python from PyPI, as that script's docstring says) with the same test flags, one after
the other, the order swapped from pair to pair. Why pairs: this VM's speed moves by 10-25% within
minutes (Qwen2.5-Coder tg128: Llamba 20-30 t/s, llama.cpp 22-28 on 2026-12-03), so two figures taken
far apart compare the machine's moods; a ratio taken within a minute, repeated, shows both the
typical ratio (the median) and how far one run can stray (the range).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from engine.model_files import resolve

ROOT = Path(__file__).resolve().parent.parent
LLAMA_LINE = re.compile(r"^llama\.cpp (\S+(?: @ d\d+)?)(?: \(.*\))?: ([\d.]+) ± [\d.]+ t/s$")


def test_name(row: dict) -> str:
    """llama_cpp_bench.py's name of a llamba-bench json row: pp512, tg128, tg128 @ d4096."""
    name = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
    return f"{name} @ d{row['n_depth']}" if row["n_depth"] else name


def llamba(model: str, flags: list[str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "cli.bench", "-m", model, "-o", "json", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {test_name(row): row["avg_ts"] for row in json.loads(out)}


def llama_cpp(python: str, gguf: Path, flags: list[str]) -> dict[str, float]:
    script = ROOT / "scripts" / "llama_cpp_bench.py"
    out = subprocess.run(
        [python, str(script), "-m", str(gguf), *flags], capture_output=True, text=True, check=True
    ).stdout
    return {m[1]: float(m[2]) for line in out.splitlines() if (m := LLAMA_LINE.match(line.strip()))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True, help="a catalogue name or a GGUF path")
    p.add_argument(
        "--llama-python", default=os.environ.get("LLAMA_CPP_PYTHON"), help="a Python with llama_cpp"
    )
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("flags", nargs="*", help="test flags for both, after --: -p 0 -n 128 -t 2 -r 2")
    args = p.parse_args()
    if not args.llama_python:
        p.error("--llama-python (or LLAMA_CPP_PYTHON) must name a Python with llama-cpp-python")
    gguf = resolve(args.model)
    ratios: dict[str, list[float]] = {}
    for pair in range(args.pairs):
        if pair % 2:  # llama.cpp first every other pair
            theirs = llama_cpp(args.llama_python, gguf, args.flags)
            ours = llamba(args.model, args.flags)
        else:
            ours = llamba(args.model, args.flags)
            theirs = llama_cpp(args.llama_python, gguf, args.flags)
        for test in sorted(ours.keys() & theirs.keys()):
            ratio = ours[test] / theirs[test]
            ratios.setdefault(test, []).append(ratio)
            rates = f"Llamba {ours[test]:.2f}, llama.cpp {theirs[test]:.2f} t/s"
            print(f"pair {pair + 1} {test}: {rates}, ratio {ratio:.2f}", flush=True)
    for test, values in sorted(ratios.items()):
        listed = ", ".join(f"{v:.2f}" for v in values)
        spread = f"range {min(values):.2f}-{max(values):.2f}"
        print(f"{test}: median ratio {statistics.median(values):.2f} ({spread}; {listed})")


if __name__ == "__main__":
    main()
