"""Anthropic's Messages API end to end with the official `anthropic` SDK, unmodified, on a real server:
whole and streamed messages agree (the SDK's own event accumulator), the event stream keeps Anthropic's
order, a tool-use round trip, stop sequences and max_tokens, count_tokens against the generation's own
usage, thinking blocks, and bad input as the SDK's exception classes in Anthropic's error shape.

This SDK version's `messages.create` has no sampling arguments: `extra_body` carries temperature (the
route's own field) and llama-server's seed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from server.apis.anthropic.schemas import CountTokensRequest, chat_messages
from tests.server_process import ServerProcess

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
HELLO = [{"role": "user", "content": "Say hello and introduce yourself."}]
GREEDY = {"temperature": 0}
FORCE_WEATHER = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}


def client(server: ServerProcess, api_key: str = "none") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=api_key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def api(server: ServerProcess) -> Iterator[anthropic.Anthropic]:
    with client(server) as c:
        yield c


def blocks(message: Any) -> list[dict[str, Any]]:
    """The content blocks without tool_use ids (fresh in every message)."""
    return [block.model_dump(exclude_none=True, exclude={"parsed_output", "id"}) for block in message.content]


def same_message(whole: Any, streamed: Any) -> None:
    assert blocks(streamed) == blocks(whole)
    assert (streamed.stop_reason, streamed.stop_sequence) == (whole.stop_reason, whole.stop_sequence)
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    # The prompt's tokens, however many of them the prompt cache held the second time.
    total = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens == total


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, payload) of a complete Anthropic SSE stream; each event's name is its type."""
    out = []
    for frame in raw.decode().strip().split("\n\n"):
        name_line, data_line = frame.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), frame
        payload = json.loads(data_line[6:])
        assert payload["type"] == name_line[7:]
        out.append((name_line[7:], payload))
    return out


def test_a_whole_and_a_streamed_message_agree(api: anthropic.Anthropic) -> None:
    asked = {"model": "any", "max_tokens": 40, "messages": HELLO, "extra_body": GREEDY}
    whole = api.messages.create(**asked)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.usage.output_tokens > 0
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text.strip()
    with api.messages.stream(**asked) as stream:
        streamed = stream.get_final_message()
    same_message(whole, streamed)


def test_the_event_stream_keeps_anthropics_order(server: ServerProcess) -> None:
    body = {"model": "any", "max_tokens": 24, "messages": HELLO, "stream": True, "temperature": 0}
    raw = httpx.post(server.base_url + "/v1/messages", json=body, timeout=120)
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw.content)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    open_block = None
    for name, payload in events[2:-2]:  # blocks one at a time: start, deltas, stop
        if name == "content_block_start":
            assert open_block is None
            open_block = payload["index"]
        elif name == "content_block_delta":
            assert payload["index"] == open_block and payload["delta"]["type"] == "text_delta"
        elif name == "content_block_stop":
            assert payload["index"] == open_block
            open_block = None
    assert open_block is None
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 24


