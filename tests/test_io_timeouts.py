"""-to/--timeout's write bound on the ASGI middleware itself (its read bound and the streams it must not
cut are checked on a real server in tests/test_llama_server_flags.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from server.http.io_timeouts import BUFFERED, IoTimeouts


async def _app(scope: Any, receive: Any, send: Any) -> None:
    body = (await receive())["body"]
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await send({"type": "http.response.body", "body": b"end"})


def test_a_write_that_blocks_longer_than_the_timeout_ends_the_response() -> None:
    """The stand-in `send` blocks on its second body part: a client that stopped reading. A real one
    cannot be made to block in a test's time: localhost socket buffers take megabytes of SSE."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        if message.get("body") == b"end":
            await asyncio.sleep(60)
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b"hi", "more_body": False}

    async def run() -> None:
        await IoTimeouts(_app, 0.2)({"type": "http"}, receive, send)

    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(run(), 5))
    assert [m.get("body") for m in sent] == [None, b"hi"]


def test_a_body_that_stops_arriving_is_a_408_and_the_app_never_runs() -> None:
    sent: list[Any] = []
    parts = [{"type": "http.request", "body": b"{", "more_body": True}]

    async def receive() -> Any:
        if parts:
            return parts.pop()
        await asyncio.sleep(60)

    async def send(message: Any) -> None:
        sent.append(message)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the app ran on an incomplete body")

    asyncio.run(asyncio.wait_for(IoTimeouts(app, 0.2)({"type": "http"}, receive, send), 5))
    assert sent[0]["status"] == 408 and b"did not arrive in time" in sent[1]["body"]


def test_a_large_body_streams_to_the_app_and_a_stall_reads_as_a_disconnect() -> None:
    """Past BUFFERED bytes the app reads the rest itself (its own body limit applies), each part still
    bounded: a stall is a disconnect, not an endless wait."""
    part = b"x" * (BUFFERED // 2)
    parts = [{"type": "http.request", "body": part, "more_body": True} for _ in range(3)]
    seen: list[Any] = []

    async def receive() -> Any:
        if parts:
            return parts.pop()
        await asyncio.sleep(60)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (message := await receive())["type"] == "http.request":
            seen.append(len(message["body"]))
        seen.append(message["type"])

    async def send(message: Any) -> None:
        raise AssertionError("nothing is sent")

    asyncio.run(asyncio.wait_for(IoTimeouts(app, 0.2)({"type": "http"}, receive, send), 5))
    assert seen == [len(part)] * 3 + ["http.disconnect"]
