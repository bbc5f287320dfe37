"""The router's HTTP/1.1 client to its children, on asyncio streams.

Every streamed event crosses the router, and on a small machine the router's CPU is taken from the
children's engines. With httpx (over httpcore, anyio and h11) reading the child's chunks was most of the
proxy's cost: cProfile of `scripts/bench_proxy.py` put ~5x more time in that stack than in writing the
event on to the client; router CPU per event went from ~120 us with httpx to ~50-65 us with this client.
The children are Llamba's own servers on 127.0.0.1, so the router speaks the little HTTP/1.1 it needs
itself: a request with its Content-Length, and an answer framed by Content-Length, chunked transfer or the
connection's close; connections kept alive per child for the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 10.0
HEAD_LIMIT = 1 << 20  # a response head or chunk-size line longer than this is refused
READ_SIZE = 1 << 16


class UpstreamError(Exception):
    """The child could not be reached, or broke off its answer."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class UpstreamClient:
    """Keep-alive connections to the children, `max_idle` per child at most."""

    def __init__(self, max_idle: int = 64) -> None:
        self.max_idle = max_idle
        self._idle: dict[str, list[Connection]] = {}

    async def send(
        self, url: str, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> UpstreamResponse:
        """The answer's head (its body not yet read). A kept-alive connection the child has closed in
        the meantime is replaced once, transparently."""
        address = urlsplit(url)
        lines = [f"{method} {target} HTTP/1.1", f"Host: {address.netloc}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        while True:
            conn, reused = await self._connection(url, address.hostname or "", address.port or 80)
            try:
                conn.writer.write(request)
                await conn.writer.drain()
                head = await conn.reader.readuntil(b"\r\n\r\n")
                break
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                conn.close()
                if not reused:
                    raise UpstreamError(str(exc) or type(exc).__name__) from None
        return UpstreamResponse(self, url, conn, method, head)

    async def _connection(self, url: str, host: str, port: int) -> tuple[Connection, bool]:
        idle = self._idle.get(url)
        if idle:
            return idle.pop(), True
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=HEAD_LIMIT), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(str(exc) or type(exc).__name__) from None
        return Connection(reader, writer), False

    def keep(self, url: str, conn: Connection) -> None:
        idle = self._idle.setdefault(url, [])
        if len(idle) < self.max_idle:
            idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


class UpstreamResponse:
    """A child's answer: status, headers, and its body read chunk by chunk (`next_chunk`)."""

    def __init__(self, client: UpstreamClient, url: str, conn: Connection, method: str, head: bytes) -> None:
        self._client, self._url, self._conn = client, url, conn
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        try:
            self.status_code = int(status_line.split(" ", 2)[1])
        except (IndexError, ValueError):
            conn.close()
            raise UpstreamError(f"not an HTTP answer: {status_line[:80]!r}") from None
        self.headers = [(k.strip(), v.strip()) for k, _, v in (h.partition(":") for h in header_lines)]
        self._chunked = "chunked" in (self.header("transfer-encoding") or "").lower()
        length = self.header("content-length")
        self._left = int(length) if length is not None and not self._chunked else None
        if method == "HEAD" or self.status_code in (204, 304) or self.status_code < 200:
            self._left = 0
        self._reusable = (self._chunked or self._left is not None) and (
            (self.header("connection") or "").lower() != "close"
        )
        self._done = self._left == 0
        self._closed = False

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    async def next_chunk(self) -> bytes:
        """The body's next bytes as they came (one chunk of a chunked answer); b"" at its end."""
        if self._done:
            return b""
        try:
            data = await self._read()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self._reusable = False
            raise UpstreamError(f"the answer was broken off: {exc or type(exc).__name__}") from None
        if not data:
            self._done = True
        return data

    async def _read(self) -> bytes:
        reader = self._conn.reader
        if self._chunked:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers: none from a child, skipped if any
                return b""
            return (await reader.readexactly(size + 2))[:-2]
        if self._left is None:  # to the connection's close
            return await reader.read(READ_SIZE)
        if self._left == 0:
            return b""
        data = await reader.read(min(self._left, READ_SIZE))
        if not data:
            raise asyncio.IncompleteReadError(b"", self._left)
        self._left -= len(data)
        return data

    async def aread(self) -> bytes:
        parts = []
        while data := await self.next_chunk():
            parts.append(data)
        return b"".join(parts)

    async def aclose(self) -> None:
        """Give the connection back for reuse if the body was read to its end, else close it (the child
        sees its client leave)."""
        if self._closed:
            return
        self._closed = True
        if self._done and self._reusable:
            self._client.keep(self._url, self._conn)
        else:
            self._conn.close()
