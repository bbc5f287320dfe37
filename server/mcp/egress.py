"""Which hosts a client may make this server connect to (`--mcp-allow-hosts`), checked on every request
the server then makes: a `server_url` a client names is a request the server sends on its behalf, so
without this check any client could reach what only the server can (its loopback, the private network,
a cloud's metadata address at 169.254.169.254).

The rules:

- off by default: with no patterns, no client-named URL is used at all;
- a pattern is a host name (`mcp.example.com`), a wildcard over its subdomains (`*.example.com`, and
  `*` for any host), an IP address or a network (`127.0.0.1`, `10.0.0.0/8`, `::1`);
- the host is resolved and EVERY address it resolves to is checked: an address that is not global
  (loopback, private, link-local, shared, reserved, multicast, unspecified; an IPv4 address mapped into
  IPv6 counts as the IPv4 one) is refused unless a listed address or network covers it, or the URL's
  host is a name listed exactly (not through a wildcard): `*` never reaches 127.0.0.1;
- the connection then goes to the address that was checked (the request's host name stays in `Host`
  and in TLS's server name), so DNS cannot answer differently between the check and the connection;
- every request is checked (server/mcp/guard.py), redirects included: the SDK's transports follow a
  redirect only within one origin, and a redirect to a host not allowed is remembered, so the caller
  can say why the server was not reached;
- nothing here logs a header.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class HostRefused(ValueError):
    """The URL may not be used: its scheme, its host, or an address its host resolves to."""


def _special(address: Address) -> bool:
    """Not an address of the public internet (the ranges a client must not reach through us)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_global or address.is_multicast


@dataclass(frozen=True)
class HostPolicy:
    """The parsed `--mcp-allow-hosts` patterns (see the module's docstring)."""

    names: frozenset[str] = frozenset()  # exact host names, lower case
    suffixes: tuple[str, ...] = ()  # ".example.com" for "*.example.com"
    any_host: bool = False  # "*"
    networks: tuple[Network, ...] = ()
    patterns: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, patterns: Iterable[str]) -> HostPolicy:
        """The policy of the patterns; a pattern that is none of the kinds above raises ValueError."""
        names: set[str] = set()
        suffixes: list[str] = []
        networks: list[Network] = []
        any_host = False
        given = tuple(p.strip() for p in patterns if p.strip())
        for pattern in given:
            text = pattern.lower().strip("[]")
            if text == "*":
                any_host = True
            elif text.startswith("*."):
                suffixes.append("." + _host_name(text[2:], pattern))
            else:
                try:
                    networks.append(ipaddress.ip_network(text, strict=False))
                except ValueError:
                    names.add(_host_name(text, pattern))
        return cls(frozenset(names), tuple(suffixes), any_host, tuple(networks), given)

    @property
    def enabled(self) -> bool:
        return bool(self.patterns)

    def describe(self) -> str:
        return ", ".join(self.patterns) or "none (--mcp-allow-hosts is not set)"

    # -- checks ---------------------------------------------------------------------------------------
    def check_url(self, url: str) -> tuple[str, int]:
        """(host, port) of a URL this policy admits by name; raises HostRefused. No DNS yet."""
        if not self.enabled:
            raise HostRefused(
                "this server connects to no client-named MCP server (--mcp-allow-hosts is not set)"
            )
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise HostRefused(f"{url!r} is not a valid URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HostRefused(f"{url!r} is not an http:// or https:// URL with a host")
        if parts.username is not None or parts.password is not None:
            raise HostRefused("a URL with credentials in it is refused: give them in headers")
        host = parts.hostname.lower().rstrip(".")
        if not self.admits_name(host):
            raise HostRefused(f"host {host!r} is not among the hosts allowed here ({self.describe()})")
        return host, port or (443 if parts.scheme == "https" else 80)

    def admits_name(self, host: str) -> bool:
        literal = literal_address(host)
        if literal is not None:
            return self.any_host or any(literal in net for net in self.networks)
        return self.any_host or host in self.names or any(host.endswith(s) for s in self.suffixes)

    def admits_address(self, host: str, address: Address) -> bool:
        """Whether a connection for `host` may go to `address`."""
        if any(address in net for net in self.networks):
            return True
        if not _special(address):
            return True
        return literal_address(host) is None and host in self.names  # a name the operator listed exactly

    async def resolve(self, host: str, port: int) -> list[Address]:
        """Every address of `host`, each admitted; raises HostRefused naming the first that is not."""
        literal = literal_address(host)
        if literal is not None:
            found: list[Address] = [literal]
        else:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise HostRefused(f"host {host!r} cannot be resolved: {exc}") from None
            found = list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))
        for address in found:
            if not self.admits_address(host, address):
                raise HostRefused(
                    f"host {host!r} resolves to {address}, a loopback, private, link-local or reserved "
                    f"address that is not allowed here ({self.describe()})"
                )
        if not found:
            raise HostRefused(f"host {host!r} has no address")
        return found


def literal_address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _host_name(text: str, pattern: str) -> str:
    labels = text.rstrip(".").split(".")
    if not text or any(not label or not all(c.isalnum() or c == "-" for c in label) for label in labels):
        raise ValueError(f"{pattern!r} is not a host name, *.domain, *, an IP address or a network (CIDR)")
    return text.rstrip(".")


def shown_url(url: str) -> str:
    """scheme://host[:port]/path of a URL: what may be logged or told of it."""
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
