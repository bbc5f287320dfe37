"""How every Llamba process listens: hypercorn's config (bind, TLS, header limits) and the ASGI layers
around the app (`-to` timeouts, `--api-prefix`, header names' case), for the model server, the router
and the cluster.

`--ssl-key-file`/`--ssl-cert-file` (llama-server's TLS): hypercorn serves HTTPS with them (both or
neither). `--host` may name a unix socket (`*.sock`) or several addresses. `--api-prefix /p`
(llama-server's): every route is served under /p (/p/v1/chat/completions, /p/health), other paths are
404, and /p itself redirects to /p/ where the web UI's page is (its requests are relative to it).

The event loop is picked at start (`loop_factory`, `run`): a router's and a cluster's front, which
proxy streams, run on uvloop when the `uvloop` extra is installed (`pip install 'llamba[uvloop]'`: the
proxy spends ~8% less CPU per streamed event, scripts/bench_proxy.py); a model server runs on asyncio's
own loop, because it supervises MCP stdio children through asyncio's pipe transports, which see a child
close its stdin (a deaf server, stopped and reaped at once), and uvloop's do not (the call then times
out). `LLAMBA_EVENT_LOOP=asyncio` or `=uvloop` names the loop of every process instead (uvloop asked for
but missing is an error); a router's children and a cluster's replicas inherit the variable.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from hypercorn.config import Config

from server.config.settings import Settings
from server.http.header_case import CanonicalHeaderCase
from server.http.io_timeouts import App, IoTimeouts, Receive, Scope, Send
from server.http.limits import hypercorn_limits

EVENT_LOOPS = ("auto", "asyncio", "uvloop")
T = TypeVar("T")
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory(proxy: bool, choice: str | None = None) -> LoopFactory | None:
    """The loop `choice` (else LLAMBA_EVENT_LOOP, else auto) names for a process (`proxy`: a router's or
    a cluster's front): uvloop's factory, or None for asyncio's own; ValueError for an unknown name, or
    uvloop asked for and not installed."""
    choice = os.environ.get("LLAMBA_EVENT_LOOP", "auto") if choice is None else choice
    if choice not in EVENT_LOOPS:
        raise ValueError(f"LLAMBA_EVENT_LOOP must be one of {', '.join(EVENT_LOOPS)}, got {choice!r}")
    if choice == "asyncio" or (choice == "auto" and not proxy):
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ValueError(
                "LLAMBA_EVENT_LOOP=uvloop: uvloop is not installed (pip install 'llamba[uvloop]')"
            ) from None
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], factory: LoopFactory | None = None) -> T:
    """`main` run to its end on a new loop of `factory` (None: asyncio's), as asyncio.run does."""
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def hypercorn_config(settings: Settings) -> Config:
    config = Config()
    config.bind = binds(settings.host, settings.port)
    config.graceful_timeout = 1.0
    config.accesslog = None
    hypercorn_limits(config, settings.limits)
    if settings.ssl_cert_file:
        config.certfile, config.keyfile = settings.ssl_cert_file, settings.ssl_key_file
    return config


def binds(host: str, port: int) -> list[str]:
    """hypercorn's binds for `--host`: llama-server's address, or a unix socket when it ends with `.sock`;
    Llamba also takes a comma list (one process listening on each, e.g. `127.0.0.1,/run/llamba.sock`)."""
    hosts = [h.strip() for h in host.split(",") if h.strip()]
    return [f"unix:{h}" if h.endswith(".sock") else f"{h}:{port}" for h in hosts]


def served(app: Any, settings: Settings) -> App:
    """The app as hypercorn runs it: -to's read/write timeouts, under --api-prefix when one is set, its
    header names in llama-server's case on HTTP/1.x (server/http/header_case.py)."""
    timed = IoTimeouts(app, settings.timeout)
    return CanonicalHeaderCase(ApiPrefix(timed, settings.api_prefix) if settings.api_prefix else timed)


class ApiPrefix:
    """Serve `app` under `prefix` (no trailing slash): the prefix becomes the scope's root_path, which
    Quart strips from the path before routing (ASGI: `path` includes `root_path`)."""

    def __init__(self, app: App, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path == self.prefix and scope["type"] == "http":
            await _reply(send, 308, b"", [(b"location", (self.prefix + "/").encode())])
            return
        if not path.startswith(self.prefix + "/"):
            body = b'{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}'
            await _reply(send, 404, body, [(b"content-type", b"application/json")])
            return
        await self.app(dict(scope, root_path=scope.get("root_path", "") + self.prefix), receive, send)


async def _reply(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    length = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + length})
    await send({"type": "http.response.body", "body": body})
