"""Responses API responses as they run: the Response object, its numbered stream events, and the store
kept up to date with both.

One event source serves every way a response is asked for: a stream reads it as it comes, a whole
reply drains it, and a background response runs it as a resumable stream session
(`server/streams/sessions.py`, keyed by the response id), whose readers join at any event: each event's byte
offset in the stream is kept, so `starting_after=N` replays exactly the bytes an uninterrupted stream
had from event N+1 on.

A response with `mcp` tools runs the server-side tool loop (`AgentRun`, server/agents/loop.py) instead of
one generation: the same stream, its rounds' token events and the MCP calls' results between them
(`mcp_list_tools` and `mcp_call` items), the usage summed over the rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from engine.api import TokenEvent
from server.agents.loop import AgentRun, ToolExecuted
from server.apis.responses.approvals import Approved
from server.apis.responses.output import OutputItems, output_messages
from server.apis.responses.schemas import ResponsesRequest
from server.apis.responses.store import ResponseStore, StoredResponse
from server.chat.job import ChatJob
from server.http import errors, sse
from server.model.host import ModelHost

log = structlog.get_logger("server")


@dataclass(eq=False)
class ResponseRun:
    """One response being generated: its Response object, kept current, and its events' offsets."""

    snapshot: dict[str, Any]
    background: bool
    offsets: list[int] = field(default_factory=list)  # byte offset of event n in the stream
    size: int = 0
    done: bool = False
    # Replaced on every event; a reader waiting for a later event waits on the one it saw.
    _grew: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def frame(self, payload: dict[str, Any]) -> bytes:
        """The next event, numbered, as SSE bytes."""
        payload["sequence_number"] = len(self.offsets)
        data = sse.named_event(payload["type"], payload)
        self.offsets.append(self.size)
        self.size += len(data)
        self._notify()
        return data

    def end(self) -> None:
        self.done = True
        self._notify()

    def _notify(self) -> None:
        grew, self._grew = self._grew, asyncio.Event()
        grew.set()

    async def offset_after(self, sequence_number: int) -> int:
        """Where the events after `sequence_number` start; a number the run has not reached yet is
        waited for (400 if it never comes)."""
        following = sequence_number + 1
        while following > len(self.offsets) and not self.done:
            await self._grew.wait()
        if not 0 <= following <= len(self.offsets):
            raise errors.invalid_request(
                f"'starting_after': {sequence_number} is not an event of this response "
                f"(it has {len(self.offsets)}, numbered from 0)"
            )
        return self.offsets[following] if following < len(self.offsets) else self.size


class ResponsesState:
    """The store and the runs a background response can be resumed from."""

    def __init__(self, store: ResponseStore) -> None:
        self.store = store
        self.runs: dict[str, ResponseRun] = {}

    def prune(self, alive: Callable[[str], bool]) -> None:
        """Forget finished runs whose stream session is gone (its events no longer kept)."""
        for response_id in [rid for rid, run in self.runs.items() if run.done and not alive(rid)]:
            del self.runs[response_id]

    def conversation(self, previous_id: str | None) -> list[dict[str, Any]]:
        """The stored conversation `previous_response_id` continues (400 when there is none)."""
        if previous_id is None:
            return []
        entry = self.store.get(previous_id)
        if entry is None:
            raise errors.invalid_request(
                f"'previous_response_id': no stored response {previous_id!r} (unknown, deleted, or "
                "created with store false)"
            )
        if entry.response.get("status") in ("queued", "in_progress"):
            raise errors.invalid_request(f"'previous_response_id': {previous_id!r} has not finished yet")
        return [dict(message) for message in entry.messages]


def response_object(
    model: ModelHost, body: ResponsesRequest, response_id: str, job: ChatJob
) -> dict[str, Any]:
    """The Response object before any output: what was asked, as the API echoes it."""
    sampling = job.request.sampling
    choice = body.tool_choice
    text_format = body.text.format if body.text is not None else None
    reasoning = body.reasoning
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "queued" if body.background else "in_progress",
        "background": body.background,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "metadata": body.metadata or {},
        "model": model.settings.model_alias,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": reasoning.effort, "summary": reasoning.summary} if reasoning else None,
        "store": body.store,
        "temperature": sampling.temperature,
        "text": {
            "format": text_format.model_dump(by_alias=True, exclude_none=True)
            if text_format
            else {"type": "text"},
            "verbosity": "medium",
        },
        "tool_choice": (choice or "auto")
        if choice is None or isinstance(choice, str)
        else choice.model_dump(),
        # A request-named MCP server's headers are secrets: never echoed, never stored.
        "tools": [
            tool.model_dump(exclude_none=True, exclude={"headers", "authorization"})
            for tool in body.tools or ()
        ],
        "top_p": sampling.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
    }


@dataclass(frozen=True)
class RunContext:
    """What a run needs besides its own state: the model, the store, the prepared chat job (the
    first round's, with mcp tools), the conversation so far (stored with the output appended, when the
    response is stored), and the tool loop when the request has mcp tools."""

    model: ModelHost
    state: ResponsesState
    job: ChatJob
    conversation: list[dict[str, Any]]
    store: bool
    agent: AgentRun | None = None
    approved: list[Approved] = field(default_factory=list)  # approved calls that ran before the rounds


@dataclass
class RunEnd:
    """How the generation ended: its last event (the finish reason the run's), and any error."""

    final: TokenEvent | None = None
    error: str | None = None


