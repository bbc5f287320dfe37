"""Seconds from `llamba-server`'s process start to healthy and to its first reply (issue 55's second start).

    .venv/bin/python scripts/start_time.py [-m smollm2] [--starts 3] [-- more server flags]

Each start runs `python -m server -m M` fresh on a free port (tests/server_process.py's ServerProcess;
the JIT cache as it is: run `llamba-compile` or one start first for a warm figure), polls /health every
10 ms, then sends one `/completion` of one token; prints both times per start and their medians. Check
the load (printed) first: this VM drifts.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server_process import ServerProcess  # noqa: E402


def one_start(model: str, flags: list[str]) -> tuple[float, float]:
    start = time.perf_counter()
    server = ServerProcess("-m", model, *flags)
    try:
        server.wait_healthy(poll_s=0.01)  # the default 0.2 s would round the start up by up to that
        healthy = time.perf_counter() - start
        body = {"prompt": "The capital of France is", "n_predict": 1}
        httpx.post(f"{server.base_url}/completion", json=body, timeout=60).raise_for_status()
        return healthy, time.perf_counter() - start
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="smollm2")
    p.add_argument("--starts", type=int, default=3)
    p.add_argument("flags", nargs="*", help="more llama-server flags (after --)")
    args = p.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    times = [one_start(args.model, args.flags) for _ in range(args.starts)]
    for healthy, reply in times:
        print(f"healthy {healthy:.2f} s, first reply {reply:.2f} s")
    print(
        f"median: healthy {statistics.median(t[0] for t in times):.2f} s, "
        f"first reply {statistics.median(t[1] for t in times):.2f} s"
    )


if __name__ == "__main__":
    main()
