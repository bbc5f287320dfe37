"""Newline-delimited JSON streams (Ollama's API): one JSON object per line, read ahead of the client by the
same bounded relay as an SSE stream (server/http/sse.py), a failure after the first byte as a last
`{"error": "..."}` line, as Ollama ends a stream that fails."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from quart import Response, current_app

from server.http import errors, sse

NDJSON_HEADERS = {**sse.SSE_HEADERS, "Content-Type": "application/x-ndjson"}


def line(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def error_line(err: errors.APIError) -> bytes:
    return line({"error": err.message})


def response(body: AsyncIterator[bytes]) -> Response:
    """A streaming NDJSON response; no response timeout (a long generation is not a stuck response)."""
    body = sse.errors_as_events(body, error_line)
    body = sse.relay(body, current_app.config[sse.UNREAD_LIMIT_KEY], error_line)
    reply = Response(body, headers=NDJSON_HEADERS)
    reply.timeout = None
    return reply
