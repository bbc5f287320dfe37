"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}, and
POST /v1/responses/{id}/cancel (and unprefixed aliases).

The body is validated and translated into a chat request (`server/apis/responses/schemas.py`), after the
stored conversation its `previous_response_id` continues; it runs on the chat path every chat-shaped
route shares (`server/chat/job.py`), and its token events become output items and numbered stream
events (`server/apis/responses/output.py`, `server/apis/responses/runs.py`); with `mcp` tools it runs the
server-side tool loop (`server/agents/loop.py`) the same way. Responses are stored
(`server/apis/responses/store.py`) unless `store` is false. A `background` response runs on its own as a
stream session: the POST answers at once, GET follows it (`stream=true`, from `starting_after`), and
cancel stops it. Errors have OpenAI's shape.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from quart import Blueprint, request

from server.agents.loop import AgentPlan, AgentRun, agent_plan
from server.agents.requests import request_context
from server.apis.responses.approvals import check_answers, settle_approvals
from server.apis.responses.output import item_id
from server.apis.responses.runs import (
    ResponseRun,
    ResponsesState,
    RunContext,
    response_object,
    run_events,
)
from server.apis.responses.schemas import ResponsesRequest
from server.apis.responses.store import StoredResponse
from server.chat.job import ChatJob, chat_tokens, input_tokens, prepare_chat
from server.chat.schemas import ChatCompletionRequest
from server.http import errors, sse
from server.http.auth import request_client
from server.http.request_body import json_body
from server.model.host import ModelHost, current_model
from server.state import app_state
from server.streams.resumable import sessions

bp = Blueprint("responses", __name__)

_SEQUENCE = re.compile(r"-?[0-9]+")


def responses() -> ResponsesState:
    return app_state().responses


@bp.post("/v1/responses")
@bp.post("/responses")
async def create() -> Any:
    model, state = current_model(), responses()
    state.prune(lambda rid: sessions().get(rid) is not None)
    body = ResponsesRequest.model_validate(await json_body())
    history = state.conversation(body.previous_response_id)
    conversation = history + body.input_messages(history)
    check_answers(body, conversation)
    response_id = item_id("resp")  # also the engine request id, and a background run's session id
    chat = body.to_chat(conversation, stream=body.stream or body.background)
    plan = await tool_plan(model, chat, body.max_tool_calls)
    approved = await settle_approvals(body, conversation, plan, app_state().toolbox)
    chat = body.to_chat(conversation, stream=body.stream or body.background)  # with the approvals' results
    agent = tool_loop(model, chat, plan, response_id)
    job = await (agent.start() if agent is not None else prepare_chat(model, chat, response_id))
    run = ResponseRun(response_object(model, body, response_id, job), body.background)
    ctx = RunContext(model, state, job, conversation, body.store, agent, approved)
    source = run_events(ctx, run)
    if body.background:  # its session's task starts once this handler gives way: all is in place then
        # Response ids are unique and global (as the stored responses are); the client's cap still counts.
        session = await sessions().open(response_id, source, client=request_client())
        state.runs[response_id] = run
    if body.store:
        state.store.put(StoredResponse(run.snapshot, conversation))
    if body.background:
        return sse.response(session.follow(0), relayed=False) if body.stream else dict(run.snapshot)
    if body.stream:
        return sse.response(source)
    async for _ in source:  # a whole reply: the same events, drained
        pass
    return run.snapshot


@bp.post("/v1/responses/input_tokens")
@bp.post("/responses/input_tokens")
async def count_input_tokens() -> Any:
    """OpenAI's count of a Responses body's input tokens, after the stored conversation it continues."""
    body = ResponsesRequest.model_validate(await json_body())
    history = responses().conversation(body.previous_response_id)
    chat = body.to_chat(history + body.input_messages(history), stream=False)
    return input_tokens(len(await chat_tokens(current_model(), chat)))


async def tool_plan(model: ModelHost, chat: ChatCompletionRequest, max_calls: int | None) -> AgentPlan | None:
    """The server-side tool loop's plan of a request with `mcp` tools (None without); every problem
    with them (a server_label not configured, a server_url not allowed) is a 4xx here. Calls may wait
    for the client's approval (`require_approval`: mcp_approval_request items)."""
    model.require_ready()
    plan = await agent_plan(app_state().toolbox, model.settings, chat, request_context, approvals=True)
    if plan is not None and max_calls is not None:
        plan = replace(plan, limits=replace(plan.limits, max_calls=max_calls))
    return plan


def tool_loop(
    model: ModelHost, chat: ChatCompletionRequest, plan: AgentPlan | None, response_id: str
) -> AgentRun | None:
    toolbox = app_state().toolbox
    if plan is None or toolbox is None:
        return None

    async def prepare(round_body: ChatCompletionRequest, answer_only: bool) -> ChatJob:
        return await prepare_chat(model, round_body, response_id, answer_only)

    return AgentRun(model, chat, plan, toolbox, prepare)


@bp.get("/v1/responses/<response_id>")
@bp.get("/responses/<response_id>")
async def retrieve(response_id: str) -> Any:
    state = responses()
    entry = state.store.get(response_id)
    if request.args.get("stream", "false").lower() not in ("true", "1"):
        if entry is None:
            raise errors.not_found(f"No response found with id {response_id!r}")
        return entry.response
    run, session = state.runs.get(response_id), sessions().get(response_id)
    if run is None or session is None:
        if entry is None:
            raise errors.not_found(f"No response found with id {response_id!r}")
        raise errors.invalid_request(
            f"response {response_id!r} cannot be streamed: only background responses can, while their "
            "events are kept (--stream-ttl seconds after they end)"
        )
    offset = await run.offset_after(starting_after(request.args.get("starting_after")))
    session.check_offset(offset)
    return sse.response(session.follow(offset), relayed=False)


def starting_after(value: str | None) -> int:
    if value is None or value == "":
        return -1
    if not _SEQUENCE.fullmatch(value):
        raise errors.invalid_request(f"'starting_after' must be an event's sequence number, got {value!r}")
    return int(value)


@bp.post("/v1/responses/<response_id>/cancel")
@bp.post("/responses/<response_id>/cancel")
async def cancel(response_id: str) -> Any:
    """Stop a background response (a finished one is returned as it is)."""
    state = responses()
    entry = state.store.get(response_id)
    if entry is None:
        raise errors.not_found(f"No response found with id {response_id!r}")
    if not entry.response.get("background"):
        raise errors.invalid_request("Only responses created with background true can be cancelled")
    session = sessions().get(response_id)
    if session is not None and not session.is_done:
        await session.cancel()
    return entry.response


@bp.delete("/v1/responses/<response_id>")
@bp.delete("/responses/<response_id>")
async def delete(response_id: str) -> Any:
    """Delete a stored response (stopping it first if it still runs in the background)."""
    state = responses()
    if state.store.get(response_id) is None:
        raise errors.not_found(f"No response found with id {response_id!r}")
    if response_id in state.runs:
        await sessions().delete(response_id)
        state.runs.pop(response_id, None)
    state.store.delete(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}
