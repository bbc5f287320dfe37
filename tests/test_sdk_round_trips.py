"""What the official SDKs return, sent back unchanged as the next request's history, is accepted (issue
#41): a tool-use round trip with the `anthropic` SDK (the reply's `content`), the `openai` SDK's chat
completions (the reply's message object) and Responses (the output items), each on the shared real
server. Each reply goes back as the SDK object itself and as the SDK's full dumps (`model_dump()`, every
field its model defines, None included: `caller`, `toolset_name`, `namespace`, `async`...), which is
what a client that stores its history as JSON sends. A field the real API does not take is still a 400.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.server_process import ServerProcess

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}},
    "required": ["city"],
    "additionalProperties": False,
}
ASK = "What is the weather like in Paris?"
RESULT = "sunny, 21 degrees"

Dump = Callable[[Any], Any]
# The reply as the SDK returns it, and as the SDK's dumps: python mode, and JSON mode with the API's names.
DUMPS: dict[str, Dump] = {
    "object": lambda item: item,
    "model_dump": lambda item: item.model_dump(),
    "model_dump_json": lambda item: item.model_dump(mode="json", by_alias=True),
}


@pytest.fixture(scope="module")
def claude(server: ServerProcess) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=300) as c:
        yield c


@pytest.mark.parametrize("dump", DUMPS)
def test_anthropic_reply_content_goes_back_unchanged(claude: anthropic.Anthropic, dump: str) -> None:
    tools = [{"name": "get_weather", "description": "The weather in a city", "input_schema": SCHEMA}]
    asked = {"model": "any", "max_tokens": 60, "tools": tools, "extra_body": {"temperature": 0}}
    history: list[Any] = [{"role": "user", "content": ASK}]
    force = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    first = claude.messages.create(messages=history, tool_choice=force, **asked)  # type: ignore[arg-type]
    [call] = [b for b in first.content if b.type == "tool_use"]
    content = [DUMPS[dump](block) for block in first.content]
    if dump != "object":
        assert {"caller", "toolset_name"} <= set(content[-1])  # what the SDK's ToolUseBlock defines
    result = {"type": "tool_result", "tool_use_id": call.id, "content": RESULT}
    history += [{"role": "assistant", "content": content}, {"role": "user", "content": [result]}]
    answer = claude.messages.create(messages=history, tool_choice={"type": "none"}, **asked)  # type: ignore[arg-type]
    assert answer.type == "message" and answer.content[0].type == "text"


def test_anthropic_caller_as_the_real_api_writes_it_and_unknown_fields_refused(
    claude: anthropic.Anthropic,
) -> None:
    """The real API's tool_use carries `caller: {"type": "direct"}`: accepted; a field it does not define
    is the 400 the real API gives."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": RESULT, "toolset_name": None}

    def send(block: dict[str, Any]) -> Any:
        messages = [
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": [block]},
            {"role": "user", "content": [result]},
        ]
        return claude.messages.create(model="any", max_tokens=4, messages=messages)  # type: ignore[arg-type]

    assert send(use | {"caller": {"type": "direct"}, "toolset_name": None}).type == "message"
    with pytest.raises(anthropic.BadRequestError, match="tool_use.bogus"):
        send(use | {"bogus": 1})


