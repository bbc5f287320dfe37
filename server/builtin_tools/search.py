"""file_glob_search and grep_search: the files under a folder (server/builtin_tools/listing.py: git's list
in a work tree, else a walk that honours .gitignore), globs matched, lines searched.

The model's patterns (grep's regular expression, and the globs, which become regular expressions) run
through the `regex` module with a timeout: one call's matching may take `--tools-regex-timeout` seconds
in all (a `Deadline`); a pattern that takes longer, such as `(a+)+$` on a long line of `a`s, ends the call
with a tool error and its worker thread is free again (`re` cannot be stopped: the thread would spin
for good). The regex module counts its timeout on the process's CPU clock, so on a busy machine the
wall time can be longer.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex
from pydantic import Field

from server.builtin_tools.files import Params
from server.builtin_tools.listing import Listing
from server.builtin_tools.workdir import ToolError, Workdir

REGEX_TIMEOUT_S = 5.0  # --tools-regex-timeout's default
MAX_RESULTS = 100
MAX_GREP_FILE_BYTES = 8 * 1024 * 1024  # a larger file (a dataset, a binary) is not read into memory
TYPES = ("file", "dir", "all")  # file_glob_search's `type`


class FileGlobSearch(Params):
    path: str = Field(description="the folder to search in")
    include: str = Field("**", description="glob the relative paths must match (e.g. **/*.py)")
    exclude: str = Field("", description="glob of paths to leave out")
    # Checked by the tool, not the schema: another value is the tool's error, as llama-server answers it
    # (the model reads it and tries again), not a 400.
    type: str = Field("file", description="what to list", json_schema_extra={"enum": list(TYPES)})
    max_depth: int = Field(0, description="0: any depth; 1: the folder's direct children only")
    limit: int = Field(
        MAX_RESULTS, description=f"most entries listed, 1 or more (at most {MAX_RESULTS})",
        json_schema_extra={"minimum": 1},
    )  # fmt: skip


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
def glob_regex(pattern: str) -> regex.Pattern[str]:
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
            out, i = out + regex.escape(pattern[i]), i + 1
    return regex.compile(out + r"\Z", regex.DOTALL)


@dataclass
class Deadline:
    """The time one call's pattern matching may take in all; each match gets what is left of it."""

    seconds: float = REGEX_TIMEOUT_S
    end: float = field(init=False)

    def __post_init__(self) -> None:
        self.end = time.monotonic() + self.seconds

    def search(self, pattern: regex.Pattern[str], text: str, anchored: bool = False) -> bool:
        """Whether `pattern` matches `text` (at its start when `anchored`); a ToolError past the time."""
        left = self.end - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            found = (pattern.match if anchored else pattern.search)(text, timeout=left)
        except TimeoutError:
            raise ToolError(
                f"the pattern {pattern.pattern!r} took longer than {self.seconds:g} s "
                "(--tools-regex-timeout); use a simpler one"
            ) from None
        return found is not None


def matches(rel: str, include: str, exclude: str, deadline: Deadline) -> bool:
    if not deadline.search(glob_regex(include), rel, anchored=True):
        return False
    return not (exclude and deadline.search(glob_regex(exclude), rel, anchored=True))


def file_glob_search(
    p: FileGlobSearch, wd: Workdir, regex_timeout: float = REGEX_TIMEOUT_S
) -> dict[str, Any]:
    if p.limit < 1:
        raise ToolError(f"invalid limit: {p.limit} (expected 1 or more)")
    if p.type not in TYPES:
        raise ToolError(f'invalid type: {p.type} (expected "file", "dir" or "all")')
    base = wd.resolve(p.path)
    if not base.is_dir():
        raise ToolError(f"path does not exist or is not a directory: {p.path}")
    walk = Listing(wd, base, max(p.max_depth, 0))
    deadline = Deadline(regex_timeout)
    limit = min(p.limit, MAX_RESULTS)
    shown: list[dict[str, str]] = []
    total = 0
    for rel, is_dir in walk.entries():
        if (is_dir and p.type == "file") or (not is_dir and p.type == "dir"):
            continue
        if not matches(rel, p.include, p.exclude, deadline):
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


def grep_search(p: GrepSearch, wd: Workdir, regex_timeout: float = REGEX_TIMEOUT_S) -> dict[str, Any]:
    source = regex.escape(p.pattern) if p.literal else p.pattern
    try:
        pattern = regex.compile(source, regex.IGNORECASE if p.ignore_case else 0)
    except regex.error as exc:
        raise ToolError(f"invalid regex: {exc}") from exc
    deadline = Deadline(regex_timeout)
    target = wd.resolve(p.path)
    if target.is_file():
        files = [(target, p.path)]
    elif target.is_dir():
        files = [
            (target / rel, rel)
            for rel, is_dir in Listing(wd, target).entries()
            if not is_dir and matches(rel, p.include, p.exclude, deadline)
        ]
    else:
        raise ToolError(f"path does not exist: {p.path}")
    return {"plain_text_response": Grep(pattern, p, deadline).run(files)}


@dataclass
class Grep:
    pattern: regex.Pattern[str]
    p: GrepSearch
    deadline: Deadline
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
            if not self.deadline.search(self.pattern, line):
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
