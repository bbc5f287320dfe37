"""The JIT cache is shared by checkouts at different paths and dropped when any kernel source changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from engine import jit_cache
from engine.cpu import isa
from tests.conftest import not_applicable

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


def _probe(checkout: Path, cache: Path, level: str | None = None) -> dict[str, int]:
    """The probe's cache hits and misses; `level`: compiled for that CPU level (LLAMBA_CPU_LEVEL)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_CACHE", "NUMBA_CPU", isa.LEVEL_ENV))
    }
    env |= {"NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(checkout)}
    if level is not None:
        env[isa.LEVEL_ENV] = level
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


def test_a_kernel_compiled_for_one_level_is_never_loaded_at_another(tmp_path: Path) -> None:
    """Serving loads only kernels of its own level: Numba's index keys each overload by the compile target
    (CPU name and features) besides the sources' digest, so a cache filled at one level misses at another
    (llamba-compile fills it per level, cli/compile.py)."""
    host = isa.host_features()
    runnable = [level.name for level in reversed(isa.LEVELS) if level.needs <= host]
    if len(runnable) < 2:
        not_applicable(f"this CPU executes one level only ({runnable[0]})")
    low, high = runnable[:2]  # portable and the next one up
    cache, checkout = tmp_path / "numba", _checkout(tmp_path / "one")
    assert _probe(checkout, cache, low) == {"hits": 0, "misses": 1}
    assert _probe(checkout, cache, high) == {"hits": 0, "misses": 1}
    assert _probe(checkout, cache, low) == {"hits": 1, "misses": 0}
    assert _probe(checkout, cache, high) == {"hits": 1, "misses": 0}
