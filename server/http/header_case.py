"""Response header names on HTTP/1.x as llama-server writes them: `Content-Type`,
`Access-Control-Allow-Origin`, not the lower case every ASGI app hands its server.

HTTP header names are case-insensitive, but clients that copy headers into a plain dict
(`dict(requests_response.headers)`, as llama.cpp's own server tests do) then look them up by llama-server's
spelling. ASGI asks apps for lower-case names (Quart lowercases them all); hypercorn's HTTP/1.1 writer
(h11) sends a name in the case it is given, so this layer gives each one its canonical case
(`Title-Case` per dash-separated word) on HTTP/1.0 and 1.1. HTTP/2 and 3 require lower case: their
responses pass unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

from server.http.io_timeouts import App, Receive, Scope, Send

HTTP1 = frozenset({"1.0", "1.1"})


@functools.lru_cache(maxsize=512)
def canonical(name: bytes) -> bytes:
    """`access-control-allow-origin` -> `Access-Control-Allow-Origin`."""
    return b"-".join(part[:1].upper() + part[1:] for part in name.split(b"-"))


class CanonicalHeaderCase:
    """The ASGI layer that re-cases the response headers of HTTP/1.x requests."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("http_version") not in HTTP1:
            await self.app(scope, receive, send)
            return

        async def send_canonical(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [(canonical(bytes(name)), value) for name, value in message.get("headers", ())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_canonical)
