"""llama-server's `-to/--timeout`: its HTTP library's read and write timeouts, as ASGI middleware.

llama-server (cpp-httplib) gives up on a request whose bytes stop arriving for N seconds while it reads
it, and on a response whose write blocks for N seconds (a client that stopped reading). Hypercorn's own
`read_timeout` is not that: it bounds every socket read, including the wait while a long answer streams
to a client that has nothing more to send, so it would cut generations longer than N seconds. Here the
request body is read with N seconds per message before the app sees it (on expiry: 408 and the
connection closes; past BUFFERED bytes the rest goes to the app as it comes, still N seconds a message,
and a stall reads as the client's disconnect, so the app's own body limit still applies), and every
response message the app sends may block at most N seconds (on expiry the send raises, the app's
response ends, a generation's engine request is cancelled with it and hypercorn closes the
connection)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
BUFFERED = 1 << 20  # request bytes read ahead of the app; a larger body streams to it


class IoTimeouts:
    def __init__(self, app: App, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            head, complete = await self._read_body(receive)
        except TimeoutError:
            await _request_timeout(send)
            return
        rest = receive if complete else self._timed(receive)
        await self.app(scope, _replay(head, rest), self._bounded(send))

    async def _read_body(self, receive: Receive) -> tuple[list[Message], bool]:
        """The request's messages up to its last body part (or a disconnect) or BUFFERED bytes, N
        seconds each; and whether that was the whole body."""
        messages: list[Message] = []
        size = 0
        while size <= BUFFERED:
            async with asyncio.timeout(self.seconds):
                message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if _last(message):
                return messages, True
        return messages, False

    def _timed(self, receive: Receive) -> Receive:
        """The rest of a large body, N seconds a message (a stall is a disconnect), then the plain
        connection's messages."""
        done = False

        async def timed_receive() -> Message:
            nonlocal done
            if done:
                return await receive()
            try:
                async with asyncio.timeout(self.seconds):
                    message = await receive()
            except TimeoutError:
                message = {"type": "http.disconnect"}
            done = _last(message)
            return message

        return timed_receive

    def _bounded(self, send: Send) -> Send:
        async def bounded_send(message: Message) -> None:
            async with asyncio.timeout(self.seconds):
                await send(message)

        return bounded_send


def _last(message: Message) -> bool:
    return message["type"] != "http.request" or not message.get("more_body", False)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """The body's messages again, then the connection's own (a disconnect, while a response streams)."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


async def _request_timeout(send: Send) -> None:
    body = json.dumps(
        {
            "error": {
                "code": 408,
                "message": "the request body did not arrive in time",
                "type": "timeout_error",
            }
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 408, "headers": headers})
    await send({"type": "http.response.body", "body": body})
