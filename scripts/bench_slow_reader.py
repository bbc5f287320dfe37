"""A client that reads 10 bytes a second beside 8 that stream at full speed (issue #20).

Phase A: `--fast` concurrent greedy streams (`/completion`, `--tokens` tokens each, ignore_eos) beside a
ninth long stream whose client reads everything at once. Phase B: the same, but the ninth client reads
`--rate` bytes a second. The engine has the same work in both (the ninth generates as fast as it can
either way), so the ratio B/A is what the slow reader itself costs the others (the issue's bar: >= 0.9).
Phase C: a slow client whose stream carries 100 probabilities a token (~7 KB events) fills the socket
buffers and the server's own (`--stream-buffer-size`) within seconds and is cut off with the
documented error event. Reported: the ratio, the server's RSS through the phases, and the cut.

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


def reader(port: int, fields: dict, rate: float | None, stop: list[bool]) -> bytes:
    """Reads its stream at `rate` bytes a second (None: as fast as it comes) until `stop[0]` or its end."""
    received = b""
    with slow_client(port, "/completion", fields) as sock:
        sock.settimeout(1.0)
        while not stop[0]:
            try:
                chunk = sock.recv(max(1, int(rate)) if rate else 1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                break
            received += chunk
            if rate:
                time.sleep(1.0)
    return received


async def beside(proc: ServerProcess, args: argparse.Namespace, fields: dict, rate: float | None) -> float:
    """The fast streams' aggregate tokens/s while a ninth client reads its stream at `rate`."""
    stop = [False]
    ninth = asyncio.get_running_loop().run_in_executor(None, reader, proc.port, fields, rate, stop)
    await asyncio.sleep(1.0)
    speed = await fast_streams(proc.base_url, args.fast, args.tokens)
    stop[0] = True
    await ninth
    return speed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rate", type=float, default=10.0)
    args = parser.parse_args()
    print(f"load before: {Path('/proc/loadavg').read_text().split()[:3]}")
    proc = ServerProcess("-m", "smollm2", "-c", "16384", "-np", str(args.fast + 1)).wait_healthy()
    long_stream = {"prompt": "Story:", "n_predict": 1500, "stream": True, "ignore_eos": True}
    try:
        await fast_streams(proc.base_url, args.fast, 32)  # warm-up
        rss = [rss_mib(proc.proc.pid)]
        fast = await beside(proc, args, long_stream, None)
        slow = await beside(proc, args, long_stream, args.rate)
        rss.append(rss_mib(proc.proc.pid))
        stop = [False]
        heavy = long_stream | {"n_predict": 4000, "n_probs": 100}
        cut = asyncio.get_running_loop().run_in_executor(None, reader, proc.port, heavy, args.rate, stop)
        for _ in range(180):  # its bytes pile up until the server cuts it off
            if "stream.slow_reader_cut" in proc.log_path.read_text():
                break
            await asyncio.sleep(1.0)
        rss.append(rss_mib(proc.proc.pid))
        stop[0] = True
        received = await cut
    finally:
        proc.stop()
    print(
        f"{args.fast} fast streams beside a ninth read at once: {fast:.1f} t/s;"
        f" read at {args.rate:g} B/s: {slow:.1f}"
    )
    print(f"ratio {slow / fast:.3f} (bar >= 0.9)")
    print(f"server RSS MiB: {rss[0]:.0f} before, {rss[1]:.0f} after phases A and B, {rss[2]:.0f} at the cut")
    was_cut = (
        b"the client read too slowly" in received or "stream.slow_reader_cut" in proc.log_path.read_text()
    )
    print(f"phase C: {len(received)} bytes read before stopping; cut off with the error event: {was_cut}")


if __name__ == "__main__":
    asyncio.run(main())
