"""Llamba's inference engine: GGUF models, tokenizers, Numba kernels, scheduling. Knows nothing of HTTP."""

import os
from pathlib import Path

# Numba reads these when it is first imported, so they are set before anything imports numba.
# JIT output is cached outside the checkout so a fresh clone (CI) reuses it between runs,
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "llamba" / "numba"))
# ...under the kernels' path inside the checkout and a digest of their sources, not the clone's absolute
# path (engine/jit_cache.py); Numba's own locators for everything else.
os.environ.setdefault(
    "NUMBA_CACHE_LOCATOR_CLASSES",
    "engine.jit_cache.CheckoutCacheLocator,UserProvidedCacheLocator,InTreeCacheLocator,UserWideCacheLocator,"
    "IPythonCacheLocator,ZipCacheLocator",
)
# Parallel kernels are entered from the engine thread only. OpenMP with passive waiting keeps an idle
# worker from spinning against the other core for long (measured 40x slowdowns otherwise), but waking a
# sleeping worker costs ~55 us per parallel call, ~200 calls per decode step: a short spin (~0.3-1 ms)
# keeps it awake between the calls of one step (SmolLM2 decode 77 -> 224 tokens/s) and still sleeps when idle.
os.environ.setdefault("NUMBA_THREADING_LAYER", "omp")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "20000")


def _keep_freed_memory() -> None:
    """Let glibc keep the step's big buffers once freed instead of unmapping them.

    A forward pass allocates megabytes of activations. By default glibc serves each such block with a
    fresh mmap and unmaps it on free, so every step page-faults its buffers back in; its threshold adapts
    only after several steps (pp512 measured 950 t/s for the first few passes, 1320 after). Fixing the
    thresholds makes every pass run like a warm one. Blocks over 32 MiB (glibc's cap) are still mapped.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library already loaded into this process
    except (OSError, AttributeError):  # not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 * 2**20)
    mallopt(m_trim_threshold, 1024 * 2**20)


_keep_freed_memory()
