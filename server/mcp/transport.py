"""One MCP server as a child process speaking line-delimited JSON-RPC 2.0 on its stdin/stdout.

Everything here is event driven on the asyncio loop (pipe protocols, the loop's child watcher): nothing
polls, nothing blocks. The rules that keep Llamba healthy whatever the child does:

- replies are matched by id through a table of pending futures; a reply nobody waits for (its call timed
  out) is dropped, a notification (no id) is never taken for a reply, and `id: 0` is an id like any other;
- the child's exit is taken from the child watcher, never from EOF on its stdout: a grandchild that
  inherited the pipes can hold them open forever;
- the child runs in its own process group (`start_new_session`), so stopping it can also stop whatever
  it spawned; our pipe ends are closed whatever the grandchildren do;
- stderr is always read (a chatty child never blocks on a full pipe) and only its tail is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections import deque
from collections.abc import Mapping
from typing import Any

import structlog

from server.mcp.config import McpServerConfig

log = structlog.get_logger("mcp")

MAX_LINE_BYTES = 16 * 1024 * 1024
# After the child exits, how long replies it wrote just before dying may still be read from the pipe.
EXIT_DRAIN_S = 0.25


class TransportClosed(Exception):
    """The server is gone (exited, closed a pipe, or is being stopped)."""


class SpawnError(TransportClosed):
    """The server process could not be started."""


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


class _ChildProtocol(asyncio.SubprocessProtocol):
    def __init__(self, owner: StdioTransport) -> None:
        self._owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Before any other event (asyncio defers them until the pipes are connected).
        self._owner._process = transport  # type: ignore[assignment]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._owner._on_stdout(data)
        else:
            self._owner._on_stderr(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._owner._on_pipe_lost(fd, exc)

    def process_exited(self) -> None:
        self._owner._on_exit()

    def pause_writing(self) -> None:
        self._owner._writable.clear()

    def resume_writing(self) -> None:
        self._owner._writable.set()


def resolve_command(command: str, env: Mapping[str, str]) -> str:
    """A bare command name is looked up on the child's PATH; a path is left to the OS (relative to cwd)."""
    if os.sep in command:
        return command
    found = shutil.which(command, path=env.get("PATH", os.defpath))
    if found is None:
        raise SpawnError(f"command '{command}' not found on PATH")
    return found


