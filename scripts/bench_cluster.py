"""Scale-out benchmark (docs/scale-out.md): a local Ray cluster of 1 vs 2 SmolLM2 replicas with one
thread each, behind `llamba-server --cluster ray:local`.

- Aggregate tokens/s and TTFT p50/p95 at each concurrency (`cli/bench_serve.py`'s streams: distinct
  prompts, greedy, `ignore_eos`), for each replica count. One thread per replica, so on a machine with
  at least that many idle cores the ratio shows what a second replica adds, and the router's overhead.
- Prompt-cache hit rate with 2 replicas: groups of requests sharing a long system prompt, in shuffled
  order, with `--placement prefix` against `--placement random`; a hit is a request whose
  `timings.cache_n` covers its system prompt.
- The router's added latency per request: the same small chat (1 token) sent straight to a replica
  (its URL from /models, its API key set with LLAMBA_CLUSTER_SECRET) and through the router,
  alternately, median of `--latency-n` each, for 1 and 2 replicas (with 2, also a request with a
  long system prompt, which the router tokenizes on a replica to place it by prefix).

    .venv/bin/python scripts/bench_cluster.py [--concurrency 16,64] [--rounds 1] [-n 32] [--latency-n 30]
    .venv/bin/python scripts/bench_cluster.py --concurrency 2 -n 8 --groups 2 --per-group 2 --latency-n 3
        (a check that it runs end to end, in a few minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

from cli.bench_serve import run_level

SERVER_ARGS = ["-m", "smollm2", "-t", "1", "-c", "8192"]
SECRET = secrets.token_hex(16)  # the replicas' API key (LLAMBA_CLUSTER_SECRET), to reach one directly
SYSTEM = "You are the help desk of a library. " + " ".join(
    f"Rule {i}: books {i * 7} to {i * 7 + 6} are on shelf {i % 9} of aisle {i % 4}." for i in range(25)
)


def start(port: int, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "server", "--port", str(port), *SERVER_ARGS, *args]
    env = {**os.environ, "LLAMBA_CLUSTER_SECRET": SECRET}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
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


def replica_urls(url: str) -> list[str]:
    return [r["url"] for r in httpx.get(url + "/models", timeout=10).json()["data"][0]["replicas"]]


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


def added_latency(router: str, replica: str, n: int, system: str | None = None) -> tuple[float, float]:
    """Median seconds of the same 1-token chat straight to `replica` and through `router`, sent
    alternately (so a drift in the machine's load hits both alike)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": "Hi"}
    ]
    body = {"messages": messages, "max_tokens": 1, "temperature": 0}
    times: dict[str, list[float]] = {"direct": [], "router": []}
    key = {"Authorization": f"Bearer {SECRET}"}
    with httpx.Client(timeout=120) as client:
        for i in range(n + 1):
            for name, url, headers in (("direct", replica, key), ("router", router, {})):
                start_t = time.perf_counter()
                reply = client.post(url + "/v1/chat/completions", json=body, headers=headers)
                elapsed = time.perf_counter() - start_t
                reply.raise_for_status()
                if i:  # the first pair warms both connections and the prompt cache
                    times[name].append(elapsed)
    return statistics.median(times["direct"]), statistics.median(times["router"])


def report_level(replicas: int, level: Any) -> None:
    print(
        f"| {replicas} | {level.concurrency} | {level.n_requests} | {level.tokens_per_second:.1f} "
        f"| {level.ttft_p50 * 1e3:.0f} | {level.ttft_p95 * 1e3:.0f} |",
        flush=True,
    )


def report_latency(replicas: int, prompt: str, direct: float, routed: float) -> None:
    added = (routed - direct) * 1e3
    print(f"| {replicas} | {prompt} | {direct * 1e3:.1f} | {routed * 1e3:.1f} | {added:+.1f} |", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="16,64")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("-n", "--n-predict", type=int, default=32)
    p.add_argument("-np", "--parallel", type=int, default=8, help="slots per replica")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--per-group", type=int, default=4)
    p.add_argument("--latency-n", type=int, default=30, help="requests each way for the added latency")
    p.add_argument("--port", type=int, default=18700)
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    url = f"http://127.0.0.1:{args.port}"
    slots = ["-np", str(args.parallel)]
    print(f"load average before: {os.getloadavg()}", flush=True)
    rows: list[tuple[int, Any]] = []
    latencies: list[tuple[int, str, float, float]] = []
    hit_rates: dict[str, tuple[int, int]] = {}
    for replicas in (1, 2):
        proc = start(args.port, *slots, "--cluster", "ray:local", "--replicas", str(replicas))
        try:
            asyncio.run(run_level(url, 2, 1, 8))  # warm-up
            for c in levels:
                rows.append((replicas, asyncio.run(run_level(url, c, args.rounds, args.n_predict))))
                report_level(*rows[-1])
            replica = replica_urls(url)[0]
            latencies.append((replicas, "short", *added_latency(url, replica, args.latency_n)))
            if replicas == 2:  # the router tokenizes a long prompt on a replica to place it by prefix
                latencies.append(
                    (replicas, "long system", *added_latency(url, replica, args.latency_n, SYSTEM))
                )
                hit_rates["prefix"] = asyncio.run(hit_rate(url, args.groups, args.per_group, 4))
        finally:
            stop(proc)
    proc = start(args.port, *slots, "--cluster", "ray:local", "--replicas", "2", "--placement", "random")
    try:
        hit_rates["random"] = asyncio.run(hit_rate(url, args.groups, args.per_group, 4))
    finally:
        stop(proc)
    print(f"\nload average after: {os.getloadavg()}\n")
    print("| replicas | streams | requests | aggregate t/s | TTFT p50 ms | TTFT p95 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        report_level(*row)
    print(
        "\n| replicas | prompt | direct to a replica, median ms | through the router, median ms | added ms |"
    )
    print("| --- | --- | --- | --- | --- |")
    for latency in latencies:
        report_latency(*latency)
    print()
    for placement, (hits, n) in hit_rates.items():
        print(f"hit rate with 2 replicas, placement {placement}: {hits}/{n} = {hits / n:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
