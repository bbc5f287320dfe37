"""How every Llamba process listens: hypercorn's config (bind, TLS, header limits) and the ASGI layers
around the app (`-to` timeouts, `--api-prefix`), for the model server, the router and the cluster.

`--ssl-key-file`/`--ssl-cert-file` (llama-server's TLS): hypercorn serves HTTPS with them (both or
neither). `--host` may name a unix socket (`*.sock`) or several addresses. `--api-prefix /p`
(llama-server's): every route is served under /p (/p/v1/chat/completions, /p/health), other paths are
404, and /p itself redirects to /p/ where the web UI's page is (its requests are relative to it).
"""

from __future__ import annotations

from typing import Any

from hypercorn.config import Config

from server.config.settings import Settings
from server.http.io_timeouts import App, IoTimeouts, Receive, Scope, Send
from server.http.limits import hypercorn_limits


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
    """The app as hypercorn runs it: -to's read/write timeouts, under --api-prefix when one is set."""
    timed = IoTimeouts(app, settings.timeout)
    return ApiPrefix(timed, settings.api_prefix) if settings.api_prefix else timed


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
