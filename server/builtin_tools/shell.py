"""exec_shell_command: `sh -c` in the working directory (or in a runtime), stdout and stderr together.

The command runs in its own process group, and the whole group is killed when it times out or when its
caller goes away (a client that disconnects from the stream, a stopped tool loop): no process outlives
its call.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import Field

from server.builtin_tools.files import TRUNCATED, Params
from server.builtin_tools.runtime import Runtime

DEFAULT_TIMEOUT_S = 10
MAX_TIMEOUT_S = 60
MAX_OUTPUT_BYTES = 16384
READ_SIZE = 4096
# Not passed to commands: the keys this server checks (a router hands its children theirs this way).
SECRET_ENV = ("LLAMA_API_KEY", "LLAMA_ARG_API_KEY")


class ExecShellCommand(Params):
    command: str = Field(description="the shell command line (run by sh -c)")
    timeout: int = Field(
        DEFAULT_TIMEOUT_S, description=f"seconds before it is killed (at most {MAX_TIMEOUT_S})"
    )
    max_output_size: int = Field(
        MAX_OUTPUT_BYTES, description=f"bytes of output kept (at most {MAX_OUTPUT_BYTES})"
    )


@dataclass
class Execution:
    """One command's run: `chunks()` yields its output as it comes (up to the cap); then `tail()`."""

    p: ExecShellCommand
    cwd: str | None
    runtime: Runtime | None = None
    exit_code: int = -1
    timed_out: bool = False
    truncated: bool = False

    def argv(self, timeout_s: float) -> list[str]:
        if self.runtime is not None:
            return self.runtime.argv(self.p.command, self.cwd, timeout_s)
        return ["sh", "-c", self.p.command]

    async def chunks(self) -> AsyncIterator[str]:
        timeout_s = min(self.p.timeout, MAX_TIMEOUT_S)
        cap = max(min(self.p.max_output_size, MAX_OUTPUT_BYTES), 0)
        proc = await asyncio.create_subprocess_exec(
            *self.argv(timeout_s),
            cwd=None if self.runtime else self.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed whole, grandchildren included
            env={k: v for k, v in os.environ.items() if k not in SECRET_ENV},
        )
        try:
            async with asyncio.timeout(max(timeout_s, 0)):
                async for chunk in self._read(proc, cap):
                    yield chunk
                self.exit_code = await proc.wait()
        except TimeoutError:
            self.timed_out = True
        finally:
            await _kill_group(proc)
            if self.timed_out:
                self.exit_code = proc.returncode if proc.returncode is not None else -signal.SIGKILL

    async def _read(self, proc: asyncio.subprocess.Process, cap: int) -> AsyncIterator[str]:
        assert proc.stdout is not None
        kept = 0
        # Incremental: a character split by a read stays whole.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while data := await proc.stdout.read(READ_SIZE):
            room = cap - kept
            if len(data) > room:
                # The rest is read and dropped, so the command never blocks on a full pipe.
                self.truncated = True
                data = data[: max(room, 0)]
            kept += len(data)
            text = decoder.decode(data)
            if text:
                yield text

    def tail(self) -> str:
        return f"\n[exit code: {self.exit_code}]" + (" [exit due to timed out]" if self.timed_out else "")


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the command's whole process group (a no-op once it is gone), then reap the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        await asyncio.shield(proc.wait())


async def exec_shell_command(execution: Execution) -> dict[str, str]:
    try:
        parts = [chunk async for chunk in execution.chunks()]
    except OSError as exc:  # no such cwd any more, or the runtime's client (docker, ssh) is missing
        return {"plain_text_response": f"failed to spawn process: {exc}\n[exit code: -1]"}
    text = "".join(parts) + (f"\n{TRUNCATED}" if execution.truncated else "")
    return {"plain_text_response": text + execution.tail()}
