"""Resumable streams: /v1/stream (GET replays and follows, DELETE stops) and /v1/streams/lookup.

Conversation ids travel in the query string or the JSON body, never as a path segment: they are opaque
and may contain `/`, `:` and spaces. Each API key has its own ids (server/http/auth.py's `request_owner`).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint, current_app, request

from server.chat.schemas import StreamLookupRequest
from server.http import errors, sse
from server.http.auth import request_client, request_owner
from server.http.request_body import json_body
from server.model.host import current_model
from server.streams.journal import Recipe, ReplyIds
from server.streams.sessions import SESSIONS_KEY, OffsetDropped, SessionStore

bp = Blueprint("stream", __name__)

_DIGITS = re.compile(r"[0-9]+")


def sessions() -> SessionStore:
    return current_app.extensions[SESSIONS_KEY]


async def resumable(
    conversation_id: str, source: AsyncIterator[bytes], frame: sse.ErrorFrame, recipe: Recipe | None = None
) -> AsyncIterator[bytes]:
    """Run `source` as the session of `conversation_id`; what is returned is one reader of it, so the
    caller's response can end (client gone) while the generation goes on. A failure of `source` ends
    the session with the route's error `frame`, as a live stream's. With --stream-journal, a `recipe`
    (see `stream_recipe`) journals it."""
    owner, client = request_owner(), request_client()
    producer = sse.errors_as_events(source, frame)
    session = await sessions().open(conversation_id, producer, owner, client, recipe)
    return session.follow(0)


async def stream_recipe(route: str, ids: ReplyIds, deterministic: bool) -> Recipe | None:
    """How the request being answered would be made again after a restart (None without
    --stream-journal): `route` names its regenerator (server/app.py), the body is the request's own."""
    if sessions().journals is None:
        return None
    body = await json_body()  # the body as received; it passed the route's validation
    return Recipe(route, body, ids, deterministic, str(current_model().settings.model))


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
