"""The API key check shared by the model server and the router (llama-server's `--api-key`).

A request carries its key as `Authorization: Bearer KEY` or `X-Api-Key: KEY`. Keys are compared in
constant time (`hmac.compare_digest`), every configured key each time, so the answer's timing says
nothing about how much of a key was right. Public paths are an exact list: health, the model list (and
Ollama's version and model list) and the web UI's own files; a route that merely ends in `.js` or
`.html` (`/v1/responses/x.js`) is not one.
They are public to GET (and HEAD) only: a POST or DELETE on one (the router's download and removal of
models at `/models`, the router's and the cluster's proxy at `/`) needs the key.

The key also says whose a resumable stream is (`request_owner`): a stream is readable only with the key
that created it.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from typing import Any

import structlog
from quart import Quart, g, request

from server.http import errors
from server.http.error_handlers import error_reply

PUBLIC_PATHS = frozenset({
    "/health", "/v1/health", "/models", "/v1/models", "/", "/index.html",
    "/api/version", "/api/tags",  # Ollama's version and model list, as the others
})  # fmt: skip
PUBLIC_METHODS = frozenset({"GET", "HEAD"})


def is_public(method: str, path: str) -> bool:
    """What answers without the key: reading health, the model list, and the web UI's files (the page
    asks for the key itself). Only reading: other methods on these paths change things."""
    return method in PUBLIC_METHODS and (path in PUBLIC_PATHS or path.startswith("/assets/"))


def presented_key(headers: Any) -> str:
    auth = headers.get("Authorization", "")
    return auth[7:] if auth.startswith("Bearer ") else headers.get("X-Api-Key", "")


def key_accepted(key: str, keys: list[str] | tuple[str, ...]) -> bool:
    """Whether `key` is one of `keys`, in time that depends on neither (every key is compared)."""
    given = key.encode()
    matches = [hmac.compare_digest(given, k.encode()) for k in keys]
    return any(matches)


def install_auth(app: Quart, api_keys: list[str] | tuple[str, ...]) -> None:
    """Bind a request id to the request's log lines, then refuse a protected route without a valid key
    (401 in OpenAI's error shape)."""

    @app.before_request
    async def bind_request_and_check_key() -> Any:
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=uuid.uuid4().hex[:12])
        if not api_keys or request.method == "OPTIONS" or is_public(request.method, request.path):
            return None
        key = presented_key(request.headers)
        if not key_accepted(key, api_keys):
            return error_reply(errors.authentication())
        g.key_owner = hashlib.sha256(key.encode()).hexdigest()[:32]  # the key itself is never kept
        return None


def request_owner() -> str:
    """Whose the request's resumable streams are: its API key's digest ("" on a server without keys)."""
    return g.get("key_owner", "")


def request_client() -> str:
    """Who the request counts against for per-client caps: its key, else its remote address."""
    return request_owner() or f"addr:{request.remote_addr}"
