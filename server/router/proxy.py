"""Forwarding one request to a child and streaming its answer back without buffering.

The answer's bytes go to the client as they come from the child (`server/router/upstream.py`: one chunk
of the child's chunked answer at a time, no decoding), so an SSE stream reaches the client event by
event. When the client leaves, Quart closes the body: the upstream connection is closed, which the child
sees as its own client leaving (and cancels the generation, unless it is a resumable conversation). The
lease is given back when the body ends, whichever way it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Protocol

import structlog
from quart import Response

from server.http import errors
from server.router.upstream import UpstreamClient, UpstreamError, UpstreamResponse

log = structlog.get_logger("router")

# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy sets itself.
REQUEST_DROP = {
    "host",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
    "content-length",
    "expect",
    "authorization",
    "x-api-key",
}
RESPONSE_DROP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "trailer",
    "upgrade",
    "date",
    "server",
}


def new_client() -> UpstreamClient:
    """The router's one client to its children: pooled keep-alive connections, no read timeout (a
    generation streams as long as it runs)."""
    return UpstreamClient(max_idle=64)


class Lease(Protocol):
    """The right to send one request to one model server: its base URL, a name for errors and logs,
    and `release` when its response ends (a router `pool.Lease`, or a cluster replica's)."""

    @property
    def url(self) -> str: ...

    @property
    def name(self) -> str: ...

    def release(self) -> None: ...


class UpstreamBody:
    """The child's answer as the client's response body; `aclose` always gives the lease back."""

    def __init__(self, upstream: UpstreamResponse, lease: Lease) -> None:
        self._upstream = upstream
        self._lease = lease

    def __aiter__(self) -> UpstreamBody:
        return self

    async def __anext__(self) -> bytes:
        try:
            data = await self._upstream.next_chunk()
        except UpstreamError as exc:  # the child went away mid-answer: end the stream there
            log.warning("proxy.upstream_lost", model=self._lease.name, error=str(exc))
            raise StopAsyncIteration from None
        if not data:
            raise StopAsyncIteration
        return data

    async def aclose(self) -> None:
        try:
            await self._upstream.aclose()
        finally:
            self._lease.release()


async def open_upstream(
    client: UpstreamClient,
    lease: Lease,
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: bytes,
    secret: str,
) -> UpstreamResponse:
    """Send the request to the lease's child; the answer's head (its body not yet read). 502 if the
    child cannot be reached (it died between the lease and the request)."""
    sent = [(k, v) for k, v in headers.items() if k.lower() not in REQUEST_DROP]
    sent.append(("Authorization", f"Bearer {secret}"))
    try:
        return await client.send(lease.url, method, target, sent, body)
    except UpstreamError as exc:
        raise errors.APIError(502, f"model '{lease.name}' did not answer: {exc}", "server_error") from None


def client_response(upstream: UpstreamResponse, lease: Lease) -> Response:
    headers = [(k, v) for k, v in upstream.headers if k.lower() not in RESPONSE_DROP]
    response = Response(UpstreamBody(upstream, lease), status=upstream.status_code, headers=headers)
    response.timeout = None  # a generation streams as long as it runs
    return response


async def discard(upstream: UpstreamResponse, lease: Lease) -> None:
    """Close an answer nobody will read (its client left) and give the lease back."""
    with contextlib.suppress(UpstreamError):
        await upstream.aclose()
    lease.release()
