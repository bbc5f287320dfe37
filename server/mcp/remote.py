"""One session with a remote MCP server (Streamable HTTP, or HTTP+SSE) through the official `mcp` SDK.

The SDK's transports are anyio task groups that must be entered and left by one task, so each session
has an owner task that opens the SDK's `Client`, holds it open and closes it; calls come from the
request handlers' tasks and are raced against the session's loss: when the connection breaks, the
owner's task group ends, and every call in flight fails at once with the reason (a call never waits
on a session that is gone). What the SDK gives this side:

- protocol version negotiation (`mode="auto"`): a `server/discover` probe at 2026-07-28, and a
  server that does not speak it gets the `initialize` handshake offering 2025-11-25 and accepting what
  the server counters with (2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25);
- messages: a message that is not JSON-RPC ends the session (the calls in flight fail at once);
- `notifications/tools/list_changed`: on handshake-era sessions the server sends it on its own; on
  2026 ones it comes through a `subscriptions/listen` stream this session keeps open. Either way
  `on_tools_changed` is called (the manager lists the tools again);
- redirects only within the endpoint's origin (the SDK's rule); a client-named server goes through
  server/mcp/egress.py, which checks every request and every redirect.

Faults are told as the stdio transport tells them (server/mcp/jsonrpc.py's exceptions): no answer in
time is RpcTimeout (the session is kept); a JSON-RPC error from the server is RpcError; a dropped
connection, an error status, an answer that is not JSON-RPC or a malformed result is TransportClosed
and ends the session, so the next call connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as types
import structlog
from mcp.client import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from server.mcp.config import McpServerConfig
from server.mcp.egress import HostPolicy, HostRefused, shown_url
from server.mcp.guard import EgressRecord, guarded_client
from server.mcp.jsonrpc import RpcError, RpcTimeout, TransportClosed

log = structlog.get_logger("mcp")

CLIENT_INFO = types.Implementation(name="llamba", version="0.1.0")
# JSON-RPC codes the SDK's transports make up for a broken exchange (not a server's considered answer):
# connection closed, invalid request ("Session terminated", an unexpected content type, a redirect not
# followed), internal error (an HTTP error status), parse error (a body that is not JSON-RPC).
BROKEN_CODES = frozenset({-32000, -32600, -32603, -32700})
CLOSE_GRACE_S = 2.0
T = TypeVar("T")


class RemoteSession:
    """A live session with one remote server. `start()` connects (raises on failure, the reason in
    the message; HostRefused when the egress guard refused a request or a redirect)."""

    def __init__(
        self,
        config: McpServerConfig,
        *,
        policy: HostPolicy | None = None,
        on_tools_changed: Callable[[], None] | None = None,
    ) -> None:
        assert config.url is not None
        # The URL as logs and messages show it: without a query or credentials, which may hold secrets.
        self.config, self.name, self.url = config, config.name, shown_url(config.url)
        self.protocol_version: str | None = None
        self.dead: str | None = None
        self._policy = policy
        self._egress = EgressRecord()
        self._on_tools_changed = on_tools_changed
        self._client: Client | None = None
        self._http_error: str | None = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._lost = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.dead is None and self._client is not None and not self._lost.is_set()

    def detail(self) -> str:
        return ""  # a remote server has no stderr to show

    # -- life cycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and negotiate, within the server's connect_timeout_ms."""
        self._owner = asyncio.get_running_loop().create_task(self._own(), name=f"mcp:{self.name}")
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                await asyncio.shield(self._ready)
        except TimeoutError:
            await self.close("did not connect in time")
            raise RpcTimeout(
                f"MCP server '{self.name}' ({self.url}) did not complete the MCP handshake within "
                f"{self.config.connect_timeout_s:g} s"
            ) from None
        except BaseException:
            await self.close("could not connect")
            raise
        log.info("mcp.remote_connected", server=self.name, url=self.url, transport=self.config.transport,
                 protocol=self.protocol_version)  # fmt: skip

    async def close(self, reason: str = "MCP server stopped") -> None:
        """End the session (bounded: an owner that does not leave in time is cancelled)."""
        self.dead = self.dead or reason
        self._stop.set()
        owner = self._owner
        if owner is None or owner.done():
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            async with asyncio.timeout(CLOSE_GRACE_S):
                await asyncio.shield(owner)
        if not owner.done():
            owner.cancel()
            with contextlib.suppress(BaseException):
                await owner

    async def _own(self) -> None:
        """The owner task: the SDK's client is entered, held and left here."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(
                    Client(
                        await sdk_transport(self.config, stack, self._http_client),
                        mode="auto",
                        cache=None,
                        client_info=CLIENT_INFO,
                        message_handler=self._on_message,
                    )  # fmt: skip
                )
                self._client, self.protocol_version = client, client.protocol_version
                async with anyio.create_task_group() as group:
                    if client.protocol_version in MODERN_PROTOCOL_VERSIONS and self._on_tools_changed:
                        group.start_soon(self._listen, client)
                    self._ready.set_result(None)
                    await self._stop.wait()
                    group.cancel_scope.cancel()
        except BaseException as exc:  # the connection broke, or could not be made
            reason = self._reason(exc)
            if not self._ready.done():
                self._ready.set_exception(self._failure(reason))
            elif not self._stop.is_set():
                log.warning("mcp.remote_lost", server=self.name, url=self.url, error=reason)
            self.dead = self.dead or reason
            if isinstance(exc, asyncio.CancelledError) and not self._stop.is_set():
                raise  # cancelled from outside (the loop is ending): not a connection fault
        finally:
            self.dead = self.dead or "connection closed"
            self._lost.set()
            if not self._ready.done():
                self._ready.set_exception(TransportClosed(f"MCP server '{self.name}': {self.dead}"))

    def _http_client(self, **_: Any) -> httpx2.AsyncClient:
        """The HTTP client of one connection, whatever the SDK asks for: the server's headers, no read
        timeout (calls have their own), the egress guard for a client-named server."""
        headers, timeout = dict(self.config.headers), httpx2.Timeout(self.config.connect_timeout_s, read=None)
        if self._policy is not None:
            made = guarded_client(self._policy, self._egress, headers, timeout)
        else:
            made = httpx2.AsyncClient(headers=headers, timeout=timeout)
        made.event_hooks["response"].append(self._on_response)
        return made

    async def _on_response(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self._http_error = f"HTTP {response.status_code} {response.reason_phrase}".strip()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            # Garbage on the stream (or the transport's own fault): no call can be told it was its
            # answer, so the session ends and every call in flight fails now, not at its timeout.
            said = self._reason(message).splitlines()[0][:200]
            garbage = isinstance(message, ValueError)  # pydantic's ValidationError is one
            what = "sent a message that is not JSON-RPC" if garbage else "connection lost"
            reason = f"{what} ({said})"
            log.warning("mcp.remote_bad_message", server=self.name, error=reason)
            self.dead = self.dead or reason
            self._stop.set()
        elif getattr(message, "method", None) == "notifications/tools/list_changed":
            log.info("mcp.tools_changed", server=self.name)
            if self._on_tools_changed is not None:
                self._on_tools_changed()

    async def _listen(self, client: Client) -> None:
        """Keep a 2026 session's `subscriptions/listen` stream open: its tools/list_changed
        notifications reach `_on_message`. A stream that breaks means the connection did."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _ in subscription:
                    pass
        except Exception as exc:
            if not self._stop.is_set():
                self.dead = self.dead or f"connection lost ({self._reason(exc)})"
                self._stop.set()

    # -- calls ----------------------------------------------------------------------------------------
    async def list_tools(self, timeout_s: float) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(100):
            page = await self._run(lambda c, at=cursor: c.list_tools(cursor=at), "tools/list", timeout_s)
            tools += [tool.model_dump(by_alias=True, mode="json", exclude_none=True) for tool in page.tools]
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        result = await self._run(lambda c: c.call_tool(name, arguments), "tools/call", timeout_s)
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    async def _run(self, make: Callable[[Client], Awaitable[T]], method: str, timeout_s: float) -> T:
        """One SDK call, raced against the session's loss, under `timeout_s`."""
        client = self._client
        if client is None or not self.alive:
            raise TransportClosed(f"MCP server '{self.name}': {self.dead or 'not connected'}")
        try:
            call = await raced(make(client), self._lost, timeout_s)
        except TimeoutError:
            raise RpcTimeout(
                f"MCP server '{self.name}' did not answer {method} within {timeout_s:g} s"
            ) from None
        if call is None:
            raise TransportClosed(self._lost_during(method, self.dead or "connection lost"))
        try:
            return call.result()
        except MCPError as exc:
            if exc.code not in BROKEN_CODES:
                raise RpcError(exc.code, exc.message, exc.data) from None
            reason = with_status(exc.message.splitlines()[0], self._http_error)
        except ValidationError as exc:
            reason = f"answered {method} with a malformed result ({exc.errors()[0]['msg']})"
        except Exception as exc:  # the transport's own failure (a dropped connection, ...)
            reason = self._reason(exc)
        reason = self.dead or reason  # a loss seen first (garbage on the stream) says more
        await self.close(reason)
        raise TransportClosed(self._lost_during(method, reason))

    def _lost_during(self, method: str, reason: str) -> str:
        return f"MCP server '{self.name}' failed during {method}: {reason}; the next call connects again"

    def _reason(self, exc: BaseException) -> str:
        return describe(exc, self._http_error)

    def _failure(self, reason: str) -> Exception:
        if self._egress.refused is not None:
            return HostRefused(self._egress.refused)
        return TransportClosed(f"MCP server '{self.name}' ({self.url}): cannot connect: {reason}")


