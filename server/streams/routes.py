"""Resumable streams: /v1/stream (GET replays and follows, DELETE stops) and /v1/streams/lookup.

Conversation ids travel in the query string or the JSON body, never as a path segment: they are opaque
and may contain `/`, `:` and spaces. Each API key has its own ids (server/http/auth.py's `request_owner`).
"""

from __future__ import annotations

import re
from typing import Any

from quart import Blueprint, request

from server.chat.schemas import StreamLookupRequest
from server.http import errors, sse
from server.http.auth import request_owner
from server.http.request_body import json_body
from server.streams.resumable import sessions
from server.streams.sessions import OffsetDropped

bp = Blueprint("stream", __name__)

_DIGITS = re.compile(r"[0-9]+")


@bp.get("/v1/stream")
async def replay() -> Any:
    conversation_id = _conversation_id()
    offset = _offset(request.args.get("from"))
    session = sessions().get(conversation_id, request_owner())
    if session is None:
        raise errors.not_found("Stream not found or expired")
    try:
        session.check_offset(offset)
    except OffsetDropped as exc:
        raise errors.invalid_request(f"'from' {exc}: those bytes were dropped from the buffer") from exc
    return sse.response(session.follow(offset), relayed=False)


@bp.delete("/v1/stream")
async def stop() -> Any:
    await sessions().delete(_conversation_id(), request_owner())
    return "", 204


@bp.post("/v1/streams/lookup")
async def lookup() -> Any:
    body = StreamLookupRequest.model_validate(await json_body())
    return [info.as_dict() for info in sessions().lookup(body.conversation_ids, request_owner())]


def _conversation_id() -> str:
    conversation_id = request.args.get("conv_id")
    if not conversation_id:
        raise errors.invalid_request("missing query parameter 'conv_id'")
    return conversation_id


def _offset(value: str | None) -> int:
    if value is None or value == "":
        return 0
    if not _DIGITS.fullmatch(value):
        raise errors.invalid_request(f"'from' must be a non-negative byte offset, got {value!r}")
    return int(value)
