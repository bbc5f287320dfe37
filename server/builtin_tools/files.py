"""read_file, write_file, edit_file: llama-server's file tools, in the working directory
(server/builtin_tools/workdir.py says when they are confined to it)."""

from __future__ import annotations

import base64
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from server.builtin_tools.workdir import ToolError, Workdir

MAX_TEXT_BYTES = 16384  # what read_file returns at most (the model's context is small)
MAX_BASE64_BYTES = 32 * 1024 * 1024
TRUNCATED = "[output truncated]"


class Params(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ReadFile(Params):
    path: str = Field(description="the file to read, relative to the working directory")
    start_line: int = Field(1, description="first line to read (1-based)")
    end_line: int = Field(-1, description="last line to read, inclusive; -1: to the end of the file")
    append_loc: bool = Field(False, description="prefix each line with its number and →")


class WriteFile(Params):
    path: str = Field(description="the file to write (created with its folders, or overwritten)")
    content: str = Field(description="the file's whole new content")


class Edit(BaseModel):
    old_text: str = Field(description="text to replace; it must occur exactly once in the file")
    new_text: str = Field(description="its replacement")


class EditFile(Params):
    path: str = Field(description="the file to edit")
    edits: list[Edit] = Field(description="replacements, each located in the file as it is now")


def read_file(p: ReadFile, wd: Workdir, resp_type: str | None = None) -> dict[str, Any]:
    path = wd.resolve(p.path)
    if not path.is_file():
        raise ToolError(f"cannot stat file: {p.path}")
    size = path.stat().st_size
    if resp_type == "base64":
        if size > MAX_BASE64_BYTES:
            raise ToolError(f"file too large ({size} bytes, max {MAX_BASE64_BYTES})")
        return {"base64": base64.b64encode(path.read_bytes()).decode(), "size_bytes": size}
    whole = p.end_line == -1
    if size > MAX_TEXT_BYTES and whole:
        raise ToolError(
            f"file too large ({size} bytes, max {MAX_TEXT_BYTES}). Use start_line/end_line to read a portion."
        )
    return {"plain_text_response": _lines(path.read_bytes(), p)}


def _lines(data: bytes, p: ReadFile) -> str:
    """Lines start_line..end_line, each ending in a newline, cut before MAX_TEXT_BYTES."""
    lines = data.decode(errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the file does not start another line
    first = max(p.start_line, 1)
    last = len(lines) if p.end_line == -1 else min(p.end_line, len(lines))
    out: list[str] = []
    size = 0
    for number in range(first, last + 1):
        line = f"{number}→{lines[number - 1]}\n" if p.append_loc else lines[number - 1] + "\n"
        size += len(line.encode())
        if size > MAX_TEXT_BYTES:
            out.append(TRUNCATED)
            break
        out.append(line)
    return "".join(out)


def write_file(p: WriteFile, wd: Workdir) -> dict[str, Any]:
    path = wd.resolve(p.path)
    data = p.content.encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        raise ToolError(f"failed to write file: {p.path} ({exc.strerror})") from exc
    return {"result": "file written successfully", "path": p.path, "bytes": len(data)}


def edit_file(p: EditFile, wd: Workdir) -> dict[str, Any]:
    """Every old_text is found in the file as it is now (not after the earlier edits), must be unique,
    and must not overlap another edit's; then all are applied at once, or none."""
    if not p.edits:
        raise ToolError('"edits" must be a non-empty array')
    path = wd.resolve(p.path)
    try:
        text = path.read_bytes().decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolError(f"failed to open file: {p.path}") from exc
    spans = sorted((_locate(text, e.old_text, i, p.path), i) for i, e in enumerate(p.edits))
    for (prev, a), (nxt, b) in zip(spans, spans[1:], strict=False):
        if prev[1] > nxt[0]:
            raise ToolError(
                f"edits[{a}] and edits[{b}] overlap in {p.path}; merge them into one edit or target "
                "disjoint regions"
            )
    edited = text
    for (start, end), i in reversed(spans):  # from the end: earlier offsets stay valid
        edited = edited[:start] + p.edits[i].new_text + edited[end:]
    if edited == text:
        raise ToolError("no changes made: the replacement(s) produced identical content")
    try:
        path.write_bytes(edited.encode())  # bytes: line endings stay as they were
    except OSError as exc:
        raise ToolError(f"failed to write file: {p.path}") from exc
    return {"result": "file edited successfully", "path": p.path, "edits_applied": len(p.edits)}


def _locate(text: str, old: str, index: int, shown: str) -> tuple[int, int]:
    if not old:
        raise ToolError(f"edits[{index}].old_text must not be empty")
    count = text.count(old)
    if count == 0:
        raise ToolError(
            f"could not find edits[{index}].old_text in {shown}, "
            "it must match the file's current content exactly"
        )
    if count > 1:
        raise ToolError(f"found {count} occurrences of edits[{index}].old_text in {shown}, it must be unique")
    start = text.index(old)
    return start, start + len(old)