async def sdk_transport(
    config: McpServerConfig, stack: contextlib.AsyncExitStack, http_client: Callable[..., httpx2.AsyncClient]
) -> Any:
    """The SDK's transport for a server, over our HTTP client (the SSE transport makes it itself)."""
    if config.transport == "sse":
        return sse_client(config.url or "", httpx_client_factory=http_client)
    client = await stack.enter_async_context(http_client())
    return streamable_http_client(config.url or "", http_client=client)


async def raced(call: Awaitable[T], lost: asyncio.Event, timeout_s: float) -> asyncio.Future[T] | None:
    """The call, done, unless `lost` came first (None) or `timeout_s` passed (TimeoutError); a call
    left behind is cancelled (the SDK then tells the server: notifications/cancelled)."""
    task = asyncio.ensure_future(call)
    loss = asyncio.ensure_future(lost.wait())
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.wait({task, loss}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loss.cancel()
        if not task.done():
            task.cancel()
            task.add_done_callback(_retrieve)
    return task if task.done() else None


def describe(exc: BaseException, http_error: str | None) -> str:
    """What went wrong, in a line: the first real failure inside nested exception groups."""
    leaf = next(_leaves(exc), exc)
    if isinstance(leaf, MCPError):
        return with_status(leaf.message, http_error)
    if isinstance(leaf, httpx2.HTTPStatusError):
        return f"HTTP {leaf.response.status_code} {leaf.response.reason_phrase}".strip()
    if isinstance(leaf, asyncio.CancelledError):
        return "closed"
    return with_status(f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__, http_error)


def with_status(message: str, http_error: str | None) -> str:
    """The message, and the HTTP error status seen on the connection when it does not say it."""
    return f"{message} ({http_error})" if http_error and http_error not in message else message


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """The innermost exceptions of nested exception groups, the first real one first."""
    if isinstance(exc, BaseExceptionGroup):
        found = [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
        cancelled = (asyncio.CancelledError, anyio.get_cancelled_exc_class())
        real = [leaf for leaf in found if not isinstance(leaf, cancelled)]
        yield from real or found
    else:
        yield exc


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
