"""Locking the packed weights in RAM (`-lm mlock`, `--mlock`), as llama-server locks its model buffers.

Locked pages are never swapped out or compressed, so the first token after an idle spell does not wait
for the weights to come back from disk. Locking needs RLIMIT_MEMLOCK (or CAP_IPC_LOCK) to cover the
weights; when the kernel refuses, the model still runs, unlocked, and the reason is reported (llama.cpp
warns and goes on too).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from engine.quant import PACKED_FIELDS, PackedWeight


@dataclass(frozen=True)
class LockResult:
    locked_bytes: int
    error: str | None  # why some arrays could not be locked, or None


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mlock.restype = ctypes.c_int
    return libc


def lock_arrays(arrays: Iterable[np.ndarray]) -> LockResult:
    """mlock each host array's pages (the kernel rounds each range out to whole pages)."""
    libc = _libc()
    locked = 0
    for a in arrays:
        if a.nbytes == 0:
            continue
        if libc.mlock(ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(a.nbytes)) != 0:
            err = ctypes.get_errno()
            hint = " (raise `ulimit -l`)" if err in (1, 12) else ""  # EPERM, ENOMEM: over RLIMIT_MEMLOCK
            return LockResult(locked, f"mlock failed after {locked} bytes: {os.strerror(err)}{hint}")
        locked += a.nbytes
    return LockResult(locked, None)


def lock_packed_weights(weights: Iterable[PackedWeight]) -> LockResult:
    """The CPU backend's `lock_weights`: every array of every packed weight."""
    return lock_arrays(getattr(w, f) for w in weights for f in PACKED_FIELDS)
