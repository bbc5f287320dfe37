"""Scale-out benchmark (docs/scale-out.md): a local Ray cluster of 1 vs 2 SmolLM2 replicas with one
thread each, behind `llamba-server --cluster ray:local`.

- Aggregate tokens/s and TTFT p50/p95 at each concurrency (`cli/bench_serve.py`'s streams: distinct
  prompts, greedy, `ignore_eos`), for each replica count. One thread per replica, so on a machine with
  at least that many idle cores the ratio shows what a second replica adds, and the router's overhead.
- Prompt-cache hit rate with 2 replicas: groups of requests sharing a long system prompt, in shuffled
  order, with `--placement prefix` against `--placement random`; a hit is a request whose
  `timings.cache_n` covers its system prompt.
- The router's added latency: TTFT p50 of single requests through a 1-replica cluster against a plain
  `llamba-server` with the same flags.

    .venv/bin/python scripts/bench_cluster.py [--concurrency 16,64] [--rounds 2] [-n 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time

import httpx

from cli.bench_serve import run_level

SERVER_ARGS = ["-m", "smollm2", "-t", "1", "-c", "8192", "-np", "8"]
SYSTEM = "You are the help desk of a library. " + " ".join(
    f"Rule {i}: books {i * 7} to {i * 7 + 6} are on shelf {i % 9} of aisle {i % 4}." for i in range(25)
)


def start(port: int, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "server", "--port", str(port), *SERVER_ARGS, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited with {proc.returncode}")
        try:
            models = httpx.get(url + "/models", timeout=2).json()["data"][0]
            replicas = models.get("replicas")
            ok = all(r["status"] == "ready" for r in replicas) if replicas else True
            if ok and httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            pass
        time.sleep(1)
    raise TimeoutError(f"{cmd} not ready")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


async def hit_rate(url: str, groups: int, per_group: int, concurrency: int) -> tuple[int, int]:
    """Requests whose cached tokens covered their group's system prompt, of all requests."""
    jobs = [(g, i) for g in range(groups) for i in range(per_group)]
    random.Random(7).shuffle(jobs)
    sem = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, group: int, i: int) -> bool:
        body = {
            "messages": [
                {"role": "system", "content": f"Desk {group}. {SYSTEM}"},
                {"role": "user", "content": f"Question {i}: where is book {i * 13}?"},
            ],
            "max_tokens": 4,
            "temperature": 0,
        }
        async with sem:
            reply = (await client.post("/v1/chat/completions", json=body)).json()
        return reply["timings"]["cache_n"] >= 0.8 * reply["usage"]["prompt_tokens"]

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        hits = await asyncio.gather(*(one(client, g, i) for g, i in jobs))
    return sum(hits), len(hits)


def report_level(replicas: int, level) -> None:  # type: ignore[no-untyped-def]
    print(
        f"| {replicas} | {level.concurrency} | {level.n_requests} | {level.tokens_per_second:.1f} "
        f"| {level.ttft_p50 * 1e3:.0f} | {level.ttft_p95 * 1e3:.0f} |",
        flush=True,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="16,64")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("-n", "--n-predict", type=int, default=32)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--per-group", type=int, default=4)
    p.add_argument("--port", type=int, default=18700)
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"load average before: {os.getloadavg()}", flush=True)
    print("| replicas | streams | requests | aggregate t/s | TTFT p50 ms | TTFT p95 ms |")
    print("| --- | --- | --- | --- | --- | --- |", flush=True)
    for replicas in (1, 2):
        proc = start(args.port, "--cluster", "ray:local", "--replicas", str(replicas))
        url = f"http://127.0.0.1:{args.port}"
        try:
            asyncio.run(run_level(url, 2, 1, 8))  # warm-up
            for c in levels:
                report_level(replicas, asyncio.run(run_level(url, c, args.rounds, args.n_predict)))
            if replicas == 2:
                hits, n = asyncio.run(hit_rate(url, args.groups, args.per_group, 4))
                print(f"hit rate, placement prefix: {hits}/{n} = {hits / n:.0%}", flush=True)
            if replicas == 1:
                cluster_ttft = asyncio.run(run_level(url, 1, 8, 4)).ttft_p50
        finally:
            stop(proc)
    proc = start(args.port, "--cluster", "ray:local", "--replicas", "2", "--placement", "random")
    try:
        hits, n = asyncio.run(hit_rate(f"http://127.0.0.1:{args.port}", args.groups, args.per_group, 4))
        print(f"hit rate, placement random: {hits}/{n} = {hits / n:.0%}", flush=True)
    finally:
        stop(proc)
    proc = start(args.port)
    try:
        plain_ttft = asyncio.run(run_level(f"http://127.0.0.1:{args.port}", 1, 8, 4)).ttft_p50
    finally:
        stop(proc)
    print(
        f"TTFT p50 of single requests: plain server {plain_ttft * 1e3:.1f} ms, through the cluster router "
        f"{cluster_ttft * 1e3:.1f} ms (added {1e3 * (cluster_ttft - plain_ttft):.1f} ms)"
    )
    print(f"load average after: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