async def run_events(ctx: RunContext, run: ResponseRun) -> AsyncIterator[bytes]:
    """The response's stream events, numbered from 0; the Response object and the store follow them.
    A run stopped before its end (cancel, a client gone) is stored as cancelled."""
    snap = run.snapshot
    items = OutputItems(ctx.agent.plan.tools, ctx.agent.plan.approval) if ctx.agent else OutputItems()
    try:
        yield run.frame({"type": "response.created", "response": snap})
        snap["status"] = "in_progress"
        yield run.frame({"type": "response.in_progress", "response": snap})
        end = RunEnd()
        for payload in items.list_tools():
            yield run.frame(payload)
        for approved in ctx.approved:
            for payload in items.approved_call(approved.executed, approved.tool, approved.request_id):
                yield run.frame(payload)
        snap["output"] = items.finished()
        try:
            async with contextlib.aclosing(generation(ctx, end)) as events:
                async for event in events:
                    for payload in event_payloads(ctx, items, snap, event):
                        if payload["type"] == "response.output_item.done":  # what GET shows meanwhile
                            snap["output"] = items.finished()
                        yield run.frame(payload)
        # A failure mid-run ends the response with its own events and stores it as failed, not cut.
        except errors.APIError as exc:
            end.error = exc.message
        except Exception as exc:
            log.exception("response.failed", error=str(exc))
            end.error = errors.internal(exc).message
        status = "failed" if end.error else terminal_status(end.final)
        closing = items.close("completed" if status == "completed" else "incomplete")  # cut: incomplete
        for payload in closing + items.abandon_calls():
            yield run.frame(payload)
        finish(ctx, run, items, end, status)
        if status != "cancelled":  # the API has no event for it: the stream just ends
            timings = end.final.timings if end.final is not None else None
            telemetry = {"timings": timings.as_dict()} if timings is not None else {}
            yield run.frame({"type": f"response.{status}", "response": snap, **telemetry})
    finally:
        if not run.done:
            finish(ctx, run, items, RunEnd(), "cancelled")


def event_payloads(
    ctx: RunContext, items: OutputItems, snap: dict[str, Any], event: TokenEvent | ToolExecuted
) -> list[dict[str, Any]]:
    """An event's stream payloads. llama-server's telemetry, when the body asks for it: a prompt-progress
    event is a `response.in_progress` with `prompt_progress` (return_progress), and the last payload of
    a token event carries its `timings` (timings_per_token)."""
    if isinstance(event, ToolExecuted):
        return items.tool_result(event)
    telemetry = {"timings": event.timings.as_dict()} if event.timings is not None else {}
    if event.progress is not None:
        progress = {"prompt_progress": event.progress.as_dict(), **telemetry}
        return [{"type": "response.in_progress", "response": snap, **progress}]
    payloads = items.feed(event)
    if payloads and ctx.job.request.timings_per_token:
        payloads[-1] = payloads[-1] | telemetry
    return payloads


async def generation(ctx: RunContext, end: RunEnd) -> AsyncIterator[TokenEvent | ToolExecuted]:
    """The token events of the one generation, or the tool loop's rounds and MCP results; `end` is
    filled in when they are over."""
    agent = ctx.agent
    if agent is None:
        async for event in ctx.model.client.events(ctx.job.request):
            end.final = event if event.finish_reason is not None else end.final
            yield event
        return
    async with contextlib.aclosing(agent.events()) as events:
        async for event in events:
            if isinstance(event, TokenEvent | ToolExecuted):
                yield event
    end.final = agent.final_outcome().final  # with the run's finish reason
    end.error = agent.error.message if agent.error is not None else None


def terminal_status(final: TokenEvent | None) -> str:
    if final is None or final.finish_reason == "cancelled":
        return "cancelled"
    return {"length": "incomplete", "error": "failed"}.get(final.finish_reason or "", "completed")


def finish(ctx: RunContext, run: ResponseRun, items: OutputItems, end: RunEnd, status: str) -> None:
    """The Response object's end (status, output, usage), stored with the conversation it ends."""
    snap = run.snapshot
    items.abandon_calls()  # stopped during a call: it shows, incomplete
    output = items.finished()
    snap |= {"status": status, "output": output, "completed_at": int(time.time())}
    if status == "incomplete":
        snap["incomplete_details"] = {"reason": "max_output_tokens"}
    if status == "failed":
        message = end.error or (end.final.error if end.final else None) or "generation failed"
        snap["error"] = {"code": "server_error", "message": message}
    if ctx.agent is not None:
        snap["usage"] = agent_usage(ctx.agent, items.n_reasoning_tokens)
    else:
        snap["usage"] = response_usage(ctx.job.n_prompt, end.final, items.n_reasoning_tokens)
    run.end()
    if ctx.store:
        ctx.state.store.put(StoredResponse(snap, ctx.conversation + output_messages(output)))
    if not run.background:
        ctx.state.runs.pop(snap["id"], None)


def agent_usage(agent: AgentRun, n_reasoning: int) -> dict[str, Any]:
    """A tool loop's usage over its rounds (each round's prompt counts, as OpenAI counts them)."""
    if not agent.rounds:
        return response_usage(0, None, n_reasoning)
    chat = agent.usage()
    return {
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": chat["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": n_reasoning},
        "total_tokens": chat["total_tokens"],
    }


def response_usage(n_prompt: int, final: TokenEvent | None, n_reasoning: int) -> dict[str, Any]:
    t = final.timings if final else None
    output = t.predicted_n if t else 0
    return {
        "input_tokens": n_prompt,
        "input_tokens_details": {"cached_tokens": t.cache_n if t else 0, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": n_reasoning},
        "total_tokens": n_prompt + output,
    }
