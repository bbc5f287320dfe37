"""`--sleep-idle-seconds N`: after N seconds without work the model frees its memory, and the next
request wakes it (llama-server's sleeping on idle).

An ASGI middleware around the app counts the requests in flight (a streamed response counts until its
last byte) and wakes the model before a request that needs it. Reading the server's state does not
count as work and does not wake it: /health, /props, /models, /metrics and GET /slots answer from what
the model left (`ModelHost.sleep` keeps its facts and last snapshot). Work is also what the engine
does without an HTTP request (a resumable session whose client left): a busy snapshot keeps it awake.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from server.model.host import ModelHost

log = structlog.get_logger("server")

# Routes that read state: they neither wake the model nor count as activity.
READ_ONLY_PATHS = {
    "/health",
    "/v1/health",
    "/props",
    "/models",
    "/v1/models",
    "/metrics",
    "/slots",
    "/slots/prefixes",  # a cluster router polls it: it must neither wake the model nor keep it awake
}

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class IdleSleeper:
    """The middleware, and the task that puts the model to sleep once it has been idle long enough."""

    def __init__(self, app: ASGIApp, model: ModelHost, idle_seconds: float) -> None:
        self._app = app
        self._model = model
        self.idle_seconds = idle_seconds
        self._in_flight = 0
        self._last_activity = time.monotonic()
        self._watcher: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or _read_only(scope):
            await self._app(scope, receive, send)
            return
        self._in_flight += 1
        try:
            if self._model.sleeping:
                await self._model.wake()
            await self._app(scope, receive, send)
        finally:
            self._in_flight -= 1
            self._last_activity = time.monotonic()

    def start(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher

    async def _watch(self) -> None:
        period = min(0.25, self.idle_seconds / 4)
        while True:
            await asyncio.sleep(period)
            model = self._model
            if model.sleeping or not model.loaded:
                continue
            snapshot = model.snapshot()
            if self._in_flight or snapshot.n_busy or snapshot.n_waiting:
                self._last_activity = time.monotonic()
            elif time.monotonic() - self._last_activity >= self.idle_seconds:
                log.info("model.going_to_sleep", idle_seconds=self.idle_seconds)
                await model.sleep()


def _read_only(scope: dict[str, Any]) -> bool:
    path = scope.get("path", "")
    return path in READ_ONLY_PATHS and (not path.startswith("/slots") or scope.get("method") == "GET")
