"""llamba-bench (llama-bench on Llamba's engine), in four parts that each read alone.

`options`: the command line and the test plan (what each test does is described there); `runner`: loading
each model and timing its tests; `results`: what a test measured, as llama-bench's record; `output`: the
-o/-oe formats. This module is only the entry point: `llamba-bench = "cli.bench:main"`.
"""

from __future__ import annotations

import functools
import sys
import time

from cli import quiet_engine_logs
from cli.bench.options import parse_args
from cli.bench.runner import load_llm, run
from engine.cpu import isa

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    with quiet_engine_logs():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    started = time.perf_counter()
    params = parse_args(argv)
    try:  # on stderr: -o json and the others keep stdout
        print(isa.current().describe(), file=sys.stderr)
    except isa.UnsupportedTarget as exc:
        print(f"llamba-bench: error: {exc}", file=sys.stderr)
        return 1
    load = functools.partial(load_llm, device=params.device)
    return run(params, sys.stdout, sys.stderr, load=load, started=started)
