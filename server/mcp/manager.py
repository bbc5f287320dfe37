"""The MCP servers of one Llamba process: warm-up, tool calls, restart (or reconnection) after a fault,
tool lists kept current, shutdown; and the client-named servers of single requests.

A configured server is a stdio process (server/mcp/stdio.py) or a remote server (server/mcp/remote.py);
the manager treats both alike. A server that crashes, drops its connection or answers garbage fails
the calls in flight with an error result, and the next call starts (or connects) it again at once, as
llama-server restarts a crashed server. Only a server that keeps crashing waits (`restart_delay`): each
restart of a server that ran less than RESTART_WINDOW_S since its last start doubles the wait, from its
restart cooldown (`restart_cooldown_ms`, 5 s for stdio) up to MAX_BACKOFF_S; one that ran longer starts
again at once. `notifications/tools/list_changed`, and any restart, make the
manager list the server's tools again.

A client-named server (a request's `server_url`, allowed by `--mcp-allow-hosts`: server/mcp/egress.py)
gets a connection of its own for each operation, listing its tools or calling one, closed after it:
its headers are the request's, and no session outlives the request that named it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from server.mcp.config import McpServerConfig
from server.mcp.egress import HostPolicy, HostRefused
from server.mcp.jsonrpc import RpcError, RpcTimeout, TransportClosed
from server.mcp.registry import McpTool, ToolRegistry, parse_tool, result_text
from server.mcp.stdio import StdioSession

if TYPE_CHECKING:
    from server.mcp.remote import RemoteSession

    Session = StdioSession | RemoteSession

log = structlog.get_logger("mcp")

# A server that cannot list its tools within this at start-up is skipped (its own timeout may be longer).
WARMUP_TIMEOUT_S = 10.0


class Unavailable(Exception):
    """The server is down and may not be respawned yet (cooldown), or Llamba is shutting down."""


# A server that crashes within this many seconds of its start crashed "again": its next restart backs off.
RESTART_WINDOW_S = 30.0
MAX_BACKOFF_S = 60.0


def restart_delay(quick_restarts: int, cooldown_s: float) -> float:
    """Seconds a dead server waits after its last start: none after one crash (llama-server restarts it
    at once), then the cooldown doubling with each restart that came within RESTART_WINDOW_S."""
    if quick_restarts == 0:
        return 0.0
    return min(cooldown_s * 2 ** (quick_restarts - 1), MAX_BACKOFF_S)


# What listing or calling a server can fail with, besides HostRefused (a URL the policy refuses).
MCP_FAILURES = (TransportClosed, RpcTimeout, RpcError, Unavailable, TimeoutError)


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
    session: Session | None = None
    last_spawn: float | None = None
    quick_restarts: int = 0  # restarts in a row, each within RESTART_WINDOW_S of the start before
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tools: list[Any] = field(default_factory=list)  # its last tools/list
    stale: bool = False  # the tools changed since they were listed
    refresh: asyncio.Task[None] | None = None


def count_restart(server: _Server, now: float) -> None:
    """Count this restart of a dead server, or refuse it (Unavailable) while its back-off lasts."""
    if server.last_spawn is None:
        return
    ran = now - server.last_spawn
    if ran >= RESTART_WINDOW_S:  # it ran a while: a crash of its own, not a crash loop
        server.quick_restarts = 0
    wait = restart_delay(server.quick_restarts, server.config.restart_cooldown_s) - ran
    if wait > 0:
        name = server.config.name
        raise Unavailable(f"MCP server '{name}' is down; it may be restarted in {wait:.1f} s")
    server.quick_restarts += 1


def new_session(config: McpServerConfig, **kwargs: Any) -> Session:
    """The session kind of a server; the SDK is loaded only once a remote server is used."""
    if not config.remote:
        return StdioSession(config, kwargs.get("on_tools_changed"))
    from server.mcp.remote import RemoteSession

    return RemoteSession(config, **kwargs)


class McpManager:
    def __init__(
        self,
        configs: Sequence[McpServerConfig],
        *,
        policy: HostPolicy | None = None,
        warmup_timeout_s: float = WARMUP_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._servers = {c.name: _Server(c) for c in configs}
        self.policy = policy or HostPolicy()
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
        tasks = [s.refresh for s in self._servers.values() if s.refresh is not None]
        for task in [self._warmup, *tasks]:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        sessions = [s.session for s in self._servers.values() if s.session is not None]
        begin = self._clock()
        await asyncio.gather(*(s.close("Llamba is shutting down") for s in sessions))
        if sessions:
            log.info("mcp.stopped", servers=len(sessions), seconds=round(self._clock() - begin, 3))
        self._ready.set()  # nobody waits forever on a warm-up that will not happen

    async def _warm_up_all(self) -> None:
        try:
            servers = list(self._servers.values())
            listed = await asyncio.gather(*(self._warm_up(s) for s in servers))
            for server, tools in zip(servers, listed, strict=True):
                server.tools = tools or []
            self._rebuild()
            for server in servers:
                if server.tools:
                    name = server.config.name
                    log.info("mcp.server_ready", server=name, tools=len(self.server_tools(name)))
        finally:
            self._ready.set()

    async def _warm_up(self, server: _Server) -> list[Any] | None:
        timeout_s = min(server.config.start_timeout_s, self._warmup_timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                session = await self._spawn(server)
                tools = await session.list_tools(server.config.timeout_s)
        except Exception as exc:  # whatever went wrong, this server is skipped and the others go on
            detail = server.session.detail() if server.session else ""
            log.warning("mcp.warmup_failed", server=server.config.name, error=str(exc) or "timed out",
                        stderr=detail or None)  # fmt: skip
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

    def _rebuild(self) -> None:
        """The registry from every server's last listing, in config order (collisions stay stable)."""
        self._registry = ToolRegistry.of((s.config.name, s.tools) for s in self._servers.values())

    def _tools_changed(self, server: _Server) -> None:
        """The server's tools changed (or it was restarted): list them again, in the background; a
        change announced during a listing makes one more."""
        server.stale = True
        if not self._stopping and (server.refresh is None or server.refresh.done()):
            server.refresh = asyncio.get_running_loop().create_task(self._refresh(server))

    async def _refresh(self, server: _Server) -> None:
        while server.stale and not self._stopping:
            server.stale = False
            session = server.session
            if session is None or not session.alive:
                return
            try:
                tools = await session.list_tools(server.config.timeout_s)
            except Exception as exc:
                log.warning("mcp.refresh_failed", server=server.config.name, error=str(exc) or "timed out")
                return
            server.tools = tools
            self._rebuild()
            name = server.config.name
            log.info("mcp.tools_listed", server=name, tools=len(self.server_tools(name)))

    # -- calls ----------------------------------------------------------------------------------------
    async def call(
        self, tool: McpTool, arguments: dict[str, Any], timeout_s: float | None = None
    ) -> ToolResult:
        """Invoke a tool. Every failure of the server becomes an error result, never an exception.
        `timeout_s` may shorten the server's own timeout for this call, never lengthen it."""
        config = tool.remote or self._servers[tool.server].config
        timeout_s = min(config.timeout_s, timeout_s or config.timeout_s)

        async def configured() -> Any:
            session = await self._running(self._servers[tool.server])
            return await session.call_tool(tool.tool, arguments, timeout_s)

        async def named(session: Session) -> Any:
            return await session.call_tool(tool.tool, arguments, timeout_s)

        call = configured() if tool.remote is None else once(self.policy, config, named)
        return await _outcome(tool, timeout_s, call)

    async def list_named(self, config: McpServerConfig) -> list[McpTool]:
        """The tools of a client-named server, over a connection of their own. Raises HostRefused
        (before any connection) when the policy refuses its URL, and one of MCP_FAILURES when it
        cannot be listed."""

        async def listing(session: Session) -> list[Any]:
            return await session.list_tools(config.timeout_s)

        raw = await once(self.policy, config, listing)
        return [t for t in (parse_tool(config.name, entry, remote=config) for entry in raw) if t is not None]

    async def _running(self, server: _Server) -> Session:
        """The server's live session, restarting (reconnecting) a dead one unless its cooldown forbids."""
        session = server.session
        if session is not None and session.alive and not self._stopping:
            return session
        async with server.lock:  # concurrent calls to a dead server restart it once
            if self._stopping:
                raise Unavailable("Llamba is shutting down")
            session = server.session
            if session is not None and session.alive:
                return session
            await self._discard(server)
            count_restart(server, self._clock())
            log.warning("mcp.server_respawn", server=server.config.name, quick_restarts=server.quick_restarts)
            try:
                async with asyncio.timeout(server.config.start_timeout_s):
                    session = await self._spawn(server)
            except BaseException:
                await self._discard(server)  # never keep a server that did not finish its handshake
                raise
            self._tools_changed(server)  # it may offer other tools now
            return session

    async def _spawn(self, server: _Server) -> Session:
        """Start the process (or connect) and run the MCP handshake."""
        server.last_spawn = self._clock()
        changed = lambda: self._tools_changed(server)  # noqa: E731
        session = server.session = new_session(server.config, on_tools_changed=changed)
        await session.start()
        if self._stopping:  # stop() began meanwhile: the session must not outlive us
            await self._discard(server)
            raise Unavailable("Llamba is shutting down")
        return session

    async def _discard(self, server: _Server) -> None:
        session, server.session = server.session, None
        if session is not None:
            await session.close()


async def once(
    policy: HostPolicy, config: McpServerConfig, operation: Callable[[Session], Awaitable[Any]]
) -> Any:
    """One operation on a client-named server: the URL checked (and its host resolved) first, then a
    connection made through the egress guard, used, and closed."""
    await policy.resolve(*policy.check_url(config.url or ""))
    session = new_session(config, policy=policy)
    try:
        await session.start()
        return await operation(session)
    finally:
        await session.close("done")


async def _outcome(tool: McpTool, timeout_s: float, call: Awaitable[Any]) -> ToolResult:
    """A tools/call's result, or its failure as an error result."""
    try:
        result = await call
    except RpcTimeout:
        return ToolResult(error=f"tool '{tool.name}' timed out after {round(timeout_s * 1000)} ms")
    except RpcError as exc:
        return ToolResult(error=f"tool '{tool.name}' failed: {exc.message}")
    except (TransportClosed, Unavailable, TimeoutError, HostRefused) as exc:
        return ToolResult(error=str(exc) or f"MCP server '{tool.server}' did not start in time")
    text, error = result_text(result)
    return ToolResult(text=text, error=error)
