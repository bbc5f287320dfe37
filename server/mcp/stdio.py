"""One stdio MCP server's session: the supervised process (server/mcp/transport.py), the MCP handshake,
its tools and calls, and its `notifications/tools/list_changed`.

The session offers what a remote one does (server/mcp/remote.py), so the manager treats both alike:
`start`, `alive`, `list_tools`, `call_tool`, `close`, and `detail` (the stderr tail, for the log).
Llamba keeps supervising stdio processes itself rather than through the SDK's `stdio_client`: that one
learns a server is gone only from EOF on its stdout, so a server that exits while a grandchild holds
its pipes leaves the handshake (or a call) waiting for its whole timeout, where the child watcher here
says at once that it exited and with which code; it also hands the child a reduced environment, sends
stderr to our stderr rather than keeping its tail, and takes 2 s + 2 s to stop a server that ignores
EOF on its stdin, where a SIGTERM to the process group comes after 0.3 s here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from server.mcp.config import McpServerConfig
from server.mcp.jsonrpc import RpcError, TransportClosed
from server.mcp.transport import StdioTransport

log = structlog.get_logger("mcp")

# The revision offered in `initialize`; a server answers with the one it speaks (any it picks is used:
# the messages Llamba sends, initialize, tools/list, tools/call, ping, are the same in every revision).
PROTOCOL_VERSION = "2025-11-25"
CLIENT_INFO = {"name": "llamba", "version": "0.1.0"}
MAX_LIST_PAGES = 100


class StdioSession:
    """A stdio server's process and its MCP session."""

    def __init__(self, config: McpServerConfig, on_tools_changed: Callable[[], None] | None = None) -> None:
        self.config, self.name = config, config.name
        self.protocol_version: str | None = None
        self.transport: StdioTransport | None = None
        self._on_tools_changed = on_tools_changed

    @property
    def alive(self) -> bool:
        return self.transport is not None and self.transport.alive

    def detail(self) -> str:
        return self.transport.stderr_text() if self.transport is not None else ""

    async def start(self) -> None:
        """Spawn the process and run the handshake: initialize, then notifications/initialized."""
        transport = self.transport = await StdioTransport.spawn(self.config)
        transport.rpc.on_notification = self._on_notification
        params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
        result = await transport.request("initialize", params, timeout_s=self.config.timeout_s)
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        self.protocol_version = version if isinstance(version, str) else None
        await transport.notify("notifications/initialized")

    async def close(self, reason: str = "MCP server stopped") -> None:
        if self.transport is not None:
            await self.transport.close(reason)

    def _on_notification(self, message: dict[str, Any]) -> None:
        if message.get("method") == "notifications/tools/list_changed":
            log.info("mcp.tools_changed", server=self.name)
            if self._on_tools_changed is not None:
                self._on_tools_changed()

    async def list_tools(self, timeout_s: float) -> list[Any]:
        tools: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await self._rpc().request(
                "tools/list", {"cursor": cursor} if cursor else None, timeout_s=timeout_s
            )
            if not isinstance(page, dict) or not isinstance(page.get("tools", []), list):
                raise RpcError(None, "malformed tools/list result")
            tools.extend(page.get("tools", []))
            cursor = page.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        return await self._rpc().request(
            "tools/call", {"name": name, "arguments": arguments}, timeout_s=timeout_s
        )

    def _rpc(self) -> StdioTransport:
        if self.transport is None:
            raise TransportClosed(f"MCP server '{self.name}': not running")
        return self.transport
