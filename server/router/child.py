"""One child `llamba-server` process: a model on a private 127.0.0.1 port, started and stopped by the router.

The child logs JSON lines (`--log-format json`); the router reads every line (a full pipe would block the
child), keeps the last ones for a `failed` report, and turns the lifecycle events among them
(`model.fetch`, `model.load_progress`, `model.loaded`, `model.sleeping`, `model.awake`) into status
changes. The child dies with the router even when the router is SIGKILLed (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import structlog

log = structlog.get_logger("router")

LOG_TAIL_LINES = 40
PR_SET_PDEATHSIG = 1

LineHandler = Callable[[dict[str, Any]], None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent() -> None:
    """In the forked child before exec: SIGKILL when the router goes, however it goes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# The variables of the router's own flags (server/router/main.py's ROUTER_ONLY_FLAGS; checked by
# tests/test_env_args.py): a child must not inherit them, as it does not inherit those flags. Its key
# comes from the router as LLAMA_ARG_API_KEY.
ROUTER_ONLY_ENV = frozenset(
    {
        "LLAMA_ARG_HOST",
        "LLAMA_ARG_PORT",
        "LLAMA_API_KEY",
        "LLAMA_ARG_API_KEY",
        "LLAMA_ARG_API_KEY_FILE",
        "LLAMA_ARG_MODELS_DIR",
        "LLAMA_ARG_MODELS_PRESET",
        "LLAMA_ARG_MODELS_MAX",
        "LLAMA_ARG_MODELS_AUTOLOAD",
        "LLAMA_ARG_NO_MODELS_AUTOLOAD",
        "LLAMA_ARG_ALIAS",
        "LLAMA_ARG_LOG_FILE",
        "LLAMA_ARG_API_PREFIX",
        "LLAMA_ARG_SSL_KEY_FILE",
        "LLAMA_ARG_SSL_CERT_FILE",
    }
)


def inherited_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The router's environment minus its own flags' variables."""
    return {name: value for name, value in environ.items() if name not in ROUTER_ONLY_ENV}


class Child:
    """A running child process and what it said last."""

    def __init__(self, model_id: str, args: list[str], env: dict[str, str], on_event: LineHandler) -> None:
        self.model_id = model_id
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["llamba-server", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        self._env = env
        self._on_event = on_event
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False  # the router asked it to go: its exit is not a crash
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "server",
            *self.args[1:],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**inherited_environ(os.environ), **self._env},
            preexec_fn=die_with_parent,
        )
        self._reader = asyncio.get_running_loop().create_task(self._read_lines())
        log.info("child.started", model=self.model_id, pid=self.proc.pid, port=self.port)

    async def _read_lines(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while raw := await self.proc.stdout.readline():
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and "event" in event:
                    self._on_event(event)

    async def wait(self) -> int:
        """The exit code once the process has ended and its output is read."""
        assert self.proc is not None
        code = await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        return code

    async def stop(self, timeout: float) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` seconds; the exit code."""
        self.stopping = True
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self.proc.wait()), timeout)
            except TimeoutError:
                log.warning("child.killed", model=self.model_id, pid=self.proc.pid, after_s=timeout)
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
        return await self.wait()

    def last_lines(self, n: int = 10) -> list[str]:
        return list(self.tail)[-n:]
