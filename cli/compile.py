"""llamba-compile: compile the kernels a model needs at this CPU's level ahead of the first start.

A fresh install's first `llamba-server` otherwise compiles kernels before it answers (SmolLM2 at avx2 on
two cores: first reply after 75 s). `make serve` runs this after fetching the model (62 s there), so that
time is spent while installing and the server's start loads every kernel from the cache (first reply
3.6-4.0 s; docs/performance.md "Start-up").

It takes llama-server's command line (`llamba-compile -m smollm2 -c 4096`; none: the default model) and
runs the server's own model load and engine warm-up, then stops. The kernels land in NUMBA_CACHE_DIR,
keyed by the level's compile target and a digest of the kernel sources (engine/jit_cache.py): a server
started later with the same sources at the same level loads them; an upgrade or another level compiles
again (tests/test_jit_cache.py), so a stale kernel is never served.

It also writes the bytecode of Llamba's own packages (`compileall`): pip compiles what it installs into
site-packages, but not an editable checkout's sources, and where PYTHONDONTWRITEBYTECODE is set (this
project's CI machine, many container images) every start compiled ~250 modules again: SmolLM2's second
start 4.3 -> 3.6 s to its first reply (scripts/start_time.py, 2026-12-08, the EPYC znver3).
"""

from __future__ import annotations

import compileall
import os
import sys
import time
from pathlib import Path

PACKAGES = ("engine", "server", "cli")  # Llamba's own, beside this file


def cached_kernels(cache: str | None) -> int:
    """How many compiled kernels the JIT cache folder holds (Numba writes one .nbc file per overload)."""
    return sum(1 for _ in Path(cache).rglob("*.nbc")) if cache else 0


def compile_bytecode() -> bool:
    """Every module of Llamba's packages compiled to __pycache__ (written even under
    PYTHONDONTWRITEBYTECODE, which only stops the interpreter writing; it still reads them)."""
    root = Path(__file__).resolve().parents[1]
    return all(compileall.compile_dir(root / name, quiet=1) for name in PACKAGES)


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    compile_bytecode()
    from engine.cpu import isa
    from server.config.parse import parse_settings
    from server.model.host import ModelHost
    from server.model.loading import load_model

    settings, _ = parse_settings(sys.argv[1:] if argv is None else argv)
    cache = os.environ.get("NUMBA_CACHE_DIR")  # set by engine/__init__.py when the environment did not
    before = cached_kernels(cache)
    host = ModelHost(settings)
    loaded = load_model(settings, host.admission, host.counters, host.lora)
    loaded.engine.stop()
    level = isa.current()
    print(
        f"llamba-compile: {loaded.info.path.name} ready at level {level.level.name} (target {level.cpu}) "
        f"in {time.perf_counter() - start:.1f} s; {cached_kernels(cache) - before} kernels compiled "
        f"into {cache}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
