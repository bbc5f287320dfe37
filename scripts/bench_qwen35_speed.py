"""Qwen3.5-hybrid speed against llama.cpp, level by level, and decode bytes per token (issue 49).

    .venv/bin/python scripts/bench_qwen35_speed.py [--models 2b,a3b] [--layers 12] \
        [--levels avx512-vnni,avx2] [--rounds 5]

One command for issue 49's speed acceptance:

1. writes (once) scripts/make_qwen35_bench_model.py's synthetic GGUFs to ~/.cache/llamba/bench:
   Qwen3.5-2B's widths with all 24 layers, and Qwen3.6-35B-A3B's widths with `--layers` of its 40
   (Q4_K_M as llama-quantize mixes it);
2. per model, in a fresh Llamba process at the machine's own level: decode steps with every
   weight-reading kernel call counted (scripts/bench_moe.py's ByteCounter: a dense matmul its whole
   packed weight, the experts' call its runs x one expert's bytes, the router its float matrix, the
   embedding its rows), against the roofline: the GGUF bytes a token must read, all dense tensors plus
   one embedding row (plus the whole embedding where it is the tied head) and, for the MoE, the used
   experts' share of the expert tensors;
3. per level and model: pp512 and tg128 in alternating single repetitions of Llamba and llama.cpp, both
   warm, on the same file (scripts/bench_pairs.py --interleave, 2 threads; for the MoE with
   --pack-experts: every expert packed before the warm-up, the steady state), each round's ratio and the
   median. Like against like: Llamba's avx512-vnni (the machine's own target) against llama.cpp 0c1e570
   built for this CPU (cmake GGML_NATIVE, `--native-lib`, run through llama-cpp-python with
   LLAMA_CPP_LIB_PATH), Llamba's avx2 against llama-cpp-python 0.3.36's AVX2 build (`--llama-python`),
   avx-vnni and portable against a build named by `--lib LEVEL=DIR` (none is built by default: the
   level is then skipped with a line saying so; `scripts/build_llama_server.sh portable` builds the
   portable one, and its pp512 takes minutes a repetition: SSE2 only, scalar K-quant dot products).
   llama.cpp runs with LLAMA_ARG_REPACK=0 (no extra buffer types: this VM lists AMX, whose tiles crash)
   and OMP_WAIT_POLICY=PASSIVE.

Check the load (uptime, printed before and after every pair run) before reading the figures: the ratios
compare the same seconds, but a busy machine slows the two unevenly.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.reference_data import reference_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
MiB = 2**20
# `make llama-server` builds llama.cpp 0c1e570 natively here (scripts/build_llama_server.sh); its libs
# serve llama-cpp-python through LLAMA_CPP_LIB_PATH.
LLAMA_CPP = reference_dir() / "llama-server-build" / "bin"


def own_level() -> str:
    """This machine's level: Llamba runs it without LLAMBA_CPU_LEVEL (its own target), against llama.cpp
    built natively here (avx512-vnni on the VM of 2026-12-06, avx2 on the AMD EPYC of 2026-12-07)."""
    from engine.cpu import isa

    return isa.current().level.name


OWN_LEVEL = own_level()
MEDIAN = re.compile(r"^(pp\d+|tg\d+): median ratio ([\d.]+)")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def roofline(llm: Any) -> tuple[float, float]:
    """(GGUF bytes a decode token must read, of which routed experts): every tensor but the embedding,
    one embedding row, the whole embedding again where it is the tied head, and each expert tensor's
    n_used / n_expert share."""
    g, model = llm.gguf, llm.model
    n_used = int(g.arch_value("expert_used_count", 0))
    dense = experts = 0.0
    for name, t in g.tensors.items():
        if name == "token_embd.weight":
            dense += t.data.nbytes / t.shape[0]
            if model.output is model.token_embd:
                dense += t.data.nbytes
        elif "_exps." in name:
            experts += t.data.nbytes * n_used / t.shape[0]
        else:
            dense += t.data.nbytes
    return dense + experts, experts


def measure(path: str, n_steps: int) -> None:
    """The fresh process's half: the level, RSS after load and prompt, the decode bytes per token."""
    from bench_moe import ByteCounter, rss

    from engine.batch import Batch, BatchPart
    from engine.cpu import isa
    from engine.llm import LLM

    start = time.perf_counter()
    llm = LLM.load(path, n_threads=2)
    print(f"level {isa.current().level.name}; loaded in {time.perf_counter() - start:.1f} s", flush=True)
    kv = llm.new_cache(1, 1024)
    rng = np.random.default_rng(0)
    n_vocab = llm.model.hp.n_vocab
    llm.prefill(kv, 0, [1, *rng.integers(3, n_vocab, 511).tolist()])
    fields = ", ".join(f"{k} {v / MiB:.0f} MiB" for k, v in rss().items())
    print(f"RSS after a 512-token prompt: {fields}; GGUF {llm.gguf.n_bytes / MiB:.0f} MiB", flush=True)
    counter = ByteCounter(llm.model.backend)
    start = time.perf_counter()
    for i in range(n_steps):
        llm.model.forward(Batch.of([BatchPart(0, 512 + i, [int(rng.integers(3, n_vocab))])]), kv)
    seconds = (time.perf_counter() - start) / n_steps
    per_token = counter.bytes / n_steps
    need, experts = roofline(llm)
    print(
        f"decode bytes per token: {per_token / MiB:.1f} MiB read by the kernels, roofline "
        f"{need / MiB:.1f} MiB (routed experts {experts / MiB:.1f} MiB + dense {(need - experts) / MiB:.1f} "
        f"MiB): {per_token / need:.3f} x; {1000 * seconds:.1f} ms a step (counted), "
        f"{need / seconds / 1e9:.1f} GB/s of the roofline's bytes",
        flush=True,
    )


