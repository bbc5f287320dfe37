"""The built-in tools (llama-server's `--tools`): their definitions as GET /tools lists them, and one way
to call any of them, from POST /tools or from the server-side tool loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import structlog

from server.builtin_tools import files, search, shell
from server.builtin_tools.context import ToolContext
from server.builtin_tools.files import Params
from server.builtin_tools.workdir import BadContext, ToolError

log = structlog.get_logger("tools")

# The label a chat's `mcp` tool names the built-in tools by (`{"type": "mcp", "server_label": "builtin"}`).
BUILTIN_LABEL = "builtin"


async def _read_file(p: files.ReadFile, c: ToolContext) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(files.read_file, p, c.host_workdir(), c.resp_type)


async def _on_host(fn: Callable[[Any, Any], dict[str, Any]], p: Params, c: ToolContext) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(fn, p, c.host_workdir())  # file work never blocks the loop


async def _search(fn: Callable[..., dict[str, Any]], p: Params, c: ToolContext) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(fn, p, c.host_workdir(), c.regex_timeout)


async def _exec(p: shell.ExecShellCommand, c: ToolContext) -> dict[str, Any]:
    return await shell.exec_shell_command(shell.Execution(p, c.cwd, c.runtime))


@dataclass(frozen=True)
class BuiltinTool:
    name: str
    display_name: str
    description: str
    params: type[Params]
    run: Callable[[Any, ToolContext], Awaitable[dict[str, Any]]]
    write: bool = False
    streams: bool = False
    server: str = BUILTIN_LABEL

    @property
    def tool(self) -> str:
        return self.name

    @property
    def read_only(self) -> bool:
        return not self.write

    def to_json(self) -> dict[str, Any]:
        """Its GET /tools entry, in llama-server's shape (type "server": it runs in this server)."""
        return {
            "display_name": self.display_name,
            "tool": self.name,
            "type": "server",
            "permissions": {"write": self.write},
            "uses_cwd": True,
            "definition": {
                "type": "function",
                "function": {
                    "name": self.name,
                    "description": self.description,
                    "parameters": schema(self.params),
                },
            },
        }


def schema(params: type[Params]) -> dict[str, Any]:
    """The params' JSON schema, inlined (no $defs: the tool loop's grammars and clients read it whole)."""
    raw = params.model_json_schema()
    defs = raw.pop("$defs", {})
    return _inline(raw, defs)


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "title"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


TOOLS: tuple[BuiltinTool, ...] = (
    BuiltinTool(
        "read_file", "Read file", "Read a text file's lines (at most 16 KiB).", files.ReadFile, _read_file
    ),
    BuiltinTool(
        "file_glob_search", "File search", "List the files (or folders) under a folder that match a glob.",
        search.FileGlobSearch, partial(_search, search.file_glob_search),
    ),
    BuiltinTool(
        "grep_search", "Grep search", "Search the lines of a file, or of the files under a folder.",
        search.GrepSearch, partial(_search, search.grep_search),
    ),
    BuiltinTool(
        "exec_shell_command", "Execute shell command", "Run a shell command; its output and exit code.",
        shell.ExecShellCommand, _exec, write=True, streams=True,
    ),
    BuiltinTool(
        "write_file", "Write file", "Write a file (its folders are created).", files.WriteFile,
        partial(_on_host, files.write_file), write=True,
    ),
    BuiltinTool(
        "edit_file", "Edit file", "Replace unique pieces of a file's text with new text.", files.EditFile,
        partial(_on_host, files.edit_file), write=True,
    ),
)  # fmt: skip
NAMES = tuple(t.name for t in TOOLS)


def parse_tool_names(value: str) -> tuple[str, ...]:
    """--tools: `all` or comma-separated names (exact, unstripped, as llama-server reads them), in the
    fixed order; ValueError naming an unknown one and listing those available."""
    asked = value.split(",")
    for name in asked:
        if name != "all" and name not in NAMES:
            raise ValueError(f'unknown tool "{name}". available tools: {", ".join(NAMES)}')
    return NAMES if "all" in asked else tuple(n for n in NAMES if n in asked)


class BuiltinTools:
    """The enabled built-in tools and the context calls run in without a request's own."""

    def __init__(self, names: Sequence[str], defaults: ToolContext) -> None:
        self._tools = {t.name: t for t in TOOLS if t.name in names}
        self.defaults = defaults

    def tools(self) -> list[BuiltinTool]:
        return list(self._tools.values())

    def tool(self, name: str) -> BuiltinTool | None:
        return self._tools.get(name)

    async def call(
        self,
        tool: BuiltinTool,
        arguments: dict[str, Any],
        timeout_s: float | None,
        context: ToolContext | None,
    ) -> dict[str, Any]:
        """The tool's result, or `{"error": ...}` for its own failure. Invalid arguments raise pydantic's
        ValidationError (POST /tools answers 400; the tool loop tells the model)."""
        params = tool.params.model_validate(_without_context(arguments))
        if timeout_s is not None and isinstance(params, shell.ExecShellCommand):
            params.timeout = min(params.timeout, max(int(timeout_s), 1))
        try:
            async with asyncio.timeout(timeout_s):
                return await tool.run(params, context or self.defaults)
        except (ToolError, BadContext) as exc:  # BadContext: its folder went away since the request came
            return {"error": str(exc)}
        except TimeoutError:
            return {"error": f"tool '{tool.name}' timed out after {timeout_s:g} s"}


def _without_context(arguments: dict[str, Any]) -> dict[str, Any]:
    """A caller (the model) never chooses the context: cwd, runtime and resp_type come from headers."""
    return {k: v for k, v in arguments.items() if k not in ("cwd", "runtime", "resp_type")}
