"""Llamba against llama.cpp in alternating pairs: the ratio of each pair and their median.

    .venv/bin/python scripts/bench_pairs.py -m qwen2.5-coder --llama-python /tmp/llcpp/bin/python \
        --pairs 6 -- -p 0 -n 128 -t 2 -r 2

Each pair runs `llamba-bench -o json` and `scripts/llama_cpp_bench.py` (with the Python of a venv that
has llama-cpp-python from PyPI, as that script's docstring says) with the same test flags, one after
the other, the order swapped from pair to pair. Why pairs: this VM's speed moves by 10-25% within
minutes (Qwen2.5-Coder tg128: Llamba 20-30 t/s, llama.cpp 22-28 on 2026-12-03), so two figures taken
far apart compare the machine's moods; a ratio taken within a minute, repeated, shows both the
typical ratio (the median) and how far one run can stray (the range).

    .venv/bin/python scripts/bench_pairs.py -m qwen2.5-coder --llama-python /tmp/llcpp/bin/python \
        --interleave --pairs 16 -- -p 512 -n 128 -t 2

--interleave compares within seconds instead: both programs load the model once, warm each test up,
then run one repetition of each test at a time, Llamba's and llama.cpp's alternated (the order swapped
each round), each with llama-bench's method (the cache cleared, the depth filled untimed). This VM has
slow spells of 10-60 s in which both run ~25% slower (2026-12-05: Qwen2.5-Coder tg128 Llamba ~30 t/s
and llama.cpp ~30 against 40-43 and 32-34 outside them), so a ratio of two whole runs a minute apart
can compare a spell with its absence; a round's ratio compares the same seconds. -r is ignored here.

--pack-experts (with --interleave) packs every expert of a mixture-of-experts model in the Llamba worker
before the warm-up. Llamba packs an expert the first time a prompt routes to it
(engine/cpu/lazy_experts.py), and random prompts keep reaching experts none before did (Qwen3.6-35B-A3B's
shape, random weights: 4520 of 6144 expert matrices after one 512-token prompt, 5614 after eight). On
the VM of 2026-12-06 each 2 MiB region of packed experts cost ~30 ms there (MADV_COLLAPSE 31 ms at the
median; a huge page's first fault as long; both 0.6 ms at other times), so without it a round timed
that packing as much as the kernels (pp512 rounds of 12.5, 9.8, 6.4, 6.0, 4.9 s). llama.cpp reads its
weights from the page cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from cli.bench.options import parse_args, plan
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


class Worker:
    """A warm benchmark process answering one repetition (its t/s) per test name written to it."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        if self.readline() != "ready":
            self.process.kill()
            raise RuntimeError(f"{' '.join(command)} did not start")

    def readline(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def rate(self, test: str) -> float:
        assert self.process.stdin is not None
        self.process.stdin.write(test + "\n")
        self.process.stdin.flush()
        return float(self.readline())

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        """End of input: the worker finishes its repetition and exits."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def serve_llamba(model: str, flags: list[str], pack_experts: bool = False) -> None:
    """The Llamba side of --interleave (this script with --worker): llamba-bench's tests and runner,
    each warmed up once, then one repetition per test named on stdin."""
    from cli.bench.runner import Runner, load_llm, set_threads

    params = dataclasses.replace(parse_args(["-m", model, *flags]), reps=1)
    tests = {test.name: test for test in plan(params)}
    set_threads(next(iter(tests.values())).n_threads)
    llm = load_llm(model, params.n_threads[0])
    if pack_experts:
        pack_all_experts(llm)
    runner = Runner(llm, lambda _msg: None, params)
    for test in tests.values():
        runner.run(test, 1, 1)  # its warm-up and one repetition
    runner.params = dataclasses.replace(params, no_warmup=True)
    print("ready", flush=True)
    for line in sys.stdin:
        test = tests[line.strip()]
        print(f"{test.n_tokens / (runner.run(test, 1, 1)[0] / 1e9):.4f}", flush=True)


def pack_all_experts(llm: object) -> None:
    """Pack every expert of every layer now (those of a model without experts: nothing)."""
    for layer in llm.model.layers:  # type: ignore[attr-defined]
        moe = getattr(layer, "moe", None)
        for matrices in (moe.gate_up, moe.down) if moe is not None else ():
            for prepare in matrices.prepare:
                if prepare is not None:
                    prepare(np.arange(moe.routing.n_expert))


def interleaved(args: argparse.Namespace, gguf: Path) -> dict[str, list[float]]:
    """Ratios per test, one repetition of each program at a time in two warm processes."""
    flags = args.flags
    names = [test.name for test in plan(parse_args(["-m", args.model, *flags]))]
    llamba = [sys.executable, str(Path(__file__).resolve()), "-m", args.model, "--worker"]
    llamba += ["--pack-experts"] if args.pack_experts else []
    llamba += ["--", *flags]
    script = str(ROOT / "scripts" / "llama_cpp_bench.py")
    llama = [args.llama_python, script, "-m", str(gguf), "--stdin", *flags]
    ratios: dict[str, list[float]] = {}
    with Worker(llamba) as ours, Worker(llama) as theirs:
        for round_ in range(args.pairs):
            for test in names:
                first, second = (ours, theirs) if round_ % 2 == 0 else (theirs, ours)
                rates = {first: first.rate(test), second: second.rate(test)}
                ratio = rates[ours] / rates[theirs]
                ratios.setdefault(test, []).append(ratio)
                line = f"Llamba {rates[ours]:.2f}, llama.cpp {rates[theirs]:.2f} t/s, ratio {ratio:.2f}"
                print(f"round {round_ + 1} {test}: {line}", flush=True)
    return ratios


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True, help="a catalogue name or a GGUF path")
    p.add_argument(
        "--llama-python", default=os.environ.get("LLAMA_CPP_PYTHON"), help="a Python with llama_cpp"
    )
    p.add_argument("--pairs", type=int, default=5, help="pairs of runs (rounds with --interleave)")
    p.add_argument("--interleave", action="store_true", help="alternate single repetitions, both warm")
    p.add_argument("--pack-experts", action="store_true", help="Llamba packs every expert first")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("flags", nargs="*", help="test flags for both, after --: -p 0 -n 128 -t 2 -r 2")
    args = p.parse_args()
    if args.worker:
        serve_llamba(args.model, args.flags, args.pack_experts)
        return
    if not args.llama_python:
        p.error("--llama-python (or LLAMA_CPP_PYTHON) must name a Python with llama-cpp-python")
    gguf = resolve(args.model)
    ratios = interleaved(args, gguf) if args.interleave else pairs(args, gguf)
    for test, values in sorted(ratios.items()):
        listed = ", ".join(f"{v:.2f}" for v in values)
        spread = f"range {min(values):.2f}-{max(values):.2f}"
        print(f"{test}: median ratio {statistics.median(values):.2f} ({spread}; {listed})")


def pairs(args: argparse.Namespace, gguf: Path) -> dict[str, list[float]]:
    """Ratios per test, one whole run of each program at a time."""
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
    return ratios


if __name__ == "__main__":
    main()
