"""Where Numba caches the engine's kernels: one place for every checkout, keyed by the kernels' sources.

Numba's own locator files a kernel's machine code under a hash of its source file's absolute directory, so a
fresh clone at another path (every CI run, a developer's second worktree) compiles every kernel again: about
eight minutes of the test suite on two cores, measured cold (23 min 58 s) against warm (15 min 55 s). This
locator files it under the file's path inside the checkout instead, so identical sources share machine code.

Its freshness stamp is a digest of every kernel file together with the engine modules they import, not of
the one file: Numba's cache does not follow calls into other modules (a kernel keeps the inlined body of a
callee, and the values of the globals it read, from when it was compiled), so a change to any of them
recompiles them all rather than leaving a kernel that runs the old code.

engine/__init__.py puts this locator first in NUMBA_CACHE_LOCATOR_CLASSES; functions outside the engine
(the tests' own) fall through to Numba's locators.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from numba.core import config
from numba.core.caching import _CacheLocator, _SourceFileBackedLocatorMixin

ENGINE = Path(__file__).resolve().parent
ROOT = ENGINE.parent  # the checkout, or site-packages for an installed wheel
KERNEL_MARKERS = re.compile(rb"@(?:numba\.)?(?:njit|cuda\.jit)\b|\bnjit\(")
ENGINE_IMPORT = re.compile(rb"^from (engine(?:\.\w+)*) import \(?([\w, ]*)", re.MULTILINE)


def _module_file(module: str) -> Path | None:
    path = ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported(source: Path) -> set[Path]:
    """The engine modules a file imports: `from engine.x import y` is engine/x (its module or package)
    and engine/x/y.py where y is a module (`from engine.cpu import simd`)."""
    found = set()
    for module, names in ENGINE_IMPORT.findall(source.read_bytes()):
        candidates = [module.decode()] + [
            f"{module.decode()}.{n.strip()}" for n in names.decode().split(",") if n.strip()
        ]
        found |= {path for name in candidates if (path := _module_file(name)) is not None}
    return found


def kernel_sources(engine: Path = ENGINE) -> list[Path]:
    """The engine's kernel files and every engine module they import, directly or through each other
    (the byte kernels' IR comes from engine/cpu/simd.py through engine/cpu/matmul/intrinsics.py)."""
    kernels = {p for p in engine.rglob("*.py") if KERNEL_MARKERS.search(p.read_bytes())}
    seen, todo = set(kernels), list(kernels)
    while todo:
        for path in _imported(todo.pop()) - seen:
            seen.add(path)
            todo.append(path)
    return sorted(seen)


@functools.cache
def sources_digest() -> bytes:
    """One digest of the kernel sources, read once per process (a few thousand lines)."""
    digest = hashlib.sha256()
    for path in kernel_sources():
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.digest()


class CheckoutCacheLocator(_SourceFileBackedLocatorMixin, _CacheLocator):
    """NUMBA_CACHE_DIR/llamba/<the file's directory inside the checkout>, fresh while the sources are."""

    def __init__(self, py_func: Any, py_file: str) -> None:
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        inside = Path(py_file).resolve().parent.relative_to(ROOT)
        self._cache_path = os.path.join(config.CACHE_DIR, "llamba", *inside.parts)

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self) -> bytes:
        return sources_digest()

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> CheckoutCacheLocator | None:
        if not config.CACHE_DIR or not Path(py_file).resolve().is_relative_to(ENGINE):
            return None
        return super().from_function(py_func, py_file)  # type: ignore[no-any-return]