class StdioTransport:
    def __init__(
        self, config: McpServerConfig, *, max_unsolicited: int = 256, stderr_lines: int = 20
    ) -> None:
        self.config = config
        self.name = config.name
        self.unsolicited: deque[dict[str, Any]] = deque(maxlen=max_unsolicited)
        self.unsolicited_dropped = 0
        self.stderr_tail: deque[str] = deque(maxlen=stderr_lines)
        self._stdout = LineFramer()
        self._stderr = LineFramer(64 * 1024)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0  # the first request carries id 0 on purpose: it is a valid id
        self._writable = asyncio.Event()
        self._writable.set()
        self._exited = asyncio.Event()
        self._stdout_eof = False
        self._stdin_lost = False
        self._released = False
        self._dead: str | None = None
        self._process: asyncio.SubprocessTransport | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._closing: asyncio.Task[None] | None = None

    # -- life cycle ---------------------------------------------------------------------------------
    @classmethod
    async def spawn(cls, config: McpServerConfig, **kwargs: Any) -> StdioTransport:
        self = cls(config, **kwargs)
        env = {**os.environ, **config.env}
        program = resolve_command(config.command, env)
        loop = asyncio.get_running_loop()
        try:
            process, _ = await loop.subprocess_exec(
                lambda: _ChildProtocol(self),
                program,
                *config.args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=config.cwd,
                start_new_session=True,  # its own process group: stopping it reaches its children too
            )
        except OSError as exc:
            raise SpawnError(f"cannot start '{config.command}': {exc}") from exc
        self._process = process
        self._stdin = process.get_pipe_transport(0)  # type: ignore[assignment]
        log.info("mcp.server_started", server=self.name, pid=self.pid, command=program)
        return self

    @property
    def pid(self) -> int | None:
        return self._process.get_pid() if self._process is not None else None

    @property
    def returncode(self) -> int | None:
        return self._process.get_returncode() if self._process is not None else None

    @property
    def alive(self) -> bool:
        stdin_open = self._stdin is not None and not self._stdin.is_closing()
        return (
            stdin_open
            and self._dead is None
            and self._closing is None
            and not (self._exited.is_set() or self._stdout_eof or self._stdin_lost)
        )

    def stderr_text(self) -> str:
        return " | ".join(self.stderr_tail)

    async def close(self, reason: str = "MCP server stopped", grace_s: float = 0.3) -> None:
        """Stop the child and everything in its process group; returns within about 3 * grace_s + 0.5 s."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close(reason, grace_s))
        await asyncio.shield(self._closing)

    async def _close(self, reason: str, grace_s: float) -> None:
        self._fail(reason)
        if self._process is None:
            return
        if self._stdin is not None and not self._stdin.is_closing():
            self._stdin.close()  # EOF on stdin is the polite way to stop an MCP stdio server
        if not await self._wait_exit(grace_s):
            self._signal_group(signal.SIGTERM)
            if not await self._wait_exit(grace_s):
                self._signal_group(signal.SIGKILL)
                await self._wait_exit(grace_s + 0.5)
        self._release()

    def _release(self) -> None:
        """After the child exited: kill leftovers holding our pipes, then close our pipe ends anyway."""
        if self._released:
            return
        self._released = True
        if not self._stdout_eof:
            self._signal_group(signal.SIGKILL)
        if self._process is not None and not self._process.is_closing():
            self._process.close()

    async def _wait_exit(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._exited.wait()
        return self._exited.is_set()

    def _signal_group(self, sig: signal.Signals) -> None:
        pid = self.pid
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def _fail(self, reason: str) -> None:
        """Mark the transport dead and fail every waiting call with the reason."""
        if self._dead is None:
            self._dead = reason
        self._writable.set()  # wake writers waiting on back-pressure: there is nobody to write to
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(TransportClosed(f"MCP server '{self.name}': {self._dead}"))

    # -- calls --------------------------------------------------------------------------------------
    async def request(
        self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0
    ) -> Any:
        """Send a request, await its reply (matched by id). Raises RpcError, RpcTimeout, TransportClosed."""
        if not self.alive:
            raise TransportClosed(f"MCP server '{self.name}': {self._dead or 'not running'}")
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
        if self.alive and self._pending.pop(request_id, None) is not None:
            with contextlib.suppress(TransportClosed):
                self._write({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": request_id, "reason": reason}})  # fmt: skip

    async def _send(self, message: dict[str, Any]) -> None:
        self._write(message)
        # Back-pressure: a child that stops reading its stdin makes us wait here (under the call's timeout).
        await self._writable.wait()
        if self._stdin_lost:
            raise TransportClosed(f"MCP server '{self.name}': {self._dead or 'stopped reading its stdin'}")

    def _write(self, message: dict[str, Any]) -> None:
        stdin = self._stdin
        if stdin is None or stdin.is_closing() or self._dead is not None:
            raise TransportClosed(f"MCP server '{self.name}': {self._dead or 'stdin closed'}")
        # json.dumps escapes control characters, so the line holds no raw newline.
        stdin.write(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")

    # -- events from the loop -----------------------------------------------------------------------
    def _on_stdout(self, data: bytes) -> None:
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

    def _answer_server_request(self, message: dict[str, Any]) -> None:
        """Requests from the server to us: answer `ping`, refuse the rest (we offer no client features)."""
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        if message.get("method") == "ping":
            reply["result"] = {}
        else:
            reply["error"] = {"code": -32601, "message": f"method not supported: {message.get('method')}"}
        with contextlib.suppress(TransportClosed):
            self._write(reply)

    def _on_stderr(self, data: bytes) -> None:
        for line in self._stderr.feed(data):
            text = line.decode(errors="replace")
            self.stderr_tail.append(text[:500])
            log.debug("mcp.stderr", server=self.name, line=text[:500])

    def _on_pipe_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self._stdout_eof = True
            if self._exited.is_set():
                self._after_exit()
            else:
                # Usually the exit notice is just behind: let it give the better reason.
                asyncio.get_running_loop().call_later(0.1, self._stdout_closed)
        elif fd == 0 and self._closing is None and not self._exited.is_set():
            # EPIPE on write, or the child closed its stdin: it can no longer hear us (so it is not alive),
            # but replies it is still writing are read until it exits or the grace period ends.
            self._stdin_lost = True
            self._writable.set()
            asyncio.get_running_loop().call_later(EXIT_DRAIN_S, self._stdin_closed, exc)

    def _stdin_closed(self, exc: Exception | None) -> None:
        if not self._exited.is_set() and self._closing is None:
            log.warning("mcp.stdin_lost", server=self.name, error=str(exc) if exc else None)
            self._fail("stopped reading its stdin")
            self._stop_in_background()

    def _stdout_closed(self) -> None:
        if not self._exited.is_set() and self._closing is None:
            self._fail("closed its stdout")
            self._stop_in_background()

    def _on_exit(self) -> None:
        code = self.returncode
        if self._closing is None:
            log.warning("mcp.server_exited", server=self.name, code=code, stderr=self.stderr_text() or None)
        self._exited.set()
        if self._stdout_eof:
            self._after_exit()
        else:
            # A reply written just before exiting may still sit in the pipe; a grandchild may hold it open.
            asyncio.get_running_loop().call_later(EXIT_DRAIN_S, self._after_exit)

    def _after_exit(self) -> None:
        self._fail(f"exited with code {self.returncode}")
        if self._closing is None:
            self._release()

    def _stop_in_background(self) -> None:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close(self._dead or "stopped", 0.3))
