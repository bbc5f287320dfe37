"""Server-sent events framing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from quart import Response

DONE = b"data: [DONE]\n\n"


def event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def named_event(name: str, payload: Any) -> bytes:
    """An event with its `event:` line (Anthropic's and the Responses API's streams name every event)."""
    return b"event: " + name.encode() + b"\n" + event(payload)


def error_event(body: dict[str, Any]) -> bytes:
    return b"error: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def response(body: AsyncIterator[bytes]) -> Response:
    """A streaming SSE response; no response timeout: a long generation is not a stuck response."""
    reply = Response(body, headers=SSE_HEADERS)
    reply.timeout = None
    return reply
