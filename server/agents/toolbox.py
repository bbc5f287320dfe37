"""Every tool this server runs itself: the built-in ones (`--tools`) and the MCP servers' tools, behind
the one interface /tools and the server-side tool loop (server/agents/loop.py) use.

Built-in tools come first; an MCP tool whose name a built-in one already has is left out (llama-server's
order and rule). In a chat's `mcp` tool the built-in tools are server_label "builtin".
"""

from __future__ import annotations

import json
from typing import Any

from server.builtin_tools import BUILTIN_LABEL, BuiltinTool, BuiltinTools, ToolContext
from server.mcp import HostRefused, McpManager, McpServerConfig, McpTool, ToolResult

Tool = McpTool | BuiltinTool


class Toolbox:
    def __init__(self, mcp: McpManager | None, builtin: BuiltinTools | None) -> None:
        self.mcp, self.builtin = mcp, builtin

    # -- life cycle (the MCP servers') ------------------------------------------------------------------
    def start(self) -> None:
        if self.mcp is not None:
            self.mcp.start()

    async def stop(self) -> None:
        if self.mcp is not None:
            await self.mcp.stop()

    async def wait_ready(self) -> None:
        if self.mcp is not None:
            await self.mcp.wait_ready()

    @property
    def ready(self) -> bool:
        return self.mcp is None or self.mcp.ready

    # -- tools ----------------------------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        builtin: list[Tool] = list(self.builtin.tools()) if self.builtin else []
        taken = {t.name for t in builtin}
        mcp = [t for t in (self.mcp.tools() if self.mcp else []) if t.name not in taken]
        return [*builtin, *mcp]

    def tool(self, name: str) -> Tool | None:
        found = self.builtin.tool(name) if self.builtin else None
        return found or (self.mcp.tool(name) if self.mcp else None)

    def server_names(self) -> list[str]:
        """The labels a chat's `mcp` tool may name: "builtin" (with --tools, which then hides an MCP
        server of that name), then the MCP servers."""
        mcp = self.mcp.server_names() if self.mcp else []
        return [BUILTIN_LABEL, *(n for n in mcp if n != BUILTIN_LABEL)] if self.builtin else mcp

    def server_tools(self, server: str) -> list[Tool]:
        return [t for t in self.tools() if t.server == server]

    async def list_named(self, config: McpServerConfig) -> list[McpTool]:
        """The tools of a server a request names by URL (--mcp-allow-hosts; HostRefused without it)."""
        if self.mcp is None:
            raise HostRefused(
                "this server connects to no client-named MCP server (--mcp-allow-hosts is not set)"
            )
        return await self.mcp.list_named(config)

    async def call(
        self, tool: Tool, arguments: dict[str, Any], timeout_s: float | None = None,
        context: ToolContext | None = None,
    ) -> ToolResult:  # fmt: skip
        """Invoke a tool; every failure is an error result. `context` is the built-in tools' (None: the
        server's defaults); bad arguments to a built-in tool raise pydantic's ValidationError."""
        if isinstance(tool, McpTool):
            assert self.mcp is not None
            return await self.mcp.call(tool, arguments, timeout_s)
        assert self.builtin is not None
        data = await self.builtin.call(tool, arguments, timeout_s, context)
        if "error" in data:
            return ToolResult(error=str(data["error"]))
        text = data.get("plain_text_response")
        return ToolResult(text=text if isinstance(text, str) else json.dumps(data), data=data)
