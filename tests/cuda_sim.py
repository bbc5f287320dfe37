"""numba.cuda for the CUDA tests: the simulator unless NUMBA_ENABLE_CUDASIM=0 and a GPU is present.

NUMBA_ENABLE_CUDASIM is set and numba's config re-read before `numba.cuda` is first imported (the CPU
tests import numba, never numba.cuda). Importing this module skips the importing test module when
numba.cuda can't run at all.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
if "numba.cuda" not in sys.modules:
    from numba.core import config

    config.reload_config()

try:
    from numba import cuda
except ImportError as exc:  # a numba without its built-in CUDA target, and no numba-cuda
    pytest.skip(f"numba.cuda unavailable ({exc}): pip install numba-cuda", allow_module_level=True)

if not (cuda.is_available() or os.environ["NUMBA_ENABLE_CUDASIM"] == "1"):
    pytest.skip("no GPU and the CUDA simulator is off (NUMBA_ENABLE_CUDASIM=0)", allow_module_level=True)

__all__ = ["cuda"]
