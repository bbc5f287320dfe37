"""file_glob_search and grep_search: walking the working directory, matching globs, searching lines.

The walk skips the folders that hold no sources worth reading (JUNK), never follows a symlinked folder,
and stops after a time budget; a file whose real path leaves the working directory (a symlink pointing
out) is neither listed nor read. Unlike llama-server, Llamba does not ask git for the file list, so
.gitignore is not honoured.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from server.builtin_tools.files import Params
from server.builtin_tools.workdir import ToolError, Workdir

JUNK = frozenset(
    {".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build", "target",
     ".cache", ".idea", ".vscode"}
)  # fmt: skip
WALK_BUDGET_S = 15.0
MAX_RESULTS = 100
MAX_GREP_FILE_BYTES = 8 * 1024 * 1024  # a larger file (a dataset, a binary) is not read into memory


class FileGlobSearch(Params):
    path: str = Field(description="the folder to search in")
    include: str = Field("**", description="glob the relative paths must match (e.g. **/*.py)")
    exclude: str = Field("", description="glob of paths to leave out")
    type: Literal["file", "dir", "all"] = Field("file", description="what to list")
    max_depth: int = Field(0, description="0: any depth; 1: the folder's direct children only")
    limit: int = Field(MAX_RESULTS, ge=1, description=f"most entries listed (at most {MAX_RESULTS})")


class GrepSearch(Params):
    path: str = Field(description="a file, or a folder to search every file under")
    pattern: str = Field(description="a regular expression (Python syntax), or text with literal")
    include: str = Field("**", description="glob of the files searched under a folder")
    exclude: str = Field("", description="glob of files to leave out")
    return_line_numbers: bool = False
    literal: bool = Field(False, description="pattern is plain text")
    ignore_case: bool = False
    context_lines: int = Field(0, description="lines shown before and after each match")


@functools.lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as llama-server reads it: without `/` it matches the basename, `**...` and `/...` the whole
    relative path, anything else a path ending in it. `*` and `?` stay within a folder, `**` does not,
    and `**/` also matches no folder at all."""
    if "/" not in pattern:
        pattern = "**/" + pattern
    elif pattern.startswith("/"):
        pattern = pattern[1:]
    elif not pattern.startswith("**"):
        pattern = "**/" + pattern
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out, i = out + "[" + body.replace("\\", "\\\\") + "]", end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z", re.DOTALL)


def matches(rel: str, include: str, exclude: str) -> bool:
    if not glob_regex(include).match(rel):
        return False
    return not (exclude and glob_regex(exclude).match(rel))


@dataclass
class Walk:
    """One walk's entries (relative path, is a folder) and whether it stopped early."""

    wd: Workdir
    base: Path
    max_depth: int = 0
    truncated: bool = False

    def entries(self) -> Iterator[tuple[str, bool]]:
        deadline = time.monotonic() + WALK_BUDGET_S
        for folder, dirs, files in os.walk(self.base, onerror=self._unreadable):
            here = Path(folder)
            depth = len(here.relative_to(self.base).parts) + 1
            if time.monotonic() > deadline:
                self.truncated = True
                return
            for name in sorted(dirs):
                yield (here / name).relative_to(self.base).as_posix(), True
            # Pruned in place: os.walk then skips them (a symlinked folder is never entered anyway).
            dirs[:] = (
                [] if self.max_depth and depth >= self.max_depth else sorted(d for d in dirs if d not in JUNK)
            )
            for name in sorted(files):
                if self._inside(here / name):
                    yield (here / name).relative_to(self.base).as_posix(), False

    def _inside(self, path: Path) -> bool:
        return not path.is_symlink() or self.wd.contains(path.resolve())

    def _unreadable(self, _: OSError) -> None:
        self.truncated = True


def file_glob_search(p: FileGlobSearch, wd: Workdir) -> dict[str, Any]:
    base = wd.resolve(p.path)
    if not base.is_dir():
        raise ToolError(f"path does not exist or is not a directory: {p.path}")
    walk = Walk(wd, base, max(p.max_depth, 0))
    limit = min(p.limit, MAX_RESULTS)
    shown: list[dict[str, str]] = []
    total = 0
    for rel, is_dir in walk.entries():
        if (is_dir and p.type == "file") or (not is_dir and p.type == "dir"):
            continue
        if not matches(rel, p.include, p.exclude):
            continue
        total += 1
        if len(shown) < limit:
            shown.append({"path": rel, "type": "dir" if is_dir else "file"})
    lines = [e["path"] + ("/" if e["type"] == "dir" else "") for e in shown]
    text = "".join(line + "\n" for line in lines) + f"\n---\nTotal matches: {total}\n"
    if total > len(shown):
        text += (
            f"[{len(shown)} results limit reached ({total} total matches). "
            "Refine the glob pattern to narrow the search.]\n"
        )
    if walk.truncated:
        text += "[results truncated: time budget or unreadable directory]\n"
    return {"plain_text_response": text, "entries": shown, "base": str(base)}


def grep_search(p: GrepSearch, wd: Workdir) -> dict[str, Any]:
    source = re.escape(p.pattern) if p.literal else p.pattern
    try:
        regex = re.compile(source, re.IGNORECASE if p.ignore_case else 0)
    except re.error as exc:
        raise ToolError(f"invalid regex: {exc}") from exc
    target = wd.resolve(p.path)
    if target.is_file():
        files = [(target, p.path)]
    elif target.is_dir():
        walk = Walk(wd, target)
        files = [
            (target / rel, rel)
            for rel, is_dir in walk.entries()
            if not is_dir and matches(rel, p.include, p.exclude)
        ]
    else:
        raise ToolError(f"path does not exist: {p.path}")
    return {"plain_text_response": Grep(regex, p).run(files)}


@dataclass
class Grep:
    regex: re.Pattern[str]
    p: GrepSearch
    found: int = 0
    limit_reached: bool = False

    def run(self, files: list[tuple[Path, str]]) -> str:
        out: list[str] = []
        for path, shown in files:
            if self.limit_reached:
                break
            out += self.search(path, shown)
        text = "".join(out) + f"\n---\nTotal matches: {self.found}\n"
        if self.limit_reached:
            text += f"[{MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
        return text

    def search(self, path: Path, shown: str) -> list[str]:
        try:
            if path.stat().st_size > MAX_GREP_FILE_BYTES:
                return []
            lines = path.read_bytes().decode(errors="replace").split("\n")
        except OSError:
            return []  # unreadable: skipped, as llama-server does
        context = max(self.p.context_lines, 0)
        numbered = self.p.return_line_numbers or context > 0
        out: list[str] = []
        for i, line in enumerate(lines):
            if not self.regex.search(line):
                continue
            if self.found >= MAX_RESULTS:
                self.limit_reached = True
                break
            self.found += 1
            for j in range(max(i - context, 0), min(i + context + 1, len(lines))):
                mark = ":" if j == i else "-"
                out.append(f"{shown}{mark}{f'{j + 1}{mark}' if numbered else ''}{lines[j]}\n")
            if context:
                out.append("--\n")
        return out
