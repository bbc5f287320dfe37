"""The MCP servers of one Llamba process: warm-up, tool calls, respawn after a crash, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from server.mcp.config import McpServerConfig
from server.mcp.jsonrpc import RpcError, RpcTimeout, TransportClosed
from server.mcp.registry import McpTool, ToolRegistry, result_text
from server.mcp.transport import StdioTransport

log = structlog.get_logger("mcp")

PROTOCOL_VERSION = "2025-06-18"
CLIENT_INFO = {"name": "llamba", "version": "0.1.0"}
# A server that cannot list its tools within this at start-up is skipped (its own timeout may be longer).
WARMUP_TIMEOUT_S = 10.0
MAX_LIST_PAGES = 100


class Unavailable(Exception):
    """The server is down and may not be respawned yet (cooldown), or Llamba is shutting down."""


@dataclass(frozen=True)
class ToolResult:
    text: str | None = None
    error: str | None = None
    data: dict[str, Any] | None = None  # a built-in tool's whole JSON result (its text is what a model reads)

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        return self.data if self.data is not None else {"plain_text_response": self.text or ""}


@dataclass
class _Server:
    config: McpServerConfig
    transport: StdioTransport | None = None
    last_spawn: float | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class McpManager:
    def __init__(
        self,
        configs: Sequence[McpServerConfig],
        *,
        warmup_timeout_s: float = WARMUP_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._servers = {c.name: _Server(c) for c in configs}
        self._warmup_timeout_s = warmup_timeout_s
        self._clock = clock
        self._registry = ToolRegistry()
        self._ready = asyncio.Event()
        self._warmup: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped: asyncio.Task[None] | None = None

    # -- life cycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Warm up in the background: the HTTP server answers meanwhile, /tools waits for the result."""
        if self._warmup is None:
            self._warmup = asyncio.get_running_loop().create_task(self._warm_up_all())

    async def wait_ready(self) -> None:
        await self._ready.wait()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def stop(self) -> None:
        """Stop every server (and its process group) at once; calls in flight fail fast. Idempotent."""
        if self._stopped is None:
            self._stopped = asyncio.get_running_loop().create_task(self._stop())
        await asyncio.shield(self._stopped)

    async def _stop(self) -> None:
        self._stopping = True
        if self._warmup is not None and not self._warmup.done():
            self._warmup.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._warmup
        transports = [s.transport for s in self._servers.values() if s.transport is not None]
        begin = self._clock()
        await asyncio.gather(*(t.close("Llamba is shutting down") for t in transports))
        if transports:
            log.info("mcp.stopped", servers=len(transports), seconds=round(self._clock() - begin, 3))
        self._ready.set()  # nobody waits forever on a warm-up that will not happen

    async def _warm_up_all(self) -> None:
        try:
            servers = list(self._servers.values())
            listed = await asyncio.gather(*(self._warm_up(s) for s in servers))
            # Registered in config order, whatever order the servers answered in: collisions are stable.
            for server, tools in zip(servers, listed, strict=True):
                if tools is not None:
                    added = self._registry.add_server(server.config.name, tools)
                    log.info("mcp.server_ready", server=server.config.name, tools=added)
        finally:
            self._ready.set()

    async def _warm_up(self, server: _Server) -> list[Any] | None:
        timeout_s = min(server.config.timeout_s, self._warmup_timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                transport = await self._spawn(server, timeout_s)
                tools = await _list_tools(transport, timeout_s)
        except Exception as exc:  # whatever went wrong, this server is skipped and the others go on
            stderr = server.transport.stderr_text() if server.transport else ""
            log.warning("mcp.warmup_failed", server=server.config.name, error=str(exc) or "timed out",
                        stderr=stderr or None)  # fmt: skip
            await self._discard(server)
            return None
        if not tools:
            await self._discard(server)  # nothing will ever call it
        return tools

    # -- tools --------------------------------------------------------------------------------------
    def tools(self) -> list[McpTool]:
        return self._registry.all()

    def tool(self, name: str) -> McpTool | None:
        return self._registry.get(name)

    def server_names(self) -> list[str]:
        """Every configured server, in config order (available or not)."""
        return list(self._servers)

    def server_tools(self, server: str) -> list[McpTool]:
        """The tools a server offers (empty for a server that failed to start, or an unknown name)."""
        return [t for t in self._registry.all() if t.server == server]

    async def call(
        self, tool: McpTool, arguments: dict[str, Any], timeout_s: float | None = None
    ) -> ToolResult:
        """Invoke a tool. Every failure of the server becomes an error result, never an exception.
        `timeout_s` may shorten the server's own timeout for this call, never lengthen it."""
        server = self._servers[tool.server]
        timeout_s = min(server.config.timeout_s, timeout_s or server.config.timeout_s)
        try:
            transport = await self._running(server)
            result = await transport.request(
                "tools/call", {"name": tool.tool, "arguments": arguments}, timeout_s=timeout_s
            )
        except RpcTimeout:
            return ToolResult(error=f"tool '{tool.name}' timed out after {round(timeout_s * 1000)} ms")
        except RpcError as exc:
            return ToolResult(error=f"tool '{tool.name}' failed: {exc.message}")
        except (TransportClosed, Unavailable, TimeoutError) as exc:
            return ToolResult(error=str(exc) or f"MCP server '{tool.server}' did not start in time")
        text, error = result_text(result)
        return ToolResult(text=text, error=error)

    async def _running(self, server: _Server) -> StdioTransport:
        """The server's live transport, respawning a dead one unless its cooldown forbids it."""
        transport = server.transport
        if transport is not None and transport.alive and not self._stopping:
            return transport
        async with server.lock:  # concurrent calls to a dead server respawn it once
            if self._stopping:
                raise Unavailable("Llamba is shutting down")
            transport = server.transport
            if transport is not None and transport.alive:
                return transport
            await self._discard(server)
            name, cooldown = server.config.name, server.config.restart_cooldown_s
            wait = (server.last_spawn or float("-inf")) + cooldown - self._clock()
            if wait > 0:
                raise Unavailable(f"MCP server '{name}' is down; it may be restarted in {wait:.1f} s")
            log.warning("mcp.server_respawn", server=name)
            try:
                async with asyncio.timeout(server.config.timeout_s):
                    return await self._spawn(server, server.config.timeout_s)
            except BaseException:
                await self._discard(server)  # never keep a server that did not finish its handshake
                raise

    async def _spawn(self, server: _Server, timeout_s: float) -> StdioTransport:
        """Start the process and run the MCP handshake: initialize, then notifications/initialized."""
        server.last_spawn = self._clock()
        transport = await StdioTransport.spawn(server.config)
        server.transport = transport
        if self._stopping:  # stop() began while the process was being created: it must not outlive us
            await self._discard(server)
            raise Unavailable("Llamba is shutting down")
        params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
        await transport.request("initialize", params, timeout_s=timeout_s)
        await transport.notify("notifications/initialized")
        return transport

    async def _discard(self, server: _Server) -> None:
        transport, server.transport = server.transport, None
        if transport is not None:
            await transport.close()


async def _list_tools(transport: StdioTransport, timeout_s: float) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await transport.request(
            "tools/list", {"cursor": cursor} if cursor else None, timeout_s=timeout_s
        )
        if not isinstance(page, dict) or not isinstance(page.get("tools", []), list):
            raise RpcError(None, "malformed tools/list result")
        tools.extend(page.get("tools", []))
        cursor = page.get("nextCursor")
        if not isinstance(cursor, str) or not cursor:
            break
    return tools