@pytest.mark.parametrize("dump", DUMPS)
def test_openai_chat_message_goes_back_unchanged(oai: openai.OpenAI, dump: str) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
    asked = {"model": "any", "max_tokens": 60, "tools": tools, "temperature": 0, "parallel_tool_calls": False}
    history: list[Any] = [{"role": "user", "content": ASK}]
    first = oai.chat.completions.create(messages=history, tool_choice="required", **asked)  # type: ignore[arg-type]
    message = first.choices[0].message
    [call] = message.tool_calls or []
    history += [DUMPS[dump](message), {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
    answer = oai.chat.completions.create(messages=history, tool_choice="none", **asked)  # type: ignore[arg-type]
    assert answer.choices[0].message.content


# Not the python-mode dump here: it names ResponseFunctionToolCall's `async` field `async_`, which the
# real API refuses as an unknown parameter too (the last test).
@pytest.mark.parametrize("dump", ["object", "model_dump_json"])
def test_openai_responses_output_goes_back_unchanged(oai: openai.OpenAI, dump: str) -> None:
    tools = [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]
    asked = {"model": "any", "max_output_tokens": 60, "tools": tools, "temperature": 0, "store": False}
    history: list[Any] = [{"role": "user", "content": ASK}]
    first = oai.responses.create(input=history, tool_choice="required", parallel_tool_calls=False, **asked)  # type: ignore[arg-type]
    [call] = [item for item in first.output if item.type == "function_call"]
    output = [DUMPS[dump](item) for item in first.output]
    if dump == "model_dump_json":
        assert {"caller", "namespace", "async"} <= set(output[-1])  # the SDK's ResponseFunctionToolCall
    history += [*output, {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
    answer = oai.responses.create(input=history, tool_choice="none", **asked)  # type: ignore[arg-type]
    assert answer.status in ("completed", "incomplete") and answer.output_text


def test_openai_responses_refuses_a_field_the_api_does_not_define(oai: openai.OpenAI) -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    for bogus in ({"async_": True}, {"bogus": 1}):
        with pytest.raises(openai.BadRequestError, match=next(iter(bogus))):
            oai.responses.create(model="any", input=[call | bogus], max_output_tokens=4, store=False)  # type: ignore[list-item]


# Request fields of the real APIs (their SDKs' create params) for what this server does not have: a
# value that changes nothing is taken, one that would be ignored is a 400 naming the field.
TAKEN = {
    "/v1/messages": {"speed": "fast", "inference_geo": "us", "user_profile_id": "p", "workspace_id": "w"},
    "/v1/responses": {"prompt_cache_options": {"mode": "implicit"}, "conversation": None, "prompt": None},
    "/v1/chat/completions": {"prompt_cache_retention": "24h", "verbosity": "medium", "moderation": None},
}
REFUSED = {
    "/v1/messages": {"container": "container_1", "diagnostics": {"previous_message_id": "msg_1"}},
    "/v1/responses": {"conversation": "conv_1", "context_management": [{"type": "compaction"}]},
    "/v1/chat/completions": {"verbosity": "low", "moderation": {"mode": "block"}},
}
BODIES = {
    "/v1/messages": {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"max_output_tokens": 2, "input": "hi", "store": False},
    "/v1/chat/completions": {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
}


@pytest.mark.parametrize("route", BODIES)
def test_real_api_request_fields_are_taken_or_refused_by_name(server: ServerProcess, route: str) -> None:
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        for name, value in TAKEN[route].items():
            reply = client.post(route, json=BODIES[route] | {name: value})
            assert reply.status_code == 200, (name, reply.text)
        for name, value in REFUSED[route].items():
            reply = client.post(route, json=BODIES[route] | {name: value})
            assert reply.status_code == 400 and name in reply.json()["error"]["message"], (name, reply.text)


def test_anthropic_tool_fields(server: ServerProcess) -> None:
    """Anthropic's tool fields: taken where they change nothing here, refused where they ask for what
    this server has not (code execution as the only caller, tool search)."""
    tool = {"name": "t", "input_schema": {"type": "object"}}
    taken = {"eager_input_streaming": True, "input_examples": [{}], "allowed_callers": ["direct"]}
    refused = {"allowed_callers": ["code_execution_20250825"], "defer_loading": True}
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        for fields, status in ((taken, 200), *(({k: v}, 400) for k, v in refused.items())):
            body = BODIES["/v1/messages"] | {"tools": [tool | fields]}
            reply = client.post("/v1/messages", json=body)
            assert reply.status_code == status, (fields, reply.text)