def references(args: argparse.Namespace) -> dict[str, dict[str, str] | None]:
    """Per Llamba level, the environment that runs the like-for-like llama.cpp (None: no such build)."""
    refs: dict[str, dict[str, str] | None] = {"avx2": {}, "avx-vnni": None, "portable": None}
    refs[OWN_LEVEL] = {"LLAMA_CPP_LIB_PATH": str(args.native_lib)}
    for item in args.lib:
        level, _, folder = item.partition("=")
        refs[level] = {"LLAMA_CPP_LIB_PATH": folder}
    return refs


def system_info(python: str, env: dict[str, str]) -> str:
    code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode().strip())"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="2b,a3b", help="2b, a3b or both (default)")
    p.add_argument("--layers", type=int, default=12, help="a3b's layers (default 12 of 40)")
    levels = ",".join(dict.fromkeys([OWN_LEVEL, "avx2"]))
    p.add_argument("--levels", default=levels, help="Llamba's levels (each vs its llama.cpp)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds of pp512 and tg128")
    p.add_argument("--steps", type=int, default=16, help="decode steps counted for the bytes per token")
    p.add_argument("--llama-python", help="a Python with llama-cpp-python 0.3.36 (required)")
    p.add_argument("--native-lib", type=Path, default=LLAMA_CPP, help="llama.cpp's native build's libs")
    p.add_argument("--lib", action="append", default=[], metavar="LEVEL=DIR", help="another level's build")
    p.add_argument("--no-bytes", action="store_true", help="skip the decode bytes per token")
    p.add_argument("--measure", metavar="GGUF", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        measure(args.measure, args.steps)
        return
    if not args.llama_python:
        p.error("--llama-python is required (a venv's Python with llama-cpp-python 0.3.36 from PyPI)")
    print(uptime(), flush=True)
    paths = {}
    for model in args.models.split(","):
        make = [sys.executable, str(ROOT / "scripts" / "make_qwen35_bench_model.py"), "--model", model]
        make += ["--layers", str(args.layers)]
        out = subprocess.run(make, check=True, capture_output=True, text=True).stdout
        paths[model] = out.strip().splitlines()[-1]
        print(f"model {model}: {paths[model]}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLAMA_ARG_REPACK": "0", "OMP_WAIT_POLICY": "PASSIVE"}
    me = [sys.executable, str(Path(__file__).resolve())]
    if not args.no_bytes:
        for model, path in paths.items():
            print(f"== {model}: decode bytes per token ({uptime()})", flush=True)
            subprocess.run([*me, "--measure", path, "--steps", str(args.steps)], check=True, env=env)
    refs = references(args)
    medians: list[str] = []
    for level in args.levels.split(","):
        ref = refs.get(level)
        if ref is None:
            print(f"== {level}: no llama.cpp build for this level (--lib {level}=DIR names one); skipped")
            continue
        level_env = {**env, **ref}
        if level != OWN_LEVEL:
            level_env["LLAMBA_CPU_LEVEL"] = level
        print(f"== {level}: llama.cpp {system_info(args.llama_python, level_env)}", flush=True)
        for model, path in paths.items():
            print(f"-- {level} {model}: {uptime()}", flush=True)
            pairs = [sys.executable, str(ROOT / "scripts" / "bench_pairs.py"), "-m", path, "--interleave"]
            pairs += ["--llama-python", args.llama_python, "--pairs", str(args.rounds)]
            pairs += ["--pack-experts"] if model == "a3b" else []
            pairs += ["--", "-p", "512", "-n", "128", "-t", "2"]
            run = subprocess.run(pairs, env=level_env, cwd=ROOT, capture_output=True, text=True)
            print(run.stdout, end="", flush=True)
            if run.returncode:
                print(run.stderr[-3000:], flush=True)
                continue
            load = uptime()
            print(f"-- after: {load}", flush=True)
            for line in run.stdout.splitlines():
                if m := MEDIAN.match(line):
                    medians.append(f"{model} {m[1]} {level}: median ratio {m[2]} (load after: {load})")
    print("== medians (Llamba / llama.cpp)")
    for line in medians:
        print(line)


if __name__ == "__main__":
    main()
