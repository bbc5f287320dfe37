"""Where the built-in tools act: relative paths against one directory (x-tool-cwd, else the server's cwd),
a leading `~` as the home folder, as llama-server reads them.

Confined (`confined=True`), a path must stay inside that directory: Llamba's protection when the shell
tool is not enabled, so a model (or a page) driving only the file and search tools cannot read ~/.ssh or
write ~/.bashrc outside the folder it was given. Paths are resolved (symlinks and `..`) before the
check, so neither a `../` nor a symlink pointing out can escape. With exec_shell_command enabled the
shell reaches every path anyway, so the file tools are not confined either (llama-server's behaviour:
absolute paths anywhere).
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
    confined: bool = True  # paths outside `root` are refused

    @classmethod
    def open(cls, cwd: str | os.PathLike[str], confined: bool = True) -> Workdir:
        path = Path(cwd)
        if not path.is_absolute():
            raise BadContext(f"the tools' working directory must be an absolute path: {cwd}")
        root = path.resolve()
        if not root.is_dir():
            raise BadContext(f"the tools' working directory is not an existing directory: {cwd}")
        return cls(root, confined)

    def resolve(self, path: str) -> Path:
        """`path` (relative to the root, absolute, or under `~`) resolved; confined, a ToolError when it
        leads outside the root."""
        if not path:
            raise ToolError("path must not be empty")
        if "\0" in path:
            raise ToolError(f"path holds a NUL byte: {path!r}")
        if path == "~" or path.startswith("~/"):
            path = os.path.expanduser(path)
        resolved = (self.root / path).resolve()  # absolute `path` replaces the root, then is checked
        if not self.allows(resolved):
            raise ToolError(f"path is outside the working directory {self.root}: {path}")
        return resolved

    def contains(self, resolved: Path) -> bool:
        return resolved == self.root or self.root in resolved.parents

    def allows(self, resolved: Path) -> bool:
        """Whether the tools may act on `resolved` (symlinks resolved): anywhere, unless confined."""
        return not self.confined or self.contains(resolved)

    def relative(self, resolved: Path) -> str:
        return resolved.relative_to(self.root).as_posix() or "."
