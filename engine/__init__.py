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

# The x86 level (engine/cpu/isa.py): LLAMBA_CPU_LEVEL, or NUMBA_CPU_NAME with its own features.
from engine.cpu import isa  # noqa: E402 (after the variables above; isa imports no numba)

isa.configure()


def _load_tbb() -> None:
    """NUMBA_THREADING_LAYER=tbb (the `tbb` extra, opt-in): load the wheel's libtbb, which it puts in the
    environment's lib/ where Numba's TBB layer does not look (without this: "No threading layer could be
    loaded"). TBB's threads steal the chunks a descheduled thread has not started, where OpenMP's join
    waits for it: beside a program on one core, SmolLM2 decoded 118-148 tokens/s against OpenMP's 21-29
    without the thread tuner (docs/performance.md, busy machines). Not the default: idle, SmolLM2's one
    stream decoded up to 25% slower with it."""
    import ctypes
    import sys

    libs = sorted(Path(sys.prefix, "lib").glob("libtbb.so.*"))
    if libs:  # else Numba says what is missing
        ctypes.CDLL(str(libs[0]), mode=ctypes.RTLD_GLOBAL)


if os.environ["NUMBA_THREADING_LAYER"] == "tbb":
    _load_tbb()


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
