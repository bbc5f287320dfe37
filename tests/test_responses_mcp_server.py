"""OpenAI's Responses API with `mcp` tools end to end: the `openai` SDK's `client.responses`, unmodified,
against a real server (SmolLM2) whose configured MCP servers are real processes (mcp-server-time and
the fixture servers): the server-side tool loop's `mcp_list_tools` and `mcp_call` items and their
stream events, a failing tool as a failed `mcp_call` the model reads, max_tool_calls, background runs
resumed after a socket reset, previous_response_id after an MCP run (the stored conversation holds
the call and its result), mcp_call items sent back as input, cancel during a call, and bad input.

SmolLM2 calls a tool whenever one is offered, so the tests force one call with an `mcp` tool_choice
and `max_tool_rounds: 1`: round one calls the tool, round two may only answer.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.server_process import LIVENESS_S, ServerProcess, wait_until
from tests.test_agents_server import (
    cancelled_calls,
    check_real_time,
    hanging_calls,
    runs_ended,
    wait_for_run_end,
)
from tests.test_mcp_server import VENV_BIN, fixture, wait_for_tools, write_config
from tests.test_responses_server import RawResponseStream, sse_events

TIME = {
    "type": "mcp",
    "server_label": "time",
    "allowed_tools": ["get_current_time"],
    "require_approval": "never",
}
ASK_TIME = "What time is it now in UTC?"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    assert shutil.which("mcp-server-time", path=VENV_BIN), "pip install mcp-server-time (the test extra)"
    config = write_config(
        tmp_path_factory.mktemp("responses-mcp") / "mcp.json",
        {
            "time": {"command": str(Path(VENV_BIN) / "mcp-server-time")},
            "slow": fixture("slow"),
            "crash": fixture("crash", restart_cooldown_ms=500),
            "garbage": fixture("garbage"),
        },
    )
    args = ("-m", "smollm2", "-np", "4", "-c", "8192", "--mcp-servers-config", str(config))
    proc = ServerProcess(*args).wait_healthy()
    wait_for_tools(proc)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def api(srv: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0, timeout=300) as c:
        yield c


def forced(tool: str = "get_current_time", server: str = "time", **extra: Any) -> dict[str, Any]:
    """Create arguments that make the model call `tool` of `server` once, then answer."""
    spec = TIME if server == "time" else {"type": "mcp", "server_label": server, "allowed_tools": [tool]}
    body = {"max_tool_rounds": 1, **extra.pop("extra_body", {})}
    return {
        "model": "any",
        "input": ASK_TIME if server == "time" else "Please run the tool, then tell me what it said.",
        "tools": [spec],
        "tool_choice": {"type": "mcp", "server_label": server, "name": tool},
        "temperature": 0,
        "max_output_tokens": 200,
        "extra_body": body,
        **extra,
    }


def raw_body(**extra: Any) -> dict[str, Any]:
    """forced() as a bare JSON body (for httpx and sockets)."""
    asked = forced(**extra)
    return {k: v for k, v in asked.items() if k != "extra_body"} | asked["extra_body"]


def busy_slots(srv: ServerProcess) -> int:
    return sum(s["is_processing"] for s in httpx.get(srv.base_url + "/slots", timeout=30).json())


def check_time_run(response: Any) -> tuple[Any, Any]:
    """A completed run: the server's tools listed, the real time tool's call with its result, then an
    answer. Returns (the mcp_call item, the message item)."""
    assert response.status == "completed", response
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    listed, call, message = response.output
    assert listed.server_label == "time" and [t.name for t in listed.tools] == ["get_current_time"]
    assert listed.tools[0].input_schema["properties"]["timezone"]
    assert call.server_label == "time" and call.name == "get_current_time" and call.id.startswith("mcp_")
    assert call.status == "completed" and call.error is None
    check_real_time(call.output, json.loads(call.arguments))
    assert message.role == "assistant" and response.output_text.strip()
    return call, message


# -- one run -----------------------------------------------------------------------------------------
def test_the_sdk_runs_the_time_tool_and_answers_after_its_real_result(api: openai.OpenAI) -> None:
    response = api.responses.create(**forced())
    check_time_run(response)
    usage = response.usage
    # Two rounds: both prompts count, and the second reused the first one's cached prefix.
    assert usage.input_tokens_details.cached_tokens > 0
    assert usage.input_tokens > 2 * usage.input_tokens_details.cached_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.tools[0].type == "mcp" and response.tool_choice.name == "get_current_time"
    assert api.responses.retrieve(response.id).model_dump() == response.model_dump()


def test_the_sdk_streams_the_mcp_events_in_order(api: openai.OpenAI) -> None:
    with api.responses.stream(**forced()) as stream:
        events = list(stream)
        final = stream.get_final_response()
    call, _ = check_time_run(final)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    deltas = types.count("response.mcp_call_arguments.delta")
    start = types.index("response.mcp_list_tools.in_progress") - 1
    assert types[:start] == ["response.created", "response.in_progress"]
    assert types[start : start + 4 + 3 + deltas + 3] == [
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.mcp_call.in_progress",
        *["response.mcp_call_arguments.delta"] * deltas,
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert deltas > 0 and types[-1] == "response.completed"
    by_type = {e.type: e for e in events}
    args = "".join(e.delta for e in events if e.type == "response.mcp_call_arguments.delta")
    assert args == by_type["response.mcp_call_arguments.done"].arguments == call.arguments
    assert by_type["response.mcp_call.completed"].item_id == call.id
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "mcp_call"]
    assert [item.output for item in done] == [call.output]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text


@pytest.mark.parametrize(
    ("server", "tool", "extra", "error"),
    [
        ("crash", "die", {}, "exited with code 3"),  # the server crashes mid-call
        ("slow", "hang", {"tool_timeout": 1}, "timed out after 1000 ms"),
        ("garbage", "junk", {}, "malformed tools/call result"),
    ],
)
def test_a_failing_tool_is_a_failed_mcp_call_and_the_run_finishes(
    srv: ServerProcess, server: str, tool: str, extra: dict[str, Any], error: str
) -> None:
    body = raw_body(tool=tool, server=server, extra_body=extra, max_output_tokens=120, stream=True)
    reply = httpx.post(srv.base_url + "/v1/responses", json=body, timeout=300)
    events = sse_events(reply.content)
    types = [e["type"] for e in events]
    assert "response.mcp_call.failed" in types and "response.mcp_call.completed" not in types
    [item] = [
        e["item"]
        for e in events
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "mcp_call"
    ]
    assert item["status"] == "failed" and item["output"] is None
    assert (
        item["error"]["type"] == "mcp_tool_execution_error" and error in item["error"]["content"][0]["text"]
    )
    assert types[-1] in ("response.completed", "response.incomplete")  # the model read it and answered
    assert events[-1]["response"]["output"][-1]["type"] == "message"


def test_max_tool_calls_bounds_the_calls_of_a_run(api: openai.OpenAI) -> None:
    asked = forced(tool_choice="required", max_tool_calls=1, extra_body={"max_tool_rounds": 3})
    response = api.responses.create(**asked)
    assert [item.type for item in response.output].count("mcp_call") == 1
    assert response.output[-1].type == "message" and response.max_tool_calls == 1


def test_a_run_cut_by_max_output_tokens_ends_incomplete_and_can_be_continued(api: openai.OpenAI) -> None:
    cut = api.responses.create(**forced(max_output_tokens=12))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output[0].type == "mcp_list_tools" and cut.output[-1].status == "incomplete"
    assert cut.usage.output_tokens == 12
    follow = {"model": "any", "input": "Hello?", "max_output_tokens": 4}
    on = api.responses.create(previous_response_id=cut.id, **follow)
    alone = api.responses.create(**follow)
    assert on.status in ("completed", "incomplete") and on.usage.input_tokens > alone.usage.input_tokens


# -- continuing a run --------------------------------------------------------------------------------
def test_previous_response_id_continues_after_the_calls_and_their_results(
    api: openai.OpenAI, srv: ServerProcess
) -> None:
    first = api.responses.create(**forced())
    call, message = check_time_run(first)
    follow = {"model": "any", "input": "Thanks!", "max_output_tokens": 8, "temperature": 0}
    on = api.responses.create(previous_response_id=first.id, **follow)
    assert on.previous_response_id == first.id and on.status in ("completed", "incomplete")
    # The stored conversation is the run's: the call, its real result, the answer, then the new turn.
    conversation = [
        {"role": "user", "content": ASK_TIME},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "time_get_current_time", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": call.output},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Thanks!"},
    ]
    tokens = httpx.post(srv.base_url + "/tokenize", json={"messages": conversation}, timeout=60).json()
    assert on.usage.input_tokens == len(tokens["tokens"])
    # The same output sent back as input items is the same conversation.
    items = [item.model_dump(exclude_none=True) for item in first.output]
    sent = api.responses.create(
        **(
            follow
            | {
                "input": [
                    {"role": "user", "content": ASK_TIME},
                    *items,
                    {"role": "user", "content": "Thanks!"},
                ]
            }
        )
    )
    assert sent.usage.input_tokens == on.usage.input_tokens


def test_a_background_run_resumes_after_a_socket_reset_mid_call(
    srv: ServerProcess, api: openai.OpenAI
) -> None:
    """Dropped while the model calls the tool: the events fetched from starting_after are the
    uninterrupted stream's own bytes, the call's result and the answer included."""
    raw = RawResponseStream(srv.port, raw_body(background=True, stream=True))
    seen = raw.events(8)  # created, in_progress, the tool list's 4, the call's added and in_progress
    raw.drop()
    first = sse_events(seen)
    assert first[-1]["type"] == "response.mcp_call.in_progress"
    response_id = first[0]["response"]["id"]
    with httpx.Client(base_url=srv.base_url, timeout=300) as http:
        resumed = http.get(f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": 7})
        full = http.get(f"/v1/responses/{response_id}", params={"stream": "true"})
    assert resumed.status_code == full.status_code == 200
    assert full.content == seen + resumed.content
    events = sse_events(full.content)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "response.mcp_call.completed" in [e["type"] for e in events]
    check_time_run(api.responses.retrieve(response_id))
    later = list(api.responses.retrieve(response_id, stream=True, starting_after=10))
    assert [e.sequence_number for e in later] == list(range(11, len(events)))


def test_cancel_during_a_call_stops_it(srv: ServerProcess, api: openai.OpenAI) -> None:
    with httpx.Client(base_url=srv.base_url, timeout=30) as http:
        before, sent = len(cancelled_calls(http)), len(hanging_calls(http))
        ended = len(runs_ended(srv))
        raw = RawResponseStream(srv.port, raw_body(tool="hang", server="slow", background=True, stream=True))
        seen = sse_events(raw.until(b"response.mcp_call_arguments.done"))
        wait_until(lambda: len(hanging_calls(http)) > sent, LIVENESS_S, "the call received by the MCP server")
        assert busy_slots(srv) == 0, "the round ended: the call runs"
        cancelled = api.responses.cancel(seen[0]["response"]["id"])
        raw.drop()
        assert cancelled.status == "cancelled"
        wait_until(lambda: len(cancelled_calls(http)) > before, LIVENESS_S, "the MCP call cancelled")
    assert "rounds=1 " in wait_for_run_end(srv, ended), "no next round started"
    assert busy_slots(srv) == 0
    stored = api.responses.retrieve(cancelled.id)
    assert stored.status == "cancelled" and [i.type for i in stored.output] == ["mcp_list_tools", "mcp_call"]
    assert stored.output[1].status == "incomplete" and stored.output[1].output is None


# -- bad input: a 400 in OpenAI's shape, naming the field --------------------------------------------
BAD_BODIES = {
    "server_label": {"tools": [{"type": "mcp", "server_label": "nope"}], "tool_choice": None},
    "server_url": {"tools": [{**TIME, "server_url": "https://example.com/mcp"}]},
    "allowed_tools": {"tools": [{**TIME, "allowed_tools": ["no_such_tool"]}]},
    "require_approval": {"tools": [{**TIME, "require_approval": "sometimes"}]},
    "tool_choice": {"tool_choice": {"type": "mcp", "server_label": "crash", "name": "die"}},
    "tool_choice.name": {"tool_choice": {"type": "mcp", "server_label": "time"}},
    "max_tool_rounds": {"max_tool_rounds": 9},
    "input.0.approval_request_id": {
        "input": [
            {
                "type": "mcp_call",
                "id": "mcp_1",
                "server_label": "time",
                "name": "get_current_time",
                "arguments": "{}",
                "approval_request_id": "mcpr_1",
            }
        ]
    },
    "input.0": {
        "input": [{"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}]
    },
    "headers": {"tools": [{**TIME, "headers": {"Authorization": "Bearer x"}}]},
}


@pytest.mark.parametrize("field", list(BAD_BODIES))
def test_bad_mcp_input_is_400_naming_the_field(srv: ServerProcess, field: str) -> None:
    body = raw_body() | BAD_BODIES[field]
    reply = httpx.post(srv.base_url + "/v1/responses", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and field in error["message"], error
    assert busy_slots(srv) == 0


# -- approvals ---------------------------------------------------------------------------------------------
def test_a_call_that_needs_approval_ends_the_run_and_runs_once_approved(api: openai.OpenAI) -> None:
    always = {**TIME, "require_approval": "always"}
    asked = api.responses.create(**forced(tools=[always]))
    assert asked.status == "completed"
    assert [item.type for item in asked.output] == ["mcp_list_tools", "mcp_approval_request"]
    request = asked.output[1]
    assert (request.server_label, request.name) == ("time", "get_current_time") and request.id.startswith(
        "mcpr_"
    )
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    approved = api.responses.create(
        model="any", previous_response_id=asked.id, input=[answer], tools=[always], tool_choice="none",
        temperature=0, max_output_tokens=60,
    )  # fmt: skip
    assert [item.type for item in approved.output] == ["mcp_list_tools", "mcp_call", "message"]
    call = approved.output[1]
    assert call.approval_request_id == request.id and call.status == "completed"
    check_real_time(call.output, json.loads(request.arguments))  # the approved arguments ran
    again = api.responses.create(
        model="any", previous_response_id=asked.id, input=[answer], tools=[always], tool_choice="none"
    )  # the same request still waits in asked's conversation: it may be answered on another branch
    assert again.output[1].type == "mcp_call"
    with pytest.raises(openai.BadRequestError, match="input.0.approval_request_id"):
        api.responses.create(model="any", previous_response_id=approved.id, input=[answer], tools=[always])


def test_a_declined_call_is_not_run_and_the_model_is_told(api: openai.OpenAI) -> None:
    filtered = {**TIME, "require_approval": {"always": {"tool_names": ["get_current_time"]}}}
    asked = api.responses.create(**forced(tools=[filtered]))
    request = asked.output[-1]
    assert request.type == "mcp_approval_request"
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": False,
              "reason": "not now"}  # fmt: skip
    declined = api.responses.create(
        model="any", previous_response_id=asked.id, input=[answer], tools=[filtered], tool_choice="none",
        temperature=0, max_output_tokens=30,
    )  # fmt: skip
    assert [item.type for item in declined.output] == ["mcp_list_tools", "message"]  # nothing ran
    assert declined.status in ("completed", "incomplete")  # answered (or cut by max_output_tokens)
    # The declined call has its result in the stored conversation now: it waits for nothing more.
    with pytest.raises(openai.BadRequestError, match="input.0.approval_request_id"):
        api.responses.create(model="any", previous_response_id=declined.id, input=[answer], tools=[filtered])
    # A request left unanswered is declined too: the conversation goes on without running it.
    moved_on = api.responses.create(
        model="any", previous_response_id=asked.id, input="Never mind. Say hi.", tools=[filtered],
        tool_choice="none", max_output_tokens=20,
    )  # fmt: skip
    assert [item.type for item in moved_on.output] == ["mcp_list_tools", "message"]


def test_mcp_tools_without_mcp_servers_are_a_400(server: ServerProcess) -> None:
    reply = httpx.post(server.base_url + "/v1/responses", json=raw_body(), timeout=60)
    assert reply.status_code == 400 and "--mcp-servers-config" in reply.json()["error"]["message"]
    tool_rounds = {"input": "Hi", "max_tool_rounds": 2}
    reply = httpx.post(server.base_url + "/v1/responses", json=tool_rounds, timeout=60)
    assert reply.status_code == 400 and "mcp tools only" in reply.json()["error"]["message"]
