"""One MCP server as a child process speaking line-delimited JSON-RPC 2.0 on its stdin/stdout.

This module supervises the process (spawn, pipes, exit, stop); the JSON-RPC conversation on its pipes is
server/mcp/jsonrpc.py. Everything is event driven on the asyncio loop (pipe protocols, the loop's child
watcher): nothing polls, nothing blocks. The rules that keep Llamba healthy whatever the child does:

- the child's exit is taken from the child watcher, never from EOF on its stdout: a grandchild that
  inherited the pipes can hold them open forever;
- the child runs in its own process group (`start_new_session`), so stopping it can also stop whatever
  it spawned; our pipe ends are closed whatever the grandchildren do;
- stderr is always read (a chatty child never blocks on a full pipe) and only its tail is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
from collections import deque
from collections.abc import Mapping
from typing import Any

import structlog

from server.mcp.config import McpServerConfig
from server.mcp.jsonrpc import LineFramer, RpcChannel, TransportClosed

log = structlog.get_logger("mcp")

# After the child exits, how long replies it wrote just before dying may still be read from the pipe.
EXIT_DRAIN_S = 0.25


class SpawnError(TransportClosed):
    """The server process could not be started."""


class _ChildProtocol(asyncio.SubprocessProtocol):
    def __init__(self, owner: StdioTransport) -> None:
        self._owner = owner
        self._rpc = owner.rpc

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Before any other event (asyncio defers them until the pipes are connected).
        self._owner._process = transport  # type: ignore[assignment]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._rpc.feed(data)
        else:
            self._owner._on_stderr(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._owner._on_pipe_lost(fd, exc)

    def process_exited(self) -> None:
        self._owner._on_exit()

    def pause_writing(self) -> None:
        self._rpc.pause_writing()

    def resume_writing(self) -> None:
        self._rpc.resume_writing()


def resolve_command(command: str, env: Mapping[str, str]) -> str:
    """A bare command name is looked up on the child's PATH; a path is left to the OS (relative to cwd)."""
    if os.sep in command:
        return command
    found = shutil.which(command, path=env.get("PATH", os.defpath))
    if found is None:
        raise SpawnError(f"command '{command}' not found on PATH")
    return found


class StdioTransport:
    """The supervised child process; its calls (`request`, `notify`) go through `rpc`, its JSON-RPC side."""

    def __init__(
        self, config: McpServerConfig, *, max_unsolicited: int = 256, stderr_lines: int = 20
    ) -> None:
        self.config = config
        self.name = config.name
        self.rpc = RpcChannel(config.name, lambda: self.alive, max_unsolicited=max_unsolicited)
        self.stderr_tail: deque[str] = deque(maxlen=stderr_lines)
        self._stderr = LineFramer(64 * 1024)
        self._exited = asyncio.Event()
        self._stdout_eof = False
        self._released = False
        self._process: asyncio.SubprocessTransport | None = None
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
        self.rpc.stdin = process.get_pipe_transport(0)  # type: ignore[assignment]
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
        stdin = self.rpc.stdin
        stdin_open = stdin is not None and not stdin.is_closing()
        return (
            stdin_open
            and self.rpc.dead is None
            and self._closing is None
            and not (self._exited.is_set() or self._stdout_eof or self.rpc.stdin_lost)
        )

    @property
    def unsolicited(self) -> deque[dict[str, Any]]:
        """Notifications the server sent (the newest `max_unsolicited`)."""
        return self.rpc.unsolicited

    @property
    def unsolicited_dropped(self) -> int:
        return self.rpc.unsolicited_dropped

    def stderr_text(self) -> str:
        return " | ".join(self.stderr_tail)

    async def request(
        self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0
    ) -> Any:
        """Send a request, await its reply (matched by id). Raises RpcError, RpcTimeout, TransportClosed."""
        return await self.rpc.request(method, params, timeout_s)

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        await self.rpc.notify(method, params)

    async def close(self, reason: str = "MCP server stopped", grace_s: float = 0.3) -> None:
        """Stop the child and everything in its process group; returns within about 3 * grace_s + 0.5 s."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close(reason, grace_s))
        await asyncio.shield(self._closing)

    async def _close(self, reason: str, grace_s: float) -> None:
        self.rpc.fail(reason)
        if self._process is None:
            return
        stdin = self.rpc.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()  # EOF on stdin is the polite way to stop an MCP stdio server
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

    # -- events from the loop -----------------------------------------------------------------------
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
            self.rpc.lose_stdin()
            asyncio.get_running_loop().call_later(EXIT_DRAIN_S, self._stdin_closed, exc)

    def _stdin_closed(self, exc: Exception | None) -> None:
        if not self._exited.is_set() and self._closing is None:
            log.warning("mcp.stdin_lost", server=self.name, error=str(exc) if exc else None)
            self.rpc.fail("stopped reading its stdin")
            self._stop_in_background()

    def _stdout_closed(self) -> None:
        if not self._exited.is_set() and self._closing is None:
            self.rpc.fail("closed its stdout")
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
        self.rpc.fail(f"exited with code {self.returncode}")
        if self._closing is None:
            self._release()

    def _stop_in_background(self) -> None:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(
                self._close(self.rpc.dead or "stopped", 0.3)
            )
