"""numba.cuda for the CUDA tests: the simulator unless NUMBA_ENABLE_CUDASIM=0 and a GPU is present.

NUMBA_ENABLE_CUDASIM is set and numba's config re-read before `numba.cuda` is first imported (the CPU
tests import numba, never numba.cuda). When numba.cuda can't run at all, importing this module skips
the importing test module, or fails the run under CI=true (tests/conftest.py's require).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import require

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
if "numba.cuda" not in sys.modules:
    from numba.core import config

    config.reload_config()

try:
    from numba import cuda
except ImportError as exc:  # a numba without its built-in CUDA target, and no numba-cuda
    require(f"numba.cuda unavailable ({exc}): pip install numba-cuda (the test extra has it)")

if not (cuda.is_available() or os.environ["NUMBA_ENABLE_CUDASIM"] == "1"):
    require("no GPU and the CUDA simulator is off (NUMBA_ENABLE_CUDASIM=0)")

__all__ = ["cuda", "small_launches"]


@pytest.fixture(autouse=True)
def small_launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fewer threads and blocks under the simulator (each CUDA thread is a Python thread). The code paths
    are the same: every kernel loops over blockDim and strides over its jobs."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        yield
        return
    from engine.cuda import arrays, matmul, ops, sampling

    monkeypatch.setattr(arrays, "MAX_BLOCKS", 3)  # blocks stride over several jobs each
    monkeypatch.setattr(arrays, "THREADS", 64)
    monkeypatch.setattr(ops, "ROW_THREADS", 32)
    monkeypatch.setattr(ops, "ELEM_THREADS", 64)
    monkeypatch.setattr(matmul, "SPLITS", {1: 2, 8: 2})
    monkeypatch.setattr(matmul, "ROWS_THREADS", 32)
    monkeypatch.setattr(sampling, "THREADS", 32)
    # The simulator's launcher polls its threads in a loop; switching the GIL more often than the 5 ms
    # default lets the kernel threads run (measured 2-3x faster on the whole-model test).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(2e-4)
    yield
    sys.setswitchinterval(interval)
