"""A generation's stream as a resumable session (`X-Conversation-Id`): what the chat-shaped routes of
every API family call to make their stream outlive its response, and (with --stream-journal) the
recipe that makes it again after a restart. The /v1/stream routes that read sessions back are
server/streams/routes.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from server.chat.tool_schemas import without_secrets
from server.http import sse
from server.http.auth import request_client, request_owner
from server.http.request_body import json_body
from server.model.host import current_model
from server.state import app_state
from server.streams.journal import Recipe, ReplyIds
from server.streams.sessions import SessionStore


def sessions() -> SessionStore:
    return app_state().sessions


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
    # The body as received (it passed the route's validation), less the secrets of its MCP servers.
    body = without_secrets(await json_body())
    return Recipe(route, body, ids, deterministic, str(current_model().settings.model))
