"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens.

The body is validated (`server/apis/anthropic/schemas.py`) and translated into a chat request, which runs
on the chat path every chat-shaped route shares (`server/chat/job.py`); the token events come back as
Anthropic's content blocks (`server/apis/anthropic/blocks.py`): a whole message, or its stream of named
events (message_start, content_block_start/delta/stop, ping, message_delta, message_stop). With
`mcp_servers` (Anthropic's MCP connector) the server-side tool loop runs (`server/agents/loop.py`): the
MCP calls and their results are `mcp_tool_use` and `mcp_tool_result` blocks of the one message. Errors on
these routes have Anthropic's shape (`ERROR_PREFIX`; see server/http/error_handlers.py).
The `x-api-key` header
carries the API key, and `anthropic-version` is accepted (one version of the API is spoken).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint, request

from engine.api import TokenEvent
from server.agents.loop import AgentPlan, AgentRun, ToolExecuted, agent_plan
from server.agents.requests import request_context
from server.apis.anthropic.blocks import ContentBlocks, StreamEvent
from server.apis.anthropic.schemas import CountTokensRequest, MessagesRequest
from server.chat.generation import replayable
from server.chat.job import ChatJob, chat_tokens, prepare_chat
from server.chat.schemas import ChatCompletionRequest
from server.http import errors, sse
from server.http.error_handlers import ANTHROPIC_PREFIX
from server.http.request_body import json_body
from server.model.host import ModelHost, current_model
from server.state import app_state
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
    model.require_ready()
    plan = await mcp_plan(model, body)
    if plan is not None:
        return await agent_message(model, body, plan, message_id)
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
        "content": content,
        "model": model.settings.model_alias,
        "stop_reason": None,
        "stop_sequence": None,
    }


def message_start(model: ModelHost, message_id: str, n_prompt: int, first: TokenEvent) -> StreamEvent:
    """The stream's message_start, sent with the engine's first event (as llama-server sends it with the
    first token, the prompt cache's share known): its usage is llama-server's, the prompt's tokens the
    cache held apart from those that run."""
    if first.progress is not None:
        cached = first.progress.cache
    else:
        cached = first.timings.cache_n if first.timings else 0
    usage = {"cache_read_input_tokens": cached, "input_tokens": n_prompt - cached, "output_tokens": 0}
    return "message_start", {
        "type": "message_start",
        "message": message_object(model, message_id, []) | {"usage": usage},
    }


def message_delta(end: dict[str, Any]) -> StreamEvent:
    """The stream's message_delta: why it ended, and (as llama-server's) the output tokens alone."""
    delta = {"stop_reason": end["stop_reason"], "stop_sequence": end["stop_sequence"]}
    usage = {"output_tokens": end["usage"]["output_tokens"]}
    return "message_delta", {"type": "message_delta", "delta": delta, "usage": usage}


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
    """Anthropic's event stream: message_start with the engine's first event, then a ping on every
    prompt-progress update (the start, each prompt chunk processed), so a long prompt does not look like
    a stalled connection."""
    blocks = ContentBlocks()
    final: TokenEvent | None = None
    started = False
    async for event in model.client.events(job.request):
        if not started and event.finish_reason not in ("error", "cancelled"):
            yield send(message_start(model, message_id, job.n_prompt, event))
            started = True
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
    yield send(message_delta(ending(body, blocks, final, job.n_prompt)))
    yield send(("message_stop", {"type": "message_stop"}))


# -- the MCP connector: a server-side tool loop -----------------------------------------------------------
# The chat `mcp` tool's fields, as the MCP connector names them (its errors name the request's own fields).
CONNECTOR_FIELDS = {
    "server_url": "url",
    "server_label": "name",
    "allowed_tools": "tool_configuration.allowed_tools",
    "headers": "authorization_token",
}


