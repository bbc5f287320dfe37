"""The client's answers to MCP approval requests: a response whose run stopped at calls that wait for
approval (`mcp_approval_request` items, server/agents/loop.py) is continued by a request whose input
holds `mcp_approval_response` items (and the same `mcp` tools). Before that request's first round, an
approved call runs (an `mcp_call` item with its `approval_request_id`, first in the output) and a
declined one is told it may not run; a request left unanswered is declined too, so the conversation
never holds a call without a result. Each answer must name a request still waiting (a 400 naming its
`input` item otherwise), and an approved call's tool must be among the request's mcp tools.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from engine.api import ToolCall
from server.agents.loop import AgentPlan, ToolExecuted, run_call
from server.agents.toolbox import Toolbox
from server.apis.responses.schemas import ResponsesRequest
from server.http import errors
from server.mcp import McpTool, ToolResult

APPROVAL_ID_PREFIX = "mcpr_"  # the ids of approval requests (server/apis/responses/output.py)


@dataclass(frozen=True)
class Approved:
    """An approved call that ran: its outcome, its tool, the approval request it answers."""

    executed: ToolExecuted
    tool: McpTool
    request_id: str


async def settle_approvals(
    body: ResponsesRequest,
    conversation: list[dict[str, Any]],
    plan: AgentPlan | None,
    toolbox: Toolbox | None,
) -> list[Approved]:
    """Answer every approval request of `conversation` that waits (each answer's tool message put
    after its call, in place); the approved calls that ran."""
    waiting = waiting_approvals(conversation)
    decided = decisions(body, waiting, plan)
    approved = [waiting_call(waiting, rid) for rid, (approve, _) in decided.items() if approve]
    ran: list[ToolExecuted] = []
    if approved and plan is not None and toolbox is not None:
        ran = list(await asyncio.gather(*(run_call(toolbox, plan, call) for call in approved)))
    for executed in ran:
        place_result(conversation, executed.message())
    for request_id in waiting.keys() - {call.id for call in approved}:
        if request_id in decided:
            reason = decided[request_id][1]
            said = "the user declined this call" + (f": {reason}" if reason else "")
        else:
            said = "this call was not approved"
        declined = ToolExecuted.of(waiting_call(waiting, request_id), ToolResult(error=f"not run: {said}"))
        place_result(conversation, declined.message())
    return [Approved(e, plan.tools[e.call.name], e.call.id) for e in ran if plan is not None]  # type: ignore[misc]


def check_answers(body: ResponsesRequest, conversation: list[dict[str, Any]]) -> None:
    """Each answer names an approval request that still waits (a 400 naming its item otherwise),
    before anything else of the request is looked at."""
    decisions(body, waiting_approvals(conversation), None, check_tools=False)


def decisions(
    body: ResponsesRequest,
    waiting: dict[str, dict[str, Any]],
    plan: AgentPlan | None,
    check_tools: bool = True,
) -> dict[str, tuple[bool, str | None]]:
    """The input's answers by request id: (approved, the reason given); a 400 naming the item for an
    answer to no waiting request, or an approval of a tool the request does not offer."""
    decided: dict[str, tuple[bool, str | None]] = {}
    for i, answer in body.approval_responses():
        where, request_id = f"input.{i}", answer.approval_request_id
        if request_id not in waiting or request_id in decided:
            raise errors.invalid_request(
                f"'{where}.approval_request_id': {request_id!r} is no mcp_approval_request waiting for an "
                "answer in this input or the conversation it continues"
            )
        name = waiting[request_id]["function"]["name"]
        if check_tools and answer.approve and (plan is None or name not in plan.tools):
            raise errors.invalid_request(
                f"'{where}': the approved call is of tool {name!r}, which this request's mcp tools do not "
                "offer (give the tools of the request that asked)"
            )
        decided[request_id] = (answer.approve, answer.reason)
    return decided


def waiting_call(waiting: dict[str, dict[str, Any]], request_id: str) -> ToolCall:
    function = waiting[request_id]["function"]
    return ToolCall(request_id, function["name"], function.get("arguments") or "")


def waiting_approvals(conversation: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The approval requests' calls of the conversation that no tool message answers yet, by id."""
    answered = {m.get("tool_call_id") for m in conversation if m.get("role") == "tool"}
    return {
        call["id"]: call
        for m in conversation
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or ()
        if str(call.get("id", "")).startswith(APPROVAL_ID_PREFIX) and call["id"] not in answered
    }


def place_result(conversation: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """The tool message right after its call's assistant message (and the results already there)."""
    call_id = message["tool_call_id"]
    at = next(
        i for i, m in enumerate(conversation)
        if m.get("role") == "assistant" and any(c.get("id") == call_id for c in m.get("tool_calls") or ())
    )  # fmt: skip
    at += 1
    while at < len(conversation) and conversation[at].get("role") == "tool":
        at += 1
    conversation.insert(at, message)
