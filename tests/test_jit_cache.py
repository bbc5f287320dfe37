"""The JIT cache is shared by checkouts at different paths and dropped when any kernel source changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from engine import jit_cache

REPO = Path(__file__).resolve().parent.parent

# Compiles (or loads) one small engine kernel and says whether it came from the cache.
PROBE = """
import json
import numpy as np
import engine
from engine.cpu import vecmath
x = np.linspace(-3, 3, 8).astype(np.float32)
vecmath.exp(x[0])
print(json.dumps({"hits": sum(vecmath.exp.stats.cache_hits.values()),
                  "misses": sum(vecmath.exp.stats.cache_misses.values())}))
"""


def _checkout(at: Path) -> Path:
    shutil.copytree(REPO / "engine", at / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    return at


def _probe(checkout: Path, cache: Path) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CACHE")}
    env |= {"NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(checkout)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=checkout, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_clone_at_another_path_reuses_the_compiled_kernels(tmp_path: Path) -> None:
    cache = tmp_path / "numba"
    first = _checkout(tmp_path / "one")
    assert _probe(first, cache) == {"hits": 0, "misses": 1}
    assert _probe(first, cache) == {"hits": 1, "misses": 0}
    assert _probe(_checkout(tmp_path / "two"), cache) == {"hits": 1, "misses": 0}
    assert (cache / "llamba" / "engine" / "cpu").is_dir()


def test_a_change_to_any_kernel_source_recompiles(tmp_path: Path) -> None:
    cache = tmp_path / "numba"
    checkout = _checkout(tmp_path / "one")
    assert _probe(checkout, cache)["misses"] == 1
    # A constant module another kernel file reads: vecmath.exp itself did not change.
    with open(checkout / "engine" / "quant.py", "a") as f:
        f.write("\n# changed\n")
    assert _probe(checkout, cache) == {"hits": 0, "misses": 1}


def test_the_digest_covers_the_kernels_and_the_modules_they_import() -> None:
    names = {p.relative_to(REPO).as_posix() for p in jit_cache.kernel_sources()}
    kernels = {"engine/cpu/matmul/q4.py", "engine/cpu/vecmath.py", "engine/cuda/ops.py", "engine/grammar.py"}
    assert kernels <= names
    assert {"engine/quant.py", "engine/memory/kv_types.py"} <= names  # constants the kernels compile in
    assert "engine/cpu/matmul/intrinsics.py" in names  # no kernel of its own: the intrinsics they inline
    assert {"engine/cpu/simd.py", "engine/cpu/isa.py"} <= names  # the level's instructions, through it
    assert "engine/scheduler.py" not in names