def test_a_tool_use_round_trip(api: anthropic.Anthropic) -> None:
    """The model calls get_weather (forced), the client sends the tool_result; the model then answers."""
    asked = {"model": "any", "max_tokens": 80, "messages": ASK, "tools": [WEATHER], "extra_body": GREEDY}
    first = api.messages.create(tool_choice=FORCE_WEATHER, **asked)
    assert first.stop_reason == "tool_use"
    [call] = [b for b in first.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id
    jsonschema.validate(call.input, WEATHER["input_schema"])
    with api.messages.stream(tool_choice=FORCE_WEATHER, **asked) as stream:
        same_message(first, stream.get_final_message())

    result = {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 degrees"}
    history = [*ASK, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
    # The tiny model would call again under "auto"; "none" asks for the answer, as agents do last.
    answer = api.messages.create(**(asked | {"messages": history}), tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text.strip()


def test_tool_choice_any_calls_once_where_the_template_has_no_parallel_calls(
    api: anthropic.Anthropic,
) -> None:
    """Without disable_parallel_tool_use, parallel calls follow the template (llama-server's default):
    SmolLM2's renders none, so one call, and the answer ends with tool_use (with an array of calls the
    model went on repeating them until max_tokens). The input schema does not close its object."""
    open_weather = {
        **WEATHER,
        "input_schema": {k: v for k, v in WEATHER["input_schema"].items() if k != "additionalProperties"},
    }
    for seed in (0, 4, 10):  # with parallel calls: 0 and 4 ran to max_tokens, 10 made two calls
        asked = {"model": "any", "max_tokens": 120, "messages": ASK, "tools": [open_weather]}
        called = api.messages.create(
            tool_choice={"type": "any"}, extra_body={"temperature": 1.0, "seed": seed}, **asked
        )
        uses = [b for b in called.content if b.type == "tool_use"]
        assert called.stop_reason == "tool_use" and len(uses) == 1, called
        assert set(uses[0].input) == {"city"}  # no key the schema does not declare


def test_tool_choice_any_calls_and_none_never_does(api: anthropic.Anthropic) -> None:
    asked = {"model": "any", "max_tokens": 300, "messages": ASK, "tools": [WEATHER]}
    # Not seed 0: with it SmolLM2 writes more keys after the call object, which the generic format's
    # schema allows (llama.cpp's, without additionalProperties: false); /v1/chat/completions does the same.
    for seed in (1, 2, 3):
        extra = {"temperature": 1.0, "seed": seed}
        any_one = {"type": "any", "disable_parallel_tool_use": True}
        called = api.messages.create(tool_choice=any_one, extra_body=extra, **asked)
        uses = [b for b in called.content if b.type == "tool_use"]
        assert called.stop_reason == "tool_use" and uses
        for use in uses:
            jsonschema.validate(use.input, WEATHER["input_schema"])
        quiet = api.messages.create(
            tool_choice={"type": "none"}, extra_body=extra, **(asked | {"max_tokens": 48})
        )
        assert quiet.stop_reason in ("end_turn", "max_tokens")
        assert all(b.type == "text" for b in quiet.content)


def test_stop_sequences_and_max_tokens_say_why_the_message_ended(api: anthropic.Anthropic) -> None:
    asked = {"model": "any", "max_tokens": 40, "messages": HELLO, "extra_body": GREEDY}
    text = api.messages.create(**asked).content[0].text
    word = text.split()[3]
    stopped = api.messages.create(stop_sequences=["@@never@@", word], **asked)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert stopped.content[0].text == text[: text.index(word)]
    with api.messages.stream(stop_sequences=[word], **asked) as stream:
        assert stream.get_final_message().stop_sequence == word
    cut = api.messages.create(**(asked | {"max_tokens": 3}))
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3 and cut.stop_sequence is None


def test_count_tokens_is_the_prompt_a_message_runs_with(
    api: anthropic.Anthropic, server: ServerProcess
) -> None:
    """count_tokens equals the generation's input tokens (uncached + cache reads), with a system prompt,
    tools and a whole tool round trip in the history; and /tokenize of the same chat's messages; and
    llama-server 0c1e570's count of the same body: 44 (Llamba counted 125 when it rendered the history
    as JSON)."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]}
    history = [*ASK, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    system = [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in English."}]
    asked = {"model": "any", "messages": history, "system": system, "tools": [WEATHER]}
    counted = api.messages.count_tokens(**asked).input_tokens
    reply = api.messages.create(max_tokens=2, **asked)
    assert counted == reply.usage.input_tokens + reply.usage.cache_read_input_tokens > 0
    # tool_choice none leaves the tools out of the prompt (nothing invites a call), as on chat.
    without_tools = api.messages.count_tokens(**asked, tool_choice={"type": "none"}).input_tokens
    function = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    chat = [
        {"role": "system", "content": "You are terse.Answer in English."},  # llama-server joins with ""
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
    ]
    tokens = httpx.post(server.base_url + "/tokenize", json={"messages": chat}, timeout=60).json()["tokens"]
    # SmolLM2's template has no tool support: under auto the tools are left out and the history goes to
    # the template as it is, as llama-server gives it; a request that demands a call gets the tools
    # described and the history as JSON (llama.cpp's generic format).
    assert len(tokens) == without_tools == counted == 44  # llama-server 0c1e570's count
    required = api.messages.count_tokens(**asked, tool_choice={"type": "any"}).input_tokens
    assert required > counted


def test_messages_convert_as_llama_servers_convert_anthropic_to_oai(server: ServerProcess) -> None:
    """llama-server's conversion, byte for byte: system text blocks and a tool_result's text blocks
    joined with nothing between them, is_error adding nothing, an assistant's text blocks joined by
    newlines, and a user message's text before its tool results. The prompt count_tokens counts is the
    one the chat those rules make renders (and not the one Llamba made before: "\n\n", "\n", "Error: "),
    SmolLM2's template given the assistant's calls and the tool result as they are: llama-server
    0c1e570's prompt and count (64 tokens; 150 when Llamba rendered them as generic-format JSON)."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    parts = [{"type": "text", "text": "sunny"}, {"type": "text", "text": ", 21 degrees"}]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": parts, "is_error": True}
    said = [{"type": "text", "text": "Let me check."}, {"type": "text", "text": "One moment."}, use]
    history = [*ASK, {"role": "assistant", "content": said}]
    history += [{"role": "user", "content": [result, {"type": "text", "text": "Thanks."}]}]
    system = [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in English."}]
    body = {"model": "any", "messages": history, "system": system, "tools": [WEATHER]}
    body |= {"tool_choice": {"type": "none"}}  # the tools stay out of the prompt, as on /tokenize
    function = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    call = {"id": "toolu_1", "type": "function", "function": function}
    chat = [
        {"role": "system", "content": "You are terse.Answer in English."},
        *ASK,
        {"role": "assistant", "content": "Let me check.\nOne moment.", "tool_calls": [call]},
        {"role": "user", "content": "Thanks."},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny, 21 degrees"},
    ]
    before = [
        {**chat[0], "content": "You are terse.\n\nAnswer in English."},
        *ASK,
        {**chat[2], "content": "Let me check.One moment."},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: sunny\n, 21 degrees"},
        chat[3],
    ]
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        counted = http.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
        rendered = http.post("/apply-template", json={"messages": chat}).json()["prompt"]
        old = http.post("/apply-template", json={"messages": before}).json()["prompt"]
        expected = http.post("/tokenize", json={"content": rendered, "add_special": True}).json()["tokens"]
        tokens = http.post("/tokenize", json={"messages": chat}).json()["tokens"]
        old_tokens = http.post("/tokenize", json={"content": old, "add_special": True}).json()["tokens"]
    assert chat_messages(CountTokensRequest.model_validate(body)) == chat  # the conversion itself
    assert rendered == (  # llama-server 0c1e570's /apply-template of `chat`
        "<|im_start|>system\nYou are terse.Answer in English.<|im_end|>\n"
        "<|im_start|>user\nWhat is the weather like in Paris?<|im_end|>\n"
        "<|im_start|>assistant\nLet me check.\nOne moment.<|im_end|>\n"
        "<|im_start|>user\nThanks.<|im_end|>\n"
        "<|im_start|>tool\nsunny, 21 degrees<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tokens == expected and counted == len(expected) == 64 != len(old_tokens)


def test_output_config_format_gives_json_that_validates(api: anthropic.Anthropic) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    for seed in range(3):
        reply = api.messages.create(
            model="any",
            max_tokens=80,
            messages=ASK,
            output_config={"format": {"type": "json_schema", "schema": schema}},
            extra_body={"temperature": 1.0, "seed": seed},
        )
        assert reply.stop_reason == "end_turn"
        jsonschema.validate(json.loads(reply.content[0].text), schema)


def test_a_resumable_stream_replays_with_its_conversation_id(server: ServerProcess) -> None:
    body = {"model": "any", "max_tokens": 20, "messages": HELLO, "stream": True, "temperature": 0}
    conv = "anthropic/resume: test"
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        live = http.post("/v1/messages", json=body, headers={"X-Conversation-Id": conv})
        replayed = http.get("/v1/stream", params={"conv_id": conv, "from": 0})
    assert live.status_code == replayed.status_code == 200
    assert replayed.content == live.content and sse_events(live.content)[-1][0] == "message_stop"


# -- bad input: the SDK's exception classes, Anthropic's error shape ---------------------------------
BAD_BODIES = {
    "a document block": (
        [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}],
        "messages.0.content.0.document",
    ),
    "a tool_result without its tool_use": (
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}],
        "messages.0.content.0.tool_use_id",
    ),
    "a tool_use in a user message": (
        [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]}],
        "messages.0.content.0",
    ),
    "an unknown block type": ([{"role": "user", "content": [{"type": "video"}]}], "messages.0.content.0"),
    "a system role in messages": ([{"role": "system", "content": "x"}], "messages.0.role"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_messages_are_400_naming_the_field(api: anthropic.Anthropic, case: str) -> None:
    messages, field = BAD_BODIES[case]
    with pytest.raises(anthropic.BadRequestError) as caught:
        api.messages.create(model="any", max_tokens=8, messages=messages)
    body = caught.value.body
    assert caught.value.status_code == 400
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert field in body["error"]["message"]


def test_bad_fields_are_400_in_anthropics_shape(server: ServerProcess) -> None:
    ok = {"model": "any", "max_tokens": 8, "messages": HELLO}
    cases = {
        "max_tokens": {k: v for k, v in ok.items() if k != "max_tokens"},
        "tools.0": ok | {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "tool_choice": ok | {"tool_choice": {"type": "tool", "name": "nope"}},
        "effort": ok | {"output_config": {"effort": "high"}},
        # MCP servers run by the server are named as `mcp` tools on chat and Responses requests only.
        "mcp_servers": ok | {"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1/mcp", "name": "x"}]},
    }
    mcp_tool = ok | {"tools": [{"type": "mcp", "server_label": "time"}]}
    for field, body in [*cases.items(), ("tools.0", mcp_tool)]:
        reply = httpx.post(server.base_url + "/v1/messages", json=body, timeout=60)
        error = reply.json()
        assert reply.status_code == 400 and error["type"] == "error", (field, error)
        assert error["error"]["type"] == "invalid_request_error" and field in error["error"]["message"]
    missing = httpx.post(server.base_url + "/v1/messages/nope", json=ok, timeout=60)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_the_api_key_rides_in_x_api_key() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "1024", "--api-key", "sekrit").wait_healthy()
    try:
        with client(proc, api_key="wrong") as bad, pytest.raises(anthropic.AuthenticationError) as caught:
            bad.messages.create(model="any", max_tokens=4, messages=HELLO)
        assert caught.value.body["error"]["type"] == "authentication_error"
        with client(proc, api_key="sekrit") as good:
            assert good.messages.create(model="any", max_tokens=4, messages=HELLO).usage.output_tokens > 0
            assert good.messages.count_tokens(model="any", messages=HELLO).input_tokens > 0
        # Other routes keep OpenAI's shape for the same refusal.
        openai_shape = httpx.post(proc.base_url + "/v1/chat/completions", json={"messages": HELLO})
        assert (
            openai_shape.status_code == 401 and openai_shape.json()["error"]["type"] == "authentication_error"
        )
    finally:
        proc.stop()


# -- thinking ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def think_server() -> Iterator[ServerProcess]:
    """SmolLM2 under a template whose generation prompt opens a thinking block (tests/templates)."""
    template = "tests/templates/chatml-think.jinja"
    proc = ServerProcess(
        "-m", "smollm2", "-c", "2048", "-np", "2", "--chat-template-file", template
    ).wait_healthy()
    yield proc
    proc.stop()


def test_thinking_comes_back_as_a_thinking_block(think_server: ServerProcess) -> None:
    """A budget of 6 tokens closes the block; the thinking block comes first, then the answer's text,
    whole or streamed; an earlier thinking block in the history is accepted."""
    asked = {
        "model": "any",
        "max_tokens": 40,
        "messages": HELLO,
        "thinking": {"type": "enabled", "budget_tokens": 6},
        "extra_body": GREEDY,
    }
    with client(think_server) as api:
        whole = api.messages.create(**asked)
        assert [b.type for b in whole.content] == ["thinking", "text"]
        assert whole.content[0].thinking.strip() and whole.content[0].signature == ""
        with api.messages.stream(**asked) as stream:
            same_message(whole, stream.get_final_message())
        history = [
            *HELLO,
            {"role": "assistant", "content": whole.content},
            {"role": "user", "content": "More."},
        ]
        assert api.messages.create(**(asked | {"messages": history})).content
        off = api.messages.create(**(asked | {"thinking": {"type": "disabled"}}))
        assert [b.type for b in off.content] == ["text"]


def test_claude_codes_changing_billing_hash_keeps_the_prompt_cached(api: anthropic.Anthropic) -> None:
    """Claude Code's system prompt starts with a billing line whose cch= hash changes per request; it is
    made constant (as llama-server does), so the next request reuses the whole cached prompt."""
    replies = []
    for cch in ("a5145", "9c0d2"):
        system = f"x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch={cch};You help."
        asked = {"model": "any", "max_tokens": 1, "messages": HELLO, "system": system}
        replies.append(api.messages.create(**asked))
    first, second = (r.usage for r in replies)
    assert (
        second.input_tokens + second.cache_read_input_tokens
        == first.input_tokens + first.cache_read_input_tokens
    )
    assert second.input_tokens == 1  # only the last prompt token runs again
