"""numba.cuda for the CUDA tests: the simulator unless NUMBA_ENABLE_CUDASIM=0 and a GPU is present.

NUMBA_ENABLE_CUDASIM is set and numba's config re-read before `numba.cuda` is first imported (the CPU
tests import numba, never numba.cuda). When numba.cuda can't run at all, importing this module skips
the importing test module, or fails the run under CI=true (tests/conftest.py's require).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import numpy as np
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


def _locked_shared_arrays() -> None:
    """numba-cuda 0.30's simulator gives a block's threads one shared array per call site, made by the first
    thread to ask (a dict lookup, then an insert): a thread switch between the two (a GC pass while numpy
    allocates runs Python code) lets a second thread make its own copy, and the block then reduces through
    two arrays. The CI run of 2026-12-06 failed three parity tests that way (a logit 0, NaN rows), and
    `sys.setswitchinterval(1e-6)` reproduces it in one run of this file. The same lookup under a lock."""
    import threading

    from numba.core import types
    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    from numba.np import numpy_support

    static = FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):  # type: ignore[no-untyped-def]
        if shape == 0 or alignment is not None:  # dynamic shared memory: one buffer, no lookup
            return static(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)  # the simulator's key: the call site
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        with lock:
            found = self._allocations.get(key)
            if found is None:
                found = self._allocations[key] = np.empty(shape, dtype)
        return found

    FakeCUDAShared.array = array


if os.environ["NUMBA_ENABLE_CUDASIM"] == "1":
    _locked_shared_arrays()


@pytest.fixture(autouse=True)
def small_launches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fewer threads and blocks under the simulator (each CUDA thread is a Python thread). The code paths
    are the same: every kernel loops over blockDim and strides over its jobs."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        yield
        return
    from engine.cuda import arrays, lora, matmul, ops, sampling

    monkeypatch.setattr(arrays, "MAX_BLOCKS", 3)  # blocks stride over several jobs each
    monkeypatch.setattr(arrays, "THREADS", 64)
    monkeypatch.setattr(ops, "ROW_THREADS", 32)
    monkeypatch.setattr(ops, "ELEM_THREADS", 64)
    monkeypatch.setattr(matmul, "SPLITS", {1: 2, 8: 2})
    monkeypatch.setattr(matmul, "ROWS_THREADS", 32)
    monkeypatch.setattr(sampling, "THREADS", 32)
    monkeypatch.setattr(lora, "SUM_THREADS", 16)
    # The simulator's launcher polls its threads in a loop; switching the GIL more often than the 5 ms
    # default lets the kernel threads run (measured 2-3x faster on the whole-model test).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(2e-4)
    yield
    sys.setswitchinterval(interval)