async def mcp_plan(model: ModelHost, body: MessagesRequest) -> AgentPlan | None:
    """The tool loop's plan of a body with `mcp_servers` (None without); its 4xx name the body's
    fields (`mcp_servers.<i>.url`, ...)."""
    if not body.mcp_servers:
        return await agent_plan(app_state().toolbox, model.settings, chat_request(body), request_context)
    if app_state().toolbox is None:
        raise errors.invalid_request(
            "'mcp_servers': this server runs no MCP servers (configure them with --mcp-servers-config, "
            "or allow hosts a request may name with --mcp-allow-hosts)"
        )
    try:
        return await agent_plan(app_state().toolbox, model.settings, chat_request(body), request_context)
    except errors.APIError as exc:
        field = exc.message.split("'")[1] if exc.message.startswith("'") else ""
        if field not in CONNECTOR_FIELDS:
            raise
        names = [server.name for server in body.mcp_servers]
        at = next((i for i, name in enumerate(names) if repr(name) in exc.message), None)
        place = f"mcp_servers.{at}" if at is not None else "mcp_servers"
        exc.message = f"'{place}.{CONNECTOR_FIELDS[field]}'" + exc.message[len(field) + 2 :]
        raise


async def agent_message(model: ModelHost, body: MessagesRequest, plan: AgentPlan, message_id: str) -> Any:
    """A message whose MCP servers Llamba runs (server/agents/loop.py): one message, or one stream, for
    the whole run, its MCP calls and results as mcp_tool_use and mcp_tool_result blocks."""
    toolbox = app_state().toolbox
    assert toolbox is not None  # agent_plan refuses mcp servers without a toolbox

    async def prepare(round_body: ChatCompletionRequest, answer_only: bool) -> ChatJob:
        return await prepare_chat(model, round_body, message_id, answer_only)

    run = AgentRun(model, chat_request(body), plan, toolbox, prepare)
    first = await run.start()  # the first round's 400s come before any byte
    if body.stream:  # not run again after a restart: its MCP calls act on the world
        return sse.response(agent_stream(model, body, run, message_id, first.n_prompt), frame=error_event)
    blocks = ContentBlocks(plan.tools)
    async with contextlib.aclosing(run.events()) as events:
        async for item in events:
            if isinstance(item, ToolExecuted):
                blocks.tool_result(item)
            elif isinstance(item, TokenEvent):
                blocks.feed(item)
    final = run.final_outcome().final
    if run.error is not None:
        raise run.error
    if final is None or final.finish_reason == "error":
        raise errors.APIError(500, (final.error if final else None) or "generation failed", "server_error")
    return message_object(model, message_id, blocks.content()) | run_ending(body, blocks, final, run)


async def agent_stream(
    model: ModelHost, body: MessagesRequest, run: AgentRun, message_id: str, n_prompt: int
) -> AsyncIterator[bytes]:
    blocks = ContentBlocks(run.plan.tools)
    started = False
    async with contextlib.aclosing(run.events()) as events:
        async for item in events:
            if (
                not started
                and isinstance(item, TokenEvent)
                and item.finish_reason not in ("error", "cancelled")
            ):
                yield send(message_start(model, message_id, n_prompt, item))
                started = True
            if isinstance(item, ToolExecuted):
                out = blocks.tool_result(item)
            elif isinstance(item, TokenEvent):
                out = [PING] if item.progress is not None else blocks.feed(item)
            else:
                out = []
            for event in out:
                yield send(event)
    final = run.final_outcome().final
    if run.error is not None or final is None or final.finish_reason in ("error", "cancelled"):
        message = (
            run.error.message if run.error else (final.error if final else None) or "the run ended early"
        )
        yield send(("error", errors.anthropic_body(errors.APIError(500, message, "server_error"))))
        return
    for event in blocks.close():
        yield send(event)
    yield send(message_delta(run_ending(body, blocks, final, run)))
    yield send(("message_stop", {"type": "message_stop"}))


def run_ending(
    body: MessagesRequest, blocks: ContentBlocks, final: TokenEvent, run: AgentRun
) -> dict[str, Any]:
    """`ending`, with the usage of all the run's rounds (each round's prompt counts)."""
    end = ending(body, blocks, final, 0)
    usage = run.usage()
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    end["usage"] = {
        "input_tokens": usage["prompt_tokens"] - cached,
        "cache_read_input_tokens": cached,
        "output_tokens": usage["completion_tokens"],
    }
    return end


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
