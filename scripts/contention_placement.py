"""Where the kernel puts the engine's threads beside a burner, and what that does to a 16-sequence step.

    .venv/bin/python scripts/contention_placement.py -m smollm2 --windows 8

Issue #20 asks served decode to keep half its solo speed beside a program burning every core. On a
2-core machine with `-t 2` that is the engine's fair share exactly, and which share it gets is decided
by the scheduler's placement of the runnable threads: with one compute thread, 3 tasks on 2 CPUs (alone
on a CPU: nearly its idle speed; sharing one: half); with two, 4 tasks (one of ours beside each burner,
or both burners beside the OpenMP worker while the main thread sits alone, when every barrier waits a
burner's time slice). This script times 16-sequence decode steps (the engine's forward pass, no server)
on 1 and 2 threads in windows of a few seconds, each window with fresh burner processes (one per CPU),
and samples the CPU each thread last ran on (/proc/<pid>/task/<tid>/stat) after every step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numba

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402, F401  (pins the threading environment before numba loads)
from engine.backend import cpu_backend  # noqa: E402
from engine.batch import Batch, BatchPart  # noqa: E402
from engine.gguf import GGUFFile  # noqa: E402
from engine.model_files import resolve  # noqa: E402
from engine.models import load_model  # noqa: E402

N_SEQ, DEPTH = 16, 64


def last_cpu(pid: int, tid: int) -> int:
    """The CPU a thread last ran on: field 39 of its stat line."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[36])


@contextmanager
def burners() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.3)
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="smollm2")
    p.add_argument("--windows", type=int, default=8, help="burner windows, each timing 1 and 2 threads")
    p.add_argument("--seconds", type=float, default=3.0, help="per thread count and window")
    args = p.parse_args()

    model = load_model(GGUFFile(resolve(args.model)), cpu_backend())
    kv = model.new_cache(N_SEQ, 2 * DEPTH)
    for s in range(N_SEQ):
        model.forward(Batch.of([BatchPart(s, 0, list(range(100, 100 + DEPTH)))]), kv)
    decode = Batch.of([BatchPart(s, DEPTH, [100 + s]) for s in range(N_SEQ)])

    def step(threads: int) -> float:
        for s in range(N_SEQ):
            kv.truncate(s, DEPTH)
        numba.set_num_threads(threads)
        start = time.perf_counter()
        model.forward(decode, kv)
        return time.perf_counter() - start

    pid, main_tid = os.getpid(), threading.get_native_id()
    idle = {t: statistics.median(step(t) for _ in range(30)) for t in (1, 2)}
    print(f"idle: 1 thread {idle[1] * 1e3:.1f} ms, 2 threads {idle[2] * 1e3:.1f} ms a step")
    for window in range(args.windows):
        with burners() as procs:
            for threads in (1, 2):
                times, alone = [], []
                end = time.monotonic() + args.seconds
                while time.monotonic() < end:
                    times.append(step(threads))
                    mine = last_cpu(pid, main_tid)
                    alone.append(all(last_cpu(b.pid, b.pid) != mine for b in procs))
                median, share_alone = statistics.median(times), sum(alone) / len(alone)
                print(
                    f"window {window}, {threads} thread(s): {median * 1e3:6.1f} ms a step ="
                    f" {idle[2] / median:.2f} of idle on 2 threads; the main thread on a CPU"
                    f" without a burner after {share_alone:.0%} of the steps"
                )


if __name__ == "__main__":
    main()
