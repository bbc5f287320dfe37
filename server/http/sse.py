"""Server-sent events framing, and the bounded relay every SSE response goes through."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
from quart import Response, current_app

from server.http import errors

log = structlog.get_logger("server")

# app.config key: how many bytes an SSE response may hold for a client that reads slower than they come
# (--stream-buffer-size; server/app.py sets it).
UNREAD_LIMIT_KEY = "llamba.sse_unread_limit"

DONE = b"data: [DONE]\n\n"


def event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def named_event(name: str, payload: Any) -> bytes:
    """An event with its `event:` line (Anthropic's and the Responses API's streams name every event)."""
    return b"event: " + name.encode() + b"\n" + event(payload)


def error_event(body: dict[str, Any]) -> bytes:
    """A stream's closing error, `data: {"error": {...}}`: OpenAI's framing, on which its SDKs raise, and
    llama-server's since ggml-org/llama.cpp#16109. The `error: {...}` line llama-server sent before is a
    field SSE parsers drop: an SDK client saw a stream that merely ended."""
    return event(body)


SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


ErrorFrame = Callable[[errors.APIError], bytes]  # how a route's stream ends on an error


def closing_error(err: errors.APIError) -> bytes:
    """The default ErrorFrame: the error event alone (llama-server's native /completion)."""
    return error_event(err.body())


def response(body: AsyncIterator[bytes], relayed: bool = True, frame: ErrorFrame = closing_error) -> Response:
    """A streaming SSE response; no response timeout: a long generation is not a stuck response. A
    resumable session's reader is not relayed (`relayed=False`): its producer already runs ahead into
    the session's ring, which ends a reader that falls behind it. `frame`: how a failure ends the stream
    (the OpenAI routes add [DONE], Anthropic's route sends its `event: error`)."""
    body = errors_as_events(body, frame)
    if relayed:
        body = relay(body, current_app.config[UNREAD_LIMIT_KEY], frame)
    reply = Response(body, headers=SSE_HEADERS)
    reply.timeout = None
    return reply


async def errors_as_events(
    source: AsyncIterator[bytes], frame: ErrorFrame = closing_error
) -> AsyncIterator[bytes]:
    """`source`'s bytes; a failure after its first byte ends the stream with the route's error `frame`
    instead of a cut connection: an APIError (a failed engine step) as it is, anything else (a bug) as
    a 500, logged, as the app's handler answers it before the first byte."""
    try:
        async for chunk in source:
            yield chunk
    except errors.APIError as exc:
        yield frame(exc)
    except Exception as exc:
        log.exception("stream.failed", error=str(exc))
        yield frame(errors.internal(exc))
    finally:
        await close_quietly(source)


async def close_quietly(source: AsyncIterator[bytes]) -> None:
    """Close an async generator now (running its cleanup: cancelling the engine request, freeing the
    slot), whatever it raises on the way."""
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


async def relay(
    source: AsyncIterator[bytes], limit: int, frame: ErrorFrame = closing_error
) -> AsyncIterator[bytes]:
    """`source`'s bytes, read ahead of the client into a buffer of at most `limit` bytes.

    A generation never waits for its client: the source runs as fast as the engine makes it, however
    slowly the client reads (socket buffers hold the first part). A client so slow that `limit` bytes
    wait for it is cut off: the source is closed (its engine request cancelled, the slot freed) and, after
    the bytes it has not read yet, it gets an error event (a resumable stream's client then resumes from
    its offset). Memory per response stays under `limit` plus one event.
    """
    chunks: deque[bytes] = deque()
    waiting = 0
    done = False
    arrived = asyncio.Event()

    async def pump() -> None:
        nonlocal waiting, done
        try:
            async for chunk in source:
                chunks.append(chunk)
                waiting += len(chunk)
                arrived.set()
                if waiting > limit:
                    log.warning("stream.slow_reader_cut", unread=waiting, limit=limit)
                    message = f"the client read too slowly: {waiting} bytes waited for it (limit {limit})"
                    chunks.append(frame(errors.APIError(408, message, "timeout_error")))
                    return
        finally:
            await close_quietly(source)
            done = True
            arrived.set()

    task = asyncio.get_running_loop().create_task(pump(), name="sse-relay")
    try:
        while True:
            if chunks:
                chunk = chunks.popleft()
                waiting -= len(chunk)
                yield chunk
            elif done:
                break
            else:
                arrived.clear()
                await arrived.wait()
        await task  # the source's own exception, if it raised one
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
