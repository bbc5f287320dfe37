"""The tools MCP servers offer, under the names Llamba exposes them with (`<server>_<tool>`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from server.mcp.config import McpServerConfig

log = structlog.get_logger("mcp")

# What OpenAI accepts as a function name: a tool we list must be usable as-is in `tools[]`.
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class McpTool:
    name: str  # exposed: <server>_<tool>
    server: str
    tool: str  # the name the MCP server knows it by
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    title: str | None = None
    read_only: bool = False
    # A client-named server's tool (a request's `server_url`): where to call it, with its headers.
    remote: McpServerConfig | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """One entry of GET /tools (llama-server's shape); `definition` is an OpenAI `tools[]` entry."""
        return {
            "tool": self.name,
            "display_name": self.title or self.name,
            "type": "mcp",
            # Llamba's: the server it belongs to (a chat's `mcp` tool names it as server_label).
            "server": self.server,
            # MCP tools run arbitrary code: only a server's explicit read-only hint clears `write`.
            "permissions": {"write": not self.read_only},
            "uses_cwd": False,  # llama-server's: x-tool-cwd is for the built-in tools only
            "definition": {
                "type": "function",
                "function": {
                    "name": self.name,
                    "description": self.description,
                    "parameters": self.parameters,
                },
            },
        }


def parse_tool(server: str, raw: Any, remote: McpServerConfig | None = None) -> McpTool | None:
    """An entry of a `tools/list` result, or None (logged) when it cannot be exposed."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        log.warning("mcp.tool_skipped", server=server, reason="entry without a name", entry=str(raw)[:200])
        return None
    name = f"{server}_{raw['name']}"
    if not FUNCTION_NAME.match(name):
        log.warning("mcp.tool_skipped", server=server, tool=name, reason="not a valid function name")
        return None
    schema = raw.get("inputSchema")
    annotations = raw.get("annotations") if isinstance(raw.get("annotations"), dict) else {}
    title = raw.get("title") or annotations.get("title")
    return McpTool(
        name=name,
        server=server,
        tool=raw["name"],
        description=str(raw.get("description") or ""),
        parameters=schema if isinstance(schema, dict) else {"type": "object", "properties": {}},
        title=title if isinstance(title, str) else None,
        read_only=annotations.get("readOnlyHint") is True,
        remote=remote,
    )


class ToolRegistry:
    """Tools by exposed name. A name already taken is skipped with a warning, never overwritten."""

    def __init__(self) -> None:
        self._tools: dict[str, McpTool] = {}

    @classmethod
    def of(cls, listed: Iterable[tuple[str, list[Any]]]) -> ToolRegistry:
        """The registry of the servers' listings, in the order given (the first of two names wins)."""
        registry = cls()
        for server, raw_tools in listed:
            registry.add_server(server, raw_tools)
        return registry

    def add_server(self, server: str, raw_tools: list[Any]) -> int:
        added = 0
        for raw in raw_tools:
            tool = parse_tool(server, raw)
            if tool is None:
                continue
            if tool.name in self._tools:
                owner = self._tools[tool.name].server
                log.warning("mcp.tool_collision", tool=tool.name, server=server, kept_from=owner)
                continue
            self._tools[tool.name] = tool
            added += 1
        return added

    def get(self, name: str) -> McpTool | None:
        return self._tools.get(name)

    def all(self) -> list[McpTool]:
        return list(self._tools.values())


def result_text(result: Any) -> tuple[str | None, str | None]:
    """(text, error) from a `tools/call` result: its text content, or the error it reports."""
    if not isinstance(result, dict):
        return None, "the MCP server sent a malformed tools/call result"
    parts = [_content_text(item) for item in result.get("content") or [] if isinstance(item, dict)]
    if not parts and "structuredContent" in result:
        parts.append(json.dumps(result["structuredContent"], ensure_ascii=False))
    text = "\n".join(parts)
    if result.get("isError") is True:
        return None, text or "the tool reported an error"
    return text, None


def _content_text(item: dict[str, Any]) -> str:
    kind = item.get("type")
    if kind == "text":
        return str(item.get("text", ""))
    resource = item.get("resource")
    if kind == "resource" and isinstance(resource, dict) and "text" in resource:
        return str(resource["text"])
    return f"[{kind} content not shown]"
