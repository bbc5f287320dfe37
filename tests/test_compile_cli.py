"""llamba-compile (cli/compile.py) leaves nothing for the server's start or its first replies to compile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cli.compile import cached_kernels
from tests.server_process import REPO, ServerProcess

ARGS = ("-m", "smollm2", "-np", "2", "-c", "2048")


@pytest.mark.slow  # a cold compile of SmolLM2's kernels into an empty cache: about a minute on two cores
def test_the_server_after_llamba_compile_compiles_nothing(tmp_path: Path) -> None:
    """A fresh install as `make serve` makes it: an empty JIT cache, llamba-compile, then the server: its
    start and its first replies (greedy and sampled) load every kernel, compile none."""
    cache = str(tmp_path / "numba")
    done = subprocess.run(
        [sys.executable, "-m", "cli.compile", *ARGS],
        cwd=REPO,
        env={**os.environ, "NUMBA_CACHE_DIR": cache},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "SmolLM2-135M-Instruct.Q4_1.gguf ready at level" in done.stdout
    compiled = cached_kernels(cache)
    assert compiled > 20
    server = ServerProcess(*ARGS, env={"NUMBA_CACHE_DIR": cache}).wait_healthy()
    try:
        body = {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0}
        reply = httpx.post(server.base_url + "/completion", json=body, timeout=60).json()
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "top_k": 40, "seed": 1}
        httpx.post(server.base_url + "/v1/chat/completions", json=chat, timeout=60).raise_for_status()
    finally:
        server.stop()
    assert reply["tokens_predicted"] == 4
    assert cached_kernels(cache) == compiled


def test_llamba_compile_writes_the_packages_bytecode() -> None:
    """Every module of engine/, server/ and cli/ has its bytecode after llamba-compile's step, however
    PYTHONDONTWRITEBYTECODE is set (a start then reads them instead of compiling ~250 modules)."""
    import importlib.util

    from cli.compile import PACKAGES, compile_bytecode

    assert compile_bytecode()
    sources = [f for name in PACKAGES for f in (REPO / name).rglob("*.py")]
    assert len(sources) > 200
    stale = [
        f
        for f in sources
        if not (cached := Path(importlib.util.cache_from_source(str(f)))).exists()
        or cached.stat().st_mtime < f.stat().st_mtime
    ]
    assert not stale
