"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens.

The body is validated (`server/apis/anthropic/schemas.py`) and translated into a chat request, which runs
on the chat path every chat-shaped route shares (`server/chat/job.py`); the token events come back as
Anthropic's content blocks (`server/apis/anthropic/blocks.py`): a whole message, or its stream of named
events (message_start, content_block_start/delta/stop, ping, message_delta, message_stop). Errors on
these routes have Anthropic's shape (`ERROR_PREFIX`; see server/http/error_handlers.py).
The `x-api-key` header
carries the API key, and `anthropic-version` is accepted (one version of the API is spoken).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint, request

from engine.api import TokenEvent
from server.apis.anthropic.blocks import ContentBlocks, StreamEvent
from server.apis.anthropic.schemas import CountTokensRequest, MessagesRequest
from server.chat.generation import replayable
from server.chat.job import ChatJob, chat_tokens, prepare_chat
from server.chat.schemas import ChatCompletionRequest
from server.http import errors, sse
from server.http.error_handlers import ANTHROPIC_PREFIX
from server.http.request_body import json_body
from server.model.host import ModelHost, current_model
from server.streams.journal import Recipe, ReplyIds
from server.streams.resumable import resumable, stream_recipe
from server.streams.sessions import CONVERSATION_HEADER

bp = Blueprint("anthropic", __name__)

ERROR_PREFIX = ANTHROPIC_PREFIX  # every route here answers errors in Anthropic's shape
PING = ("ping", {"type": "ping"})


@bp.post("/v1/messages")
async def messages() -> Any:
    model = current_model()
    body = MessagesRequest.model_validate(await json_body())
    ids = ReplyIds.fresh("msg", "_")  # the id is also the engine request id
    message_id = ids.reply_id
    job = await prepare_chat(model, chat_request(body), message_id)
    if body.stream:
        stream = message_stream(model, body, job, message_id)
        conversation_id = request.headers.get(CONVERSATION_HEADER)
        if conversation_id:  # a resumable session: the generation outlives this response
            recipe = await stream_recipe("messages", ids, replayable(job.request))
            session = await resumable(conversation_id, stream, error_event, recipe)
            return sse.response(session, relayed=False, frame=error_event)
        return sse.response(stream, frame=error_event)
    blocks = ContentBlocks()
    final: TokenEvent | None = None
    async for event in model.client.events(job.request):
        blocks.feed(event)
        final = event if event.finish_reason is not None else final
    if final is None or final.finish_reason == "error":
        raise errors.APIError(500, (final.error if final else None) or "generation failed", "server_error")
    return message_object(model, message_id, blocks.content()) | ending(body, blocks, final, job.n_prompt)


@bp.post("/v1/messages/count_tokens")
async def count_tokens() -> Any:
    model = current_model()
    body = CountTokensRequest.model_validate(await json_body())
    return {"input_tokens": len(await chat_tokens(model, body.to_chat()))}


def chat_request(body: MessagesRequest) -> ChatCompletionRequest:
    """The chat a message body runs as; a stream's asks for prompt progress (its pings on a long
    prompt)."""
    chat = body.to_chat(stream=body.stream)
    return chat.model_copy(update={"return_progress": True}) if body.stream else chat


def message_object(model: ModelHost, message_id: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model.settings.model_alias,
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
    }


def ending(body: MessagesRequest, blocks: ContentBlocks, final: TokenEvent, n_prompt: int) -> dict[str, Any]:
    """Why the message ended (stop_reason, stop_sequence) and its usage: input tokens are those the
    prompt cache did not hold, as Anthropic counts them (cache reads apart)."""
    stop_sequence = final.stop_word if final.stop_word in (body.stop_sequences or ()) else None
    if final.finish_reason == "length":
        reason = "max_tokens"
    elif blocks.has_tool_use or final.finish_reason == "tool_calls":
        reason = "tool_use"
    else:
        reason = "stop_sequence" if stop_sequence is not None else "end_turn"
    t = final.timings
    cached = t.cache_n if t else 0
    usage = {
        "input_tokens": n_prompt - cached,
        "cache_read_input_tokens": cached,
        "output_tokens": t.predicted_n if t else 0,
    }
    return {"stop_reason": reason, "stop_sequence": stop_sequence, "usage": usage}


async def message_stream(
    model: ModelHost, body: MessagesRequest, job: ChatJob, message_id: str
) -> AsyncIterator[bytes]:
    """Anthropic's event stream; a ping after message_start and on every prompt chunk processed, so a
    long prompt does not look like a stalled connection."""
    start = message_object(model, message_id, []) | {
        "usage": {"input_tokens": job.n_prompt, "output_tokens": 0}
    }
    yield send(("message_start", {"type": "message_start", "message": start}))
    yield send(PING)
    blocks = ContentBlocks()
    final: TokenEvent | None = None
    async for event in model.client.events(job.request):
        if event.progress is not None:
            yield send(PING)
            continue
        for item in blocks.feed(event):
            yield send(item)
        final = event if event.finish_reason is not None else final
    if final is None or final.finish_reason in ("error", "cancelled"):
        message = (final.error if final else None) or "generation ended without finishing"
        err = errors.APIError(500, message, "server_error")
        yield send(("error", errors.anthropic_body(err)))
        return
    for item in blocks.close():
        yield send(item)
    end = ending(body, blocks, final, job.n_prompt)
    delta = {"stop_reason": end["stop_reason"], "stop_sequence": end["stop_sequence"]}
    yield send(("message_delta", {"type": "message_delta", "delta": delta, "usage": end["usage"]}))
    yield send(("message_stop", {"type": "message_stop"}))


async def regenerate_messages(model: ModelHost, recipe: Recipe) -> AsyncIterator[bytes]:
    """A journaled message stream made again after a restart (server/streams/resume.py)."""
    body = MessagesRequest.model_validate(recipe.body)
    message_id = recipe.ids.reply_id
    job = await prepare_chat(model, chat_request(body), message_id)
    return message_stream(model, body, job, message_id)


def error_event(error: errors.APIError) -> bytes:
    return send(("error", errors.anthropic_body(error)))


def send(item: StreamEvent) -> bytes:
    return sse.named_event(*item)
