"""Cross-origin requests: which browser pages may call this server, for the single-model app and the
router alike, with llama-server's flags and answers.

`--cors-origins` is `*` (any page; the default), `localhost` (llama-server's special value: any page
served from this machine, http(s)://localhost, 127.0.0.1 or [::1] on any port; the default when built-in
tools or MCP servers are configured, since /tools runs code on this host), or a comma list of origins,
which may include `localhost`. Same-origin pages are always allowed.

A preflight (OPTIONS) is answered 200 at once, before any route or key check, as llama-server answers
it: with the Access-Control-Allow-* headers (`--cors-methods`, `--cors-headers`,
`--cors-credentials`) for an allowed origin, and without them for another, which the browser reads as
a refusal. Llamba refuses more than llama-server in one place: a non-preflight request from a page that
is not allowed gets a 403 instead of being run with its answer hidden from the page, since a browser
sends a simple cross-origin POST (a form, `text/plain`) without asking first, and running it would let
any web page drive /tools or the model.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from quart import Quart, Response, request

from server.config.settings import Settings
from server.http import errors
from server.http.error_handlers import error_reply

LOCALHOST = "localhost"  # the --cors-origins value that allows this machine's pages
LOCAL_ORIGIN = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$", re.IGNORECASE)
MAX_AGE_S = "600"  # browsers cache a preflight this long (llama-server sends none: one per request)


def allowed_origins(settings: Settings) -> tuple[str, ...]:
    """--cors-origins, else llama-server's default: any page, or this machine's pages only when built-in
    tools or MCP servers are configured."""
    if settings.cors_origins is not None:
        return settings.cors_origins
    return (LOCALHOST,) if settings.mcp_servers or settings.tools else ("*",)


def origin_allowed(origin: str, settings: Settings, host: str) -> bool:
    """Same-origin always; else as allowed_origins says."""
    if urlsplit(origin).netloc.lower() == host.lower():
        return True
    origins = allowed_origins(settings)
    if "*" in origins:
        return True
    if LOCALHOST in origins and LOCAL_ORIGIN.match(origin):
        return True
    return origin.rstrip("/") in origins


def allow_origin_value(origin: str, settings: Settings) -> str:
    """The Access-Control-Allow-Origin of an allowed page: its origin, or `*` for any page without
    credentials (llama-server's `--no-cors-credentials` with `--cors-origins *`)."""
    if not settings.cors_credentials and "*" in allowed_origins(settings):
        return "*"
    return origin


def install_cors(app: Quart, settings: Settings) -> None:
    @app.before_request
    async def answer_preflight_or_refuse_foreign_origin() -> Any:
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS":
            return Response("", 200, content_type="text/html")  # add_cors_headers adds what applies
        # Browsers send simple cross-origin POSTs before asking anyone: refuse them, not just their replies.
        if origin and not origin_allowed(origin, settings, request.host):
            err = errors.APIError(403, f"origin not allowed: {origin} (--cors-origins)", "permission_error")
            return error_reply(err)
        return None

    @app.after_request
    async def add_cors_headers(response: Response) -> Response:
        origin = request.headers.get("Origin")
        if not origin or not origin_allowed(origin, settings, request.host):
            return response
        response.headers["Access-Control-Allow-Origin"] = allow_origin_value(origin, settings)
        response.vary.add("Origin")
        if request.method == "OPTIONS":
            response.headers["Access-Control-Allow-Credentials"] = str(settings.cors_credentials).lower()
            response.headers["Access-Control-Allow-Methods"] = settings.cors_methods
            response.headers["Access-Control-Allow-Headers"] = settings.cors_headers
            response.headers["Access-Control-Max-Age"] = MAX_AGE_S
        elif settings.cors_credentials:  # a credentialed answer is readable only with it (Fetch spec)
            response.headers["Access-Control-Allow-Credentials"] = "true"
        return response
