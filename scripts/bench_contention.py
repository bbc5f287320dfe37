"""Served decode on a busy machine (issue #20): Llamba and llama-server, alone, beside a process that
burns every core, and two servers of the same kind decoding at once on the same cores.

For each server kind: one server (`-np 16 -t T`), greedy `/completion` requests of `--tokens` tokens
(ignore_eos). "1 stream" is the server's own decode rate (`timings.predicted_per_second`, median of
`--rounds`); "16 streams" the aggregate generated tokens per second of 16 concurrent requests. Then the
same with `os.cpu_count()` busy-loop processes running (the "competing process"), and then a second
identical server started beside the first, both measured at 1 stream at the same time. The bars: with the
burner each figure keeps >= 50 % (degrades by <= 2x); each of two servers keeps >= 40 % of its solo speed.

    .venv/bin/python scripts/bench_contention.py -m smollm2 \\
        --llama-server /work/llcpp-build/server-build/bin/llama-server

Run it on an idle machine (check `uptime`); without --llama-server only Llamba is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.model_files import resolve  # noqa: E402
from tests.server_process import free_port  # noqa: E402

BURN = "while True: pass"


class Server:
    """A Llamba or llama-server process on a free port."""

    def __init__(
        self,
        kind: str,
        binary: str | None,
        model: Path,
        threads: int,
        extra: str = "",
        both: tuple[str, ...] = (),
    ) -> None:
        """`extra`: more flags for Llamba; `both`: more flags for either kind (scripts/bench_lora.py's)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        common = ["-m", str(model), "--port", str(self.port), "-np", "16", "-c", "8192", "-t", str(threads)]
        common += both
        if kind == "llamba":
            cmd = [sys.executable, "-m", "server", *common, *shlex.split(extra)]
        else:
            assert binary is not None
            cmd = [binary, *common, "-tb", str(threads), "--no-webui"]
        self.log = open(f"/tmp/bench-contention-{kind}-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1]
        )

    def wait_ready(self, timeout: float = 300) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited: see {self.log.name}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.5)
        raise TimeoutError(self.url)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


async def decode_rate(url: str, tokens: int, seed: int = 0) -> float:
    """One greedy request's decode tokens per second, as the server timed it."""
    body = {
        "prompt": "Once upon a time",
        "n_predict": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "seed": seed,
    }
    async with httpx.AsyncClient(timeout=600) as client:
        reply = (await client.post(url + "/completion", json=body)).json()
    return float(reply["timings"]["predicted_per_second"])


async def one_stream(url: str, tokens: int, rounds: int) -> float:
    return statistics.median([await decode_rate(url, tokens, i) for i in range(rounds)])


async def many_streams(url: str, tokens: int, n: int) -> float:
    """Aggregate generated tokens per second of n concurrent requests."""
    body = {"prompt": "Once upon a time", "n_predict": tokens, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        replies = await asyncio.gather(*(client.post(url + "/completion", json=body) for _ in range(n)))
        elapsed = time.perf_counter() - start
    return sum(r.json()["tokens_predicted"] for r in replies) / elapsed


async def warm(url: str) -> None:
    """Every slot and batch size once, so no measured request pays a first-time cost."""
    await decode_rate(url, 32)
    await many_streams(url, 32, 16)


@contextlib.contextmanager
def burner() -> Iterator[None]:
    """One busy-loop process per core: another program that wants every core."""
    procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(1)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


async def measure(kind: str, args: argparse.Namespace, model: Path) -> dict[str, float]:
    first = Server(kind, args.llama_server, model, args.threads, args.server_args).wait_ready()
    try:
        await warm(first.url)
        figures = {
            "1 stream": await one_stream(first.url, args.tokens, args.rounds),
            "16 streams": await many_streams(first.url, args.tokens, 16),
        }
        with burner():
            figures["1 stream, burner"] = await one_stream(first.url, args.tokens, args.rounds)
            figures["16 streams, burner"] = await many_streams(first.url, args.tokens, 16)
        second = Server(kind, args.llama_server, model, args.threads, args.server_args).wait_ready()
        try:
            await warm(second.url)
            both = await asyncio.gather(
                *(one_stream(s.url, args.tokens, args.rounds) for s in (first, second))
            )
            figures["1 stream, two servers (first)"], figures["1 stream, two servers (second)"] = both
        finally:
            second.stop()
        return figures
    finally:
        first.stop()


def report(kind: str, figures: dict[str, float]) -> None:
    solo1, solo16 = figures["1 stream"], figures["16 streams"]
    print(f"\n{kind}: load before {os.getloadavg()[0]:.2f}")
    print("| measure | tokens/s | of solo |")
    print("| --- | ---: | ---: |")
    for name, value in figures.items():
        base = solo16 if "16" in name else solo1
        print(f"| {name} | {value:.2f} | {value / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-m", "--model", default="smollm2")
    parser.add_argument("--llama-server", help="a llama-server binary to measure beside Llamba")
    parser.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server-args", default="", help="more flags for Llamba's servers")
    args = parser.parse_args()
    model = resolve(args.model)
    print(f"uptime load: {os.getloadavg()}")
    for kind in ["llamba"] + (["llama-server"] if args.llama_server else []):
        report(kind, asyncio.run(measure(kind, args, model)))


if __name__ == "__main__":
    main()
