"""Cross-origin requests: which browser pages may call this server, for the single-model app and the
router alike (llama-server's policy, narrowed where configured MCP servers make /tools run code)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from quart import Quart, Response, request

from server.config.settings import Settings
from server.http import errors
from server.http.error_handlers import error_reply

LOCAL_ORIGIN = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$", re.IGNORECASE)


def origin_allowed(origin: str, settings: Settings, host: str) -> bool:
    """Same-origin always; else --cors-origins, or by default any origin (llama-server's policy) unless
    built-in tools or MCP servers are configured: then only localhost pages, since /tools runs code on
    this host."""
    if urlsplit(origin).netloc.lower() == host.lower():
        return True
    if settings.cors_origins is not None:
        return "*" in settings.cors_origins or origin.rstrip("/") in settings.cors_origins
    return not (settings.mcp_servers or settings.tools) or bool(LOCAL_ORIGIN.match(origin))


def install_cors(app: Quart, settings: Settings) -> None:
    @app.before_request
    async def refuse_foreign_origin() -> Any:
        # Browsers send simple cross-origin POSTs before asking anyone: refuse them, not just their replies.
        origin = request.headers.get("Origin")
        if origin and not origin_allowed(origin, settings, request.host):
            err = errors.APIError(403, f"origin not allowed: {origin} (--cors-origins)", "permission_error")
            return error_reply(err)
        return None

    @app.after_request
    async def add_cors_headers(response: Response) -> Response:
        origin = request.headers.get("Origin")
        if origin and origin_allowed(origin, settings, request.host):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Credentials"] = "true"
            response.vary.add("Origin")
            if request.method == "OPTIONS":
                response.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
                asked = request.headers.get("Access-Control-Request-Headers")
                response.headers["Access-Control-Allow-Headers"] = asked or "*"
                response.headers["Access-Control-Max-Age"] = "600"
        return response
