"""A client that reads 10 bytes a second beside 8 that stream at full speed (issue #20).

Runs `--fast` concurrent greedy streams (`/completion`, `--tokens` tokens each, ignore_eos) twice: alone,
then beside one slow client that reads its own stream (the same request with 100 probabilities a token,
so its bytes pile up fast) at `--rate` bytes a second. Reported: the fast streams' aggregate tokens/s in
each phase and their ratio (the issue's bar: >= 0.9), the server's RSS before and after the slow phase,
and whether the slow client was cut off with the documented error event.

    .venv/bin/python scripts/bench_slow_reader.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server_process import ServerProcess, slow_client  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def fast_streams(url: str, n: int, tokens: int) -> float:
    """Aggregate generated tokens per second of n concurrent streams."""
    body = {"prompt": "Story:", "n_predict": tokens, "stream": True, "ignore_eos": True}

    async def one(client: httpx.AsyncClient, i: int) -> int:
        count = 0
        async with client.stream("POST", "/completion", json={**body, "seed": i}) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: ") and json.loads(line[6:]).get("content"):
                    count += 1
        return count

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(client, i) for i in range(n)))
        return sum(counts) / (time.perf_counter() - start)


def slow_reader(port: int, rate: float, stop: list[bool]) -> bytes:
    """Reads its stream at `rate` bytes a second until `stop[0]`, then the rest at once."""
    fields = {"prompt": "Story:", "n_predict": 4000, "n_probs": 100, "stream": True, "ignore_eos": True}
    received = b""
    with slow_client(port, "/completion", fields) as sock:
        while not stop[0]:
            received += sock.recv(max(1, int(rate)))
            time.sleep(1.0)
        while chunk := sock.recv(1 << 20):
            received += chunk
    return received


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rate", type=float, default=10.0)
    args = parser.parse_args()
    print(f"load before: {Path('/proc/loadavg').read_text().split()[:3]}")
    proc = ServerProcess("-m", "smollm2", "-c", "16384", "-np", str(args.fast + 1)).wait_healthy()
    try:
        await fast_streams(proc.base_url, args.fast, 32)  # warm-up
        alone = await fast_streams(proc.base_url, args.fast, args.tokens)
        rss_before = rss_mib(proc.proc.pid)
        stop = [False]
        slow = asyncio.get_running_loop().run_in_executor(None, slow_reader, proc.port, args.rate, stop)
        await asyncio.sleep(2.0)
        beside = await fast_streams(proc.base_url, args.fast, args.tokens)
        rss_after = rss_mib(proc.proc.pid)
        for _ in range(180):  # the slow one's bytes keep piling up until the server cuts it off
            if "stream.slow_reader_cut" in proc.log_path.read_text():
                break
            await asyncio.sleep(1.0)
        rss_cut = rss_mib(proc.proc.pid)
        stop[0] = True
        received = await slow
    finally:
        proc.stop()
    cut = b"the client read too slowly" in received
    print(f"{args.fast} fast streams alone: {alone:.1f} t/s; beside a {args.rate:g} B/s reader: {beside:.1f}")
    print(f"ratio {beside / alone:.3f} (bar >= 0.9)")
    print(f"server RSS MiB: {rss_before:.0f} before, {rss_after:.0f} after fast phase, {rss_cut:.0f} at cut")
    print(f"slow reader: {len(received)} bytes received, cut off with the error event: {cut}")


if __name__ == "__main__":
    asyncio.run(main())
