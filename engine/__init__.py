"""Llamba's inference engine: GGUF models, tokenizers, Numba kernels, scheduling. Knows nothing of HTTP."""

import os
from pathlib import Path

# Numba reads these when it is first imported, so they are set before anything imports numba.
# JIT output is cached outside the checkout so a fresh clone (CI) reuses it between runs.
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "llamba" / "numba"))
# Parallel kernels are entered from the engine thread only; the OpenMP layer with passive waiting keeps
# an idle worker from spinning against the other core (measured 40x slowdowns otherwise).
os.environ.setdefault("NUMBA_THREADING_LAYER", "omp")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
