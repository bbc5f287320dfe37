"""Many adapters in one batch (issue #53): 16 concurrent streams spread over 4 rank-16 LoRA adapters
against the same 16 streams with no adapter, on Llamba and on llama-server, same file, same flags.

Writes 4 SYNTHETIC adapters for the base (tests/synthetic_lora.py: random rank-16 A/B on the attention and
FFN projections of every layer, F16 as convert_lora_to_gguf.py writes by default) into --work, starts
each server with all four loaded and not applied (`--lora-init-without-apply`), then per round and
server: "base" = 16 greedy `/completion` streams of -n tokens (ignore_eos) without `lora`; "4 adapters" =
the same with stream i asking for adapter i % 4 at scale 1. Prints the aggregate generated tokens per
second (all tokens / wall time from the first request to the last answer) of each, the median over
--rounds, and the ratios the issue asks for (adapters / base on Llamba >= 0.8; Llamba / llama-server
with the adapters >= 2).

    .venv/bin/python scripts/bench_lora.py -m qwen2.5-coder \\
        --llama-server ~/.cache/llamba/reference/llama-server-build/bin/llama-server

Run it on an idle machine (check `uptime`); without --llama-server only Llamba is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.model_files import resolve  # noqa: E402
from scripts.bench_contention import Server  # noqa: E402  (-np 16 -c 8192, as this benchmark needs)
from tests.synthetic_lora import write_lora  # noqa: E402

STREAMS = 16
ADAPTERS = 4


def adapters(base: Path, work: Path, rank: int, dtype: str) -> list[Path]:
    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in range(ADAPTERS):
        path = work / f"{base.stem}.lora-r{rank}-{dtype.lower()}-{seed}.gguf"
        if not path.exists():
            write_lora(base, path, rank=rank, alpha=2.0 * rank, seed=seed, dtype=dtype)
        paths.append(path)
    return paths


async def one_stream(client: httpx.AsyncClient, i: int, n_predict: int, with_lora: bool) -> int:
    body: dict = {
        "prompt": f"Request {i}: write a short story about the number {i * 7 % 101}.",
        "n_predict": n_predict,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    if with_lora:
        body["lora"] = [{"id": i % ADAPTERS, "scale": 1.0}]
    r = await client.post("/completion", json=body)
    r.raise_for_status()
    return int(r.json()["tokens_predicted"])


async def aggregate(url: str, n_predict: int, with_lora: bool) -> float:
    """Generated tokens per second of STREAMS concurrent requests."""
    async with httpx.AsyncClient(base_url=url, timeout=900) as client:
        start = time.perf_counter()
        counts = await asyncio.gather(*(one_stream(client, i, n_predict, with_lora) for i in range(STREAMS)))
        seconds = time.perf_counter() - start
    return sum(counts) / seconds


async def measure(server: Server, n_predict: int) -> dict[str, float]:
    await aggregate(server.url, 8, True)  # warm-up: every adapter's path once
    return {
        "base": await aggregate(server.url, n_predict, False),
        "adapters": await aggregate(server.url, n_predict, True),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="qwen2.5-coder")
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary (0c1e570: `make llama-server`)")
    p.add_argument("-n", "--n-predict", type=int, default=64)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--dtype", choices=("F16", "F32"), default="F16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--work", type=Path, default=Path.home() / ".cache/llamba/bench-lora")
    args = p.parse_args()
    model = resolve(args.model)
    loras = adapters(model, args.work, args.rank, args.dtype)
    kinds = ["llamba", "llama-server"] if args.llama_server else ["llamba"]
    both = ("--lora-init-without-apply", *(f for path in loras for f in ("--lora", str(path))))
    results: dict[str, dict[str, list[float]]] = {k: {"base": [], "adapters": []} for k in kinds}
    for rnd in range(args.rounds):
        for kind in kinds:
            server = Server(kind, args.llama_server, model, args.threads, both=both)
            try:
                server.wait_ready()
                figures = asyncio.run(measure(server, args.n_predict))
            finally:
                server.stop()
            print(f"round {rnd + 1} {kind}: " + ", ".join(f"{k} {v:.2f} tok/s" for k, v in figures.items()))
            for key, value in figures.items():
                results[kind][key].append(value)
    print(
        f"\n{model.name}, {STREAMS} streams x {args.n_predict} tokens, {ADAPTERS} rank-{args.rank} "
        f"{args.dtype} adapters, -t {args.threads}; median of {args.rounds} rounds (tokens/s)"
    )
    print("| server | base | 4 adapters | adapters / base |\n|---|---|---|---|")
    med = {k: {key: statistics.median(v) for key, v in r.items()} for k, r in results.items()}
    for kind, m in med.items():
        print(f"| {kind} | {m['base']:.2f} | {m['adapters']:.2f} | {m['adapters'] / m['base']:.2f} |")
    if "llama-server" in med:
        print(
            f"\nLlamba / llama-server with the adapters: "
            f"{med['llamba']['adapters'] / med['llama-server']['adapters']:.2f}x"
        )


if __name__ == "__main__":
    main()
