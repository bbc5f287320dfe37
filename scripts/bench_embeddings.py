"""Embedding throughput and latency: Llamba against llama-server on the same encoder file, alternating.

    .venv/bin/python scripts/bench_embeddings.py -m all-minilm-l6-v2 \
        --llama-server vendor/llama.cpp/build/bin/llama-server --rounds 3 -- -np 4 -t 2

Both servers start with the same flags (`--embedding`, the model, then everything after `--`); each
round sends the same 2,000 sentences (8 to 256 tokens, seeded: the sentences of
scripts/encoder_sentences.py joined to each length) as /v1/embeddings requests of 32 inputs, `--clients`
of them in flight at once, and times the whole set; then a single short sentence `--latency-n` times one
after the other, and takes the median. The two servers run one after the other in each round, the order
swapped each round, so a ratio compares minutes next to each other (this VM's speed moves by 10-25%
over minutes). Only one server runs at a time. Prints each round and the medians as JSON lines.

llama-server on this VM needs LLAMA_ARG_REPACK=0 OMP_WAIT_POLICY=PASSIVE (README of
scripts/llama_server_clients): set here for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "scripts" / "llama_server_clients")]

from common import Server  # noqa: E402  (scripts/llama_server_clients/common.py)
from encoder_sentences import sentences  # noqa: E402

from engine.gguf import GGUFFile  # noqa: E402
from engine.model_files import resolve  # noqa: E402
from engine.text.tokenizer import Tokenizer  # noqa: E402

LLAMA_ENV = {"LLAMA_ARG_REPACK": "0", "OMP_WAIT_POLICY": "PASSIVE"}


def corpus(tokenizer: Tokenizer, n: int, seed: int = 0) -> list[str]:
    """n texts of 8 to 256 tokens (uniform in the length wanted), words drawn from the golden sentences."""
    words = " ".join(sentences()).split()
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        want, text = rng.randint(8, 256), ""
        while True:
            longer = (text + " " + rng.choice(words)).strip()
            if len(tokenizer.encode(longer, True, True)) > want:
                break
            text = longer
        texts.append(text or rng.choice(words))
    return texts


async def throughput(url: str, texts: list[str], per_request: int, clients: int) -> float:
    """Seconds to embed every text, `clients` requests of `per_request` inputs in flight at once."""
    batches = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for batch in batches:
        queue.put_nowait(batch)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            batch = queue.get_nowait()
            r = await http.post(url + "/v1/embeddings", json={"input": batch})
            r.raise_for_status()
            assert len(r.json()["data"]) == len(batch)

    async with httpx.AsyncClient(timeout=600) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return time.perf_counter() - start


def latency(url: str, text: str, n: int) -> float:
    """The median seconds of one short /v1/embeddings request, n of them one after the other."""
    times = []
    with httpx.Client(timeout=60) as http:
        for _ in range(n + 2):
            start = time.perf_counter()
            http.post(url + "/v1/embeddings", json={"input": text}).raise_for_status()
            times.append(time.perf_counter() - start)
    return statistics.median(times[2:])  # the first two warm the connection and the kernels


def measure(binary: str, model: str, flags: list[str], env: dict, args: argparse.Namespace) -> dict:
    texts = args.texts
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with Server(binary, model, args.port, ["--embedding", *flags]) as server:
            asyncio.run(throughput(server.url, texts[:64], args.per_request, args.clients))  # warm-up
            seconds = asyncio.run(throughput(server.url, texts, args.per_request, args.clients))
            single = latency(server.url, "What is the capital of France?", args.latency_n)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"texts_per_s": len(texts) / seconds, "seconds": seconds, "latency_ms": single * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-m", "--model", default="all-minilm-l6-v2")
    parser.add_argument("--llama-server", required=True, help="llama-server binary (make llama-server)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--per-request", type=int, default=32)
    parser.add_argument("--clients", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--latency-n", type=int, default=20)
    parser.add_argument("--port", type=int, default=18790)
    parser.add_argument("--only", choices=["llamba", "llama-server"], help="run one server (no ratio)")
    parser.add_argument("flags", nargs="*", help="server flags for both, after --")
    args = parser.parse_args()
    path = str(resolve(args.model))
    args.texts = corpus(Tokenizer.from_gguf(GGUFFile(path)), args.texts)
    lengths = [len(t.split()) for t in args.texts]
    print(json.dumps({"model": path, "texts": len(args.texts), "words_median": statistics.median(lengths)}))
    programs = {
        "llamba": (str(Path(sys.executable).parent / "llamba-server"), {}),
        "llama-server": (args.llama_server, LLAMA_ENV),
    }
    results: dict[str, list[dict]] = {name: [] for name in programs}
    for r in range(args.rounds):
        order = list(programs) if r % 2 == 0 else list(programs)[::-1]
        for name in order:
            if args.only and name != args.only:
                continue
            binary, env = programs[name]
            row = measure(binary, path, args.flags, env, args)
            results[name].append(row)
            print(json.dumps({"round": r, "server": name, **{k: round(v, 3) for k, v in row.items()}}))
    if args.only:
        return
    ours, theirs = results["llamba"], results["llama-server"]
    ratios = [a["texts_per_s"] / b["texts_per_s"] for a, b in zip(ours, theirs, strict=True)]
    latency_ratios = [a["latency_ms"] / b["latency_ms"] for a, b in zip(ours, theirs, strict=True)]
    print(
        json.dumps(
            {
                "throughput_ratio_median": round(statistics.median(ratios), 3),
                "throughput_ratios": [round(x, 3) for x in ratios],
                "latency_ratio_median": round(statistics.median(latency_ratios), 3),
                "latency_ratios": [round(x, 3) for x in latency_ratios],
            }
        )
    )


if __name__ == "__main__":
    main()
