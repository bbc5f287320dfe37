"""Where the built-in tools may act: one directory (x-tool-cwd, else the server's cwd), never outside it.

llama-server lets its tools reach any path; Llamba confines them, so a model (or a page) driving the tools
cannot read ~/.ssh or write outside the folder it was given. Paths are resolved (symlinks and `..`) before
the check, so neither a `../` nor a symlink pointing out can escape.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class ToolError(Exception):
    """A tool's own failure (a missing file, an escaping path): its result is `{"error": message}`."""


class BadContext(ValueError):
    """The request's tool context is unusable (no such cwd, a bad runtime): a 400 before any tool runs."""


@dataclass(frozen=True)
class Workdir:
    root: Path  # absolute, symlinks resolved, an existing directory

    @classmethod
    def open(cls, cwd: str | os.PathLike[str]) -> Workdir:
        path = Path(cwd)
        if not path.is_absolute():
            raise BadContext(f"the tools' working directory must be an absolute path: {cwd}")
        root = path.resolve()
        if not root.is_dir():
            raise BadContext(f"the tools' working directory is not an existing directory: {cwd}")
        return cls(root)

    def resolve(self, path: str) -> Path:
        """`path` (relative to the root, or absolute) resolved; ToolError when it leads outside the root."""
        if not path:
            raise ToolError("path must not be empty")
        if "\0" in path:
            raise ToolError(f"path holds a NUL byte: {path!r}")
        resolved = (self.root / path).resolve()  # absolute `path` replaces the root, then is checked
        if not self.contains(resolved):
            raise ToolError(f"path is outside the working directory {self.root}: {path}")
        return resolved

    def contains(self, resolved: Path) -> bool:
        return resolved == self.root or self.root in resolved.parents

    def relative(self, resolved: Path) -> str:
        return resolved.relative_to(self.root).as_posix() or "."
