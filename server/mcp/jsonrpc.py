"""JSON-RPC 2.0 over line-delimited JSON: framing, ids, and replies matched to the calls that wait for them.

This side knows nothing of processes: it writes to the pipe it is given and is fed the bytes read from the
other end (server/mcp/transport.py spawns, watches and stops the process). Its rules:

- replies are matched by id through a table of pending futures; a reply nobody waits for (its call timed
  out) is dropped, a notification (no id) is never taken for a reply, and `id: 0` is an id like any other;
- a call that times out or is cancelled is cancelled on the server too (`notifications/cancelled`);
- requests from the server are answered: `ping`, and an error for everything else; notifications are
  kept (the newest few) and handed to `on_notification`;
- a write waits while the pipe is full (back-pressure), under the call's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("mcp")

MAX_LINE_BYTES = 16 * 1024 * 1024


class TransportClosed(Exception):
    """The server is gone (exited, closed a pipe, or is being stopped)."""


class RpcTimeout(Exception):
    """No reply within the call's timeout; the server itself may be fine."""


class RpcError(Exception):
    """The server answered with a JSON-RPC error."""

    def __init__(self, code: int | None, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    @classmethod
    def from_reply(cls, error: Any) -> RpcError:
        if isinstance(error, dict):
            code = error.get("code")
            return cls(
                code if isinstance(code, int) else None, str(error.get("message", error)), error.get("data")
            )
        return cls(None, str(error))


class LineFramer:
    """Bytes in, complete lines out: several messages may come in one read, one message over many reads.

    A line longer than `max_line` is dropped whole (up to its newline) so a child that never writes a
    newline cannot grow the buffer without bound.
    """

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self._max_line = max_line
        self._skipping = False
        self.dropped = 0

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        lines: list[bytes] = []
        start = 0
        while (newline := self._buf.find(b"\n", start)) >= 0:
            line = bytes(self._buf[start:newline]).strip()
            start = newline + 1
            if self._skipping:
                self._skipping = False
            elif line:
                lines.append(line)
        del self._buf[:start]
        if len(self._buf) > self._max_line:
            self._buf.clear()
            self._skipping = True
            self.dropped += 1
        return lines


class RpcChannel:
    """The JSON-RPC conversation with one server: `stdin` is written, `feed` takes what its stdout said.

    `is_alive` says whether the process side can still carry a call; once `fail` has run, every call
    fails with its reason.
    """

    def __init__(self, name: str, is_alive: Callable[[], bool], *, max_unsolicited: int = 256) -> None:
        self.name = name
        self.unsolicited: deque[dict[str, Any]] = deque(maxlen=max_unsolicited)
        self.unsolicited_dropped = 0
        self.stdin: asyncio.WriteTransport | None = None
        self.stdin_lost = False
        self.dead: str | None = None
        # Called with each notification the server sends (server/mcp/stdio.py: tools/list_changed).
        self.on_notification: Callable[[dict[str, Any]], None] | None = None
        self._is_alive = is_alive
        self._stdout = LineFramer()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0  # the first request carries id 0 on purpose: it is a valid id
        self._writable = asyncio.Event()
        self._writable.set()

    # -- the pipe's state -----------------------------------------------------------------------------
    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def lose_stdin(self) -> None:
        """The server can no longer hear us: writers waiting on back-pressure wake up and fail."""
        self.stdin_lost = True
        self._writable.set()

    def fail(self, reason: str) -> None:
        """Mark the channel dead and fail every waiting call with the reason."""
        if self.dead is None:
            self.dead = reason
        self._writable.set()  # wake writers waiting on back-pressure: there is nobody to write to
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(TransportClosed(f"MCP server '{self.name}': {self.dead}"))

    # -- calls --------------------------------------------------------------------------------------
    async def request(
        self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0
    ) -> Any:
        """Send a request, await its reply (matched by id). Raises RpcError, RpcTimeout, TransportClosed."""
        if not self._is_alive():
            raise TransportClosed(f"MCP server '{self.name}': {self.dead or 'not running'}")
        request_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            async with asyncio.timeout(timeout_s):
                await self._send(message)
                return await future
        except TimeoutError:
            if method != "initialize":  # the spec forbids cancelling initialize
                self._cancel_remote(request_id, "timeout")
            raise RpcTimeout(
                f"MCP server '{self.name}' did not answer {method} within {timeout_s:g} s"
            ) from None
        except asyncio.CancelledError:
            self._cancel_remote(request_id, "cancelled by the client")
            raise
        finally:
            self._pending.pop(request_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # seen: a failure that raced another one is not "never retrieved"
            future.cancel()

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    def _cancel_remote(self, request_id: int, reason: str) -> None:
        """Tell the server to stop working on a request we no longer wait for (best effort)."""
        if self._is_alive() and self._pending.pop(request_id, None) is not None:
            with contextlib.suppress(TransportClosed):
                self._write({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": request_id, "reason": reason}})  # fmt: skip

    async def _send(self, message: dict[str, Any]) -> None:
        self._write(message)
        # Back-pressure: a child that stops reading its stdin makes us wait here (under the call's timeout).
        await self._writable.wait()
        if self.stdin_lost:
            raise TransportClosed(f"MCP server '{self.name}': {self.dead or 'stopped reading its stdin'}")

    def _write(self, message: dict[str, Any]) -> None:
        stdin = self.stdin
        if stdin is None or stdin.is_closing() or self.dead is not None:
            raise TransportClosed(f"MCP server '{self.name}': {self.dead or 'stdin closed'}")
        # json.dumps escapes control characters, so the line holds no raw newline.
        stdin.write(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")

    # -- what the server said -----------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Bytes read from the server's stdout: each complete line is one message (or a batch)."""
        dropped = self._stdout.dropped
        for line in self._stdout.feed(data):
            self._on_line(line)
        if self._stdout.dropped != dropped:
            log.warning("mcp.line_too_long", server=self.name, limit=MAX_LINE_BYTES)

    def _on_line(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            log.warning("mcp.non_json_line", server=self.name, line=line[:200].decode(errors="replace"))
            return
        for item in message if isinstance(message, list) else [message]:
            self._dispatch(item)

    def _dispatch(self, message: Any) -> None:
        if not isinstance(message, dict):
            log.warning("mcp.bad_message", server=self.name, message=str(message)[:200])
        elif "method" in message:
            if message.get("id") is None:
                self._on_notification(message)
            else:
                self._answer_server_request(message)
        elif "result" in message or "error" in message:
            self._on_reply(message)
        else:
            log.warning("mcp.bad_message", server=self.name, message=str(message)[:200])

    def _on_reply(self, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        # bool is an int in Python: `true` must not match request 1.
        future = self._pending.pop(request_id, None) if type(request_id) is int else None
        if future is None or future.done():
            log.info("mcp.reply_dropped", server=self.name, id=request_id, reason="no call waits for it")
        elif "error" in message:
            future.set_exception(RpcError.from_reply(message["error"]))
        else:
            future.set_result(message["result"])

    def _on_notification(self, message: dict[str, Any]) -> None:
        if len(self.unsolicited) == self.unsolicited.maxlen:
            self.unsolicited_dropped += 1
        self.unsolicited.append(message)
        log.debug("mcp.notification", server=self.name, method=message.get("method"))
        if self.on_notification is not None:
            self.on_notification(message)

    def _answer_server_request(self, message: dict[str, Any]) -> None:
        """Requests from the server to us: answer `ping`, refuse the rest (we offer no client features)."""
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        if message.get("method") == "ping":
            reply["result"] = {}
        else:
            reply["error"] = {"code": -32601, "message": f"method not supported: {message.get('method')}"}
        with contextlib.suppress(TransportClosed):
            self._write(reply)
