"""/cors-proxy?url=...: the web UI's MCP client reaches MCP servers through this server (--ui-mcp-proxy),
since a browser page cannot call another origin that does not allow it.

Only what the page explicitly asks for is forwarded: request headers named
`x-llama-server-proxy-header-<Name>` are sent as `<Name>`; the page's own cookies, Authorization (this
server's API key) and every other header are not. The answer comes back streamed, without the target's
CORS, cookie and hop-by-hop headers, cut after MAX_RESPONSE_BYTES. The API key applies as on any route.
Without --ui-mcp-proxy, /cors-proxy answers 403 (llama-server's "this feature is disabled").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import structlog
from quart import Blueprint, Response, request

from server.http import errors

log = structlog.get_logger("server")

bp = Blueprint("cors_proxy", __name__)
# Without --ui-mcp-proxy the route answers 403 "this feature is disabled", as llama-server's does (the web
# UI reads that to know the proxy is off), rather than a 404.
disabled_bp = Blueprint("cors_proxy_disabled", __name__)

PREFIX = "x-llama-server-proxy-header-"
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
TIMEOUT = httpx.Timeout(60.0, connect=10.0)  # per read: an MCP event stream may idle between events
MAX_REDIRECTS = 5
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding"}
)  # fmt: skip
# Not passed back: the target's CORS policy is not ours, its cookies would land on this origin, and the
# body comes decoded (httpx undoes content-encoding).
DROPPED_RESPONSE = HOP_BY_HOP | {"server", "set-cookie", "content-encoding"}


def target_url() -> str:
    url = request.args.get("url", "")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise errors.invalid_request(f"'url': an absolute http or https URL is required, got {url!r}")
    if parts.password is not None:
        raise errors.invalid_request("'url': a password in the URL is not forwarded; send a header instead")
    return url


def forwarded_headers(headers: Any) -> dict[str, str]:
    """Only the x-llama-server-proxy-header-* ones, under their own names."""
    out = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith(PREFIX) and lower[len(PREFIX) :] and lower[len(PREFIX) :] not in HOP_BY_HOP:
            out[name[len(PREFIX) :]] = value
    return out


@bp.route("/cors-proxy", methods=["GET", "POST"])
async def cors_proxy() -> Any:
    url = target_url()
    client = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=True, max_redirects=MAX_REDIRECTS)
    body = await request.get_data() if request.method == "POST" else None
    outgoing = client.build_request(
        request.method, url, headers=forwarded_headers(request.headers), content=body
    )
    try:
        upstream = await client.send(outgoing, stream=True)
    except httpx.HTTPError as exc:
        await client.aclose()
        raise errors.APIError(502, f"the proxied request failed: {exc}", "server_error") from exc
    headers = [(k, v) for k, v in upstream.headers.multi_items() if not _dropped(k)]
    reply = Response(_body(client, upstream), status=upstream.status_code, headers=headers)
    reply.timeout = None
    return reply


@disabled_bp.route("/cors-proxy", methods=["GET", "POST"])
async def cors_proxy_disabled() -> Any:
    message = "this feature is disabled (start the server with --ui-mcp-proxy)"
    raise errors.APIError(403, message, "feature_disabled")


def _dropped(name: str) -> bool:
    lower = name.lower()
    return lower in DROPPED_RESPONSE or lower.startswith("access-control-")


async def _body(client: httpx.AsyncClient, upstream: httpx.Response) -> AsyncIterator[bytes]:
    sent = 0
    try:
        async for chunk in upstream.aiter_bytes():
            sent += len(chunk)
            if sent > MAX_RESPONSE_BYTES:
                log.warning("cors_proxy.cut", url=str(upstream.url), limit=MAX_RESPONSE_BYTES)
                return
            yield chunk
    except httpx.HTTPError as exc:  # the target stalled or went away mid-answer: the reply just ends
        log.warning("cors_proxy.read_failed", url=str(upstream.url), error=str(exc))
    finally:
        await upstream.aclose()
        await client.aclose()
