"""The egress guard of a connection to a client-named MCP server: an httpx2 transport that applies
server/mcp/egress.py's policy to every request the SDK's transports send, redirects included."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx2

from server.mcp.egress import HostPolicy, HostRefused, literal_address, shown_url


@dataclass
class EgressRecord:
    """What the guard refused on one connection (the first refusal), for the caller's error."""

    refused: str | None = None


class GuardedTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport that sends each request only to a checked address of its host (pinned:
    the URL's host is replaced by that address; `Host` and the TLS server name keep the name), and
    checks where a redirect points before anyone may follow it."""

    def __init__(self, policy: HostPolicy, record: EgressRecord) -> None:
        self._policy, self._record = policy, record
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = str(request.url)
        try:
            host, port = self._policy.check_url(url)
            address = (await self._policy.resolve(host, port))[0]
        except HostRefused as exc:
            self._record.refused = self._record.refused or str(exc)
            raise httpx2.ConnectError(f"refused by --mcp-allow-hosts: {exc}", request=request) from None
        if literal_address(host) is None:
            if request.url.scheme == "https":
                request.extensions = {**request.extensions, "sni_hostname": host}
            request.url = request.url.copy_with(host=str(address))
        response = await self._inner.handle_async_request(request)
        await self._check_redirect(response, url)
        return response

    async def _check_redirect(self, response: httpx2.Response, url: str) -> None:
        location = response.headers.get("location")
        if not 300 <= response.status_code < 400 or not location:
            return
        target = str(httpx2.URL(url).join(location))
        try:
            host, port = self._policy.check_url(target)
            await self._policy.resolve(host, port)
        except HostRefused as exc:
            self._record.refused = (
                self._record.refused or f"the server redirected to {shown_url(target)}: {exc}"
            )

    async def aclose(self) -> None:
        await self._inner.aclose()


def guarded_client(
    policy: HostPolicy, record: EgressRecord, headers: dict[str, str], timeout: Any
) -> httpx2.AsyncClient:
    """An httpx2 client for one connection to a client-named server: every request through the guard,
    no proxy from the environment (it would connect where we did not check)."""
    return httpx2.AsyncClient(
        transport=GuardedTransport(policy, record), headers=headers, timeout=timeout, trust_env=False
    )
