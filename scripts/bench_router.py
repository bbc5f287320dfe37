"""Router mode's costs, measured on real processes (issue #16's benchmarks):

1. time to first token of a cold model (its child started by the request; the model file and the JIT
   cache already on disk), for SmolLM2 and Gemma 3;
2. time to first token of a sleeping model (`--sleep-idle-seconds 1`: the child wakes it);
3. the proxy's cost: aggregate tokens/s of 16 concurrent streams through the router against the same
   load sent to a single-model server with the child's flags, alternated (router, direct, router,
   direct) so machine-load drift hits both; the ratio is the figure (issue: >= 0.95), and the router
   process's own CPU time per streamed token (which machine load does not change).

    .venv/bin/python scripts/bench_router.py [--rounds 2] [-n 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.bench_serve import run_level  # noqa: E402
from tests.server_process import ServerProcess, wait_until  # noqa: E402

SERVER_FLAGS = ("-np", "16", "-c", "8192")
HEALTHY_S = 600.0  # a loaded machine can take minutes to compile a fresh worktree's kernels


def status(url: str, model: str) -> str:
    listing = httpx.get(url + "/models", timeout=10).json()["data"]
    return next(m["status"]["value"] for m in listing if m["id"] == model)


def first_token_seconds(url: str, model: str, query: str = "") -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions" + query, json=body, timeout=600) as r:
        for line in r.iter_lines():
            chunk = json.loads(line[6:]) if line.startswith("data: {") else {"choices": []}
            if any(c["delta"].get("content") for c in chunk["choices"]):
                return time.perf_counter() - start
    raise RuntimeError(f"no token: {r.status_code}")


def cold_and_sleeping(repeats: int) -> None:
    router = ServerProcess(
        "--models-max", "4", "--no-models-autoload", "--sleep-idle-seconds", "1", "-c", "4096"
    )
    router.wait_healthy()
    try:
        url = router.base_url
        for model in ("smollm2", "gemma3"):
            # Untimed: fetches the file if missing and fills this worktree's JIT cache, so the runs
            # below measure a cold start with the file on disk and the JIT cache warm (the issue's).
            first_token_seconds(url, model, "?autoload=true")
            colds, sleeps = [], []
            for i in range(repeats):
                httpx.post(url + "/models/unload", json={"model": model}, timeout=60)
                colds.append(first_token_seconds(url, model, "?autoload=true"))  # loads on this request
                wait_until(lambda m=model: status(url, m) == "sleeping", 120, f"{model} asleep")
                time.sleep(1)  # let the freed memory go back
                sleeps.append(first_token_seconds(url, model))
                print(f"{model} run {i + 1}: TTFT cold {colds[-1]:.2f} s, sleeping {sleeps[-1]:.2f} s")
            load = os.getloadavg()[0]
            print(
                f"TTFT {model} (fetch excluded, warm JIT cache): cold median"
                f" {statistics.median(colds):.2f} s, sleeping median {statistics.median(sleeps):.2f} s"
                f" (load {load:.1f})",
                flush=True,
            )
    finally:
        router.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def overhead(rounds: int, n_predict: int) -> None:
    # the router (its default model loads at start) and a single-model server with the child's flags
    router = ServerProcess(*SERVER_FLAGS).wait_healthy(HEALTHY_S)
    direct = ServerProcess("-m", "smollm2", *SERVER_FLAGS).wait_healthy(HEALTHY_S)
    try:
        wait_until(lambda: status(router.base_url, "smollm2") == "loaded", 300, "the router's default model")
        rates: dict[str, list[float]] = {"router": [], "direct": []}
        for _ in range(2):
            for name, proc in (("router", router), ("direct", direct)):
                cpu = cpu_seconds(router.proc.pid)
                level = asyncio.run(run_level(proc.base_url, 16, rounds, n_predict))
                rates[name].append(level.tokens_per_second)
                if name == "router":  # the proxy's own CPU per streamed token: independent of machine load
                    spent = cpu_seconds(router.proc.pid) - cpu
                    print(f"router process CPU: {1000 * spent / level.tokens:.3f} ms per streamed token")
                load = os.getloadavg()[0]
                rate, ttft = level.tokens_per_second, level.ttft_p50
                print(f"{name}: {rate:.1f} t/s, TTFT p50 {ttft:.2f} s (load {load:.1f})", flush=True)
        ratio = sum(rates["router"]) / sum(rates["direct"])
        load = os.getloadavg()[0]
        print(
            f"RATIO aggregate t/s at 16 streams, router / direct: {ratio:.3f}"
            f" (issue: >= 0.95; load {load:.1f})"
        )
    finally:
        router.stop()
        direct.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("-n", "--n-predict", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip", choices=["ttft", "overhead"], default=None)
    args = p.parse_args()
    print(f"cores {os.cpu_count()}, load {os.getloadavg()[0]:.1f}")
    if args.skip != "ttft":
        cold_and_sleeping(args.repeats)
    if args.skip != "overhead":
        overhead(args.rounds, args.n_predict)


if __name__ == "__main__":
    main()
