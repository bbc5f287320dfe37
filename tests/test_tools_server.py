"""Tool calls end to end with the `openai` SDK, unmodified, on SmolLM2 and Gemma 3 (their templates have
no tool support: under tool_choice auto the tools are left out, as llama-server leaves them; a demanded
call gets llama.cpp's generic JSON format): required and named calls whose arguments validate against
the tool's parameters, stream equal to whole replies, parallel calls, tool_choice none and auto,
and a whole round trip (call, tool result, answer), the history given to the template as llama-server
gives it (the call and the result as they are, not as JSON). On Qwen2.5-Coder, a model with a native format
(Hermes' `<tool_call>`), the round trip streamed and whole."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.server_process import ServerProcess

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=300)


def calls_of(message: Any) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]


def streamed(stream: Any) -> tuple[str, list[tuple[str, str]], str]:
    """A stream's content, calls (name, arguments text) assembled from their deltas, finish reason."""
    content, calls, finish = "", {}, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for step in choice.delta.tool_calls or ():
            name, arguments = calls.get(step.index, ("", ""))
            calls[step.index] = (
                name + (step.function.name or ""),
                arguments + (step.function.arguments or ""),
            )
        finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_required_calls_validate_against_their_parameters(any_server: ServerProcess) -> None:
    cut = 0
    with client(any_server) as api:
        for seed in range(4):
            reply = api.chat.completions.create(
                model="any", messages=ASK, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed
            )
            choice = reply.choices[0]
            if choice.finish_reason == "length" and re.search(r"\d{64}$", choice.message.content or ""):
                cut += 1  # a number's digits ran on: llguidance does not bound them (test_structured_server)
                continue
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            for name, arguments in calls_of(choice.message):
                jsonschema.validate(arguments, PARAMETERS[name])
            assert all(c.id and c.type == "function" for c in choice.message.tool_calls)
    assert cut <= 1


def test_a_named_tool_is_the_one_called(any_server: ServerProcess) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    with client(any_server) as api:
        for seed in range(3):
            reply = api.chat.completions.create(
                model="any", messages=ASK, tools=TOOLS, tool_choice=named, temperature=1.0, seed=seed
            )
            calls = calls_of(reply.choices[0].message)
            assert calls and all(name == "add" for name, _ in calls)
            for _, arguments in calls:
                jsonschema.validate(arguments, PARAMETERS["add"])


def test_stream_and_whole_reply_give_the_same_calls(any_server: ServerProcess) -> None:
    asked = {"model": "any", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0.9}
    with client(any_server) as api:
        for seed in (1, 2):
            whole = api.chat.completions.create(seed=seed, **asked).choices[0]
            content, calls, finish = streamed(api.chat.completions.create(seed=seed, stream=True, **asked))
            assert finish == whole.finish_reason == "tool_calls"
            expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or ()]
            assert calls == expected and (content or None) == whole.message.content


def test_parallel_tool_calls_can_make_two_calls(server: ServerProcess) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris and in London?"}]
    most = 0
    with client(server) as api:
        for seed in range(12):
            reply = api.chat.completions.create(
                model="any",
                messages=ask,
                tools=[WEATHER],
                tool_choice="required",
                parallel_tool_calls=True,
                temperature=1.0,
                seed=seed,
            )
            calls = calls_of(reply.choices[0].message)
            for _, arguments in calls:
                jsonschema.validate(arguments, PARAMETERS["get_weather"])
            most = max(most, len(calls))
            if most >= 2:
                break
    assert most >= 2


def test_tool_choice_none_never_calls(any_server: ServerProcess) -> None:
    with client(any_server) as api:
        for seed in range(4):
            reply = api.chat.completions.create(
                model="any",
                messages=ASK,
                tools=TOOLS,
                tool_choice="none",
                temperature=1.0,
                seed=seed,
                max_tokens=48,
            )
            choice = reply.choices[0]
            assert not choice.message.tool_calls and choice.finish_reason in ("stop", "length")


def test_auto_leaves_the_tools_out_of_a_template_without_tool_support(any_server: ServerProcess) -> None:
    """As llama-server 0c1e570: under tool_choice auto (or none given) a template with no tool support
    gets no tool prompt, the same prompt tokens as without tools, and the model answers in text; a
    request that demands a call (`required`) still gets one, valid, under the generic format's grammar."""
    with httpx.Client(base_url=any_server.base_url, timeout=300) as http:
        body = {"messages": ASK, "max_tokens": 16, "temperature": 0}
        plain = http.post("/v1/chat/completions", json=body).json()
        for choice in ({}, {"tool_choice": "auto"}):
            reply = http.post("/v1/chat/completions", json={**body, "tools": TOOLS, **choice}).json()
            assert reply["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"], choice
            assert (
                not reply["choices"][0]["message"].get("tool_calls")
                and reply["choices"][0]["message"]["content"]
            )
        required = {**body, "tools": TOOLS, "tool_choice": "required", "max_tokens": 120}
        forced = http.post("/v1/chat/completions", json=required).json()
        assert forced["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]  # the generic tool prompt
        (call,) = forced["choices"][0]["message"]["tool_calls"]
        name = call["function"]["name"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS[name])
        rendered = http.post("/apply-template", json={"messages": ASK, "tools": TOOLS}).json()["prompt"]
        assert "get_weather" not in rendered


def test_a_whole_round_trip(any_server: ServerProcess) -> None:
    """The model calls get_weather, the client runs it and sends the result; the model then answers."""
    with client(any_server) as api:
        first = api.chat.completions.create(
            model="any",
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            temperature=0,  # greedy: a sampled answer below may end at once (the server's default is 0.8)
        )
        call = first.choices[0].message.tool_calls[0]
        history = [
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny", "celsius": 21})},
        ]
        # The tiny models would call again under "auto"; "none" asks for the answer, as agents do last.
        answer = api.chat.completions.create(
            model="any", messages=history, tools=TOOLS, tool_choice="none", max_tokens=120, temperature=0
        )
        choice = answer.choices[0]
        assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
        assert choice.message.content and choice.message.content.strip()
    # As llama-server gives the history to a template without tool support: the result reaches the
    # model as a `tool` turn; the call, which these templates do not show, leaves an empty turn.
    with httpx.Client(base_url=any_server.base_url, timeout=60) as http:
        prompt = http.post("/apply-template", json={"messages": history}).json()["prompt"]
        no_call = [*ASK, {"role": "assistant", "content": ""}, history[2]]
        assert prompt == http.post("/apply-template", json={"messages": no_call}).json()["prompt"]
    assert '{"sky": "sunny", "celsius": 21}' in prompt and "get_weather" not in prompt


# llama-server 0c1e570's /apply-template of ROUND_TRIP (SmolLM2's own template; for Gemma 3, llama.cpp's
# built-in gemma format, which `--chat-template gemma` names: llama-server --no-jinja), and its
# /v1/messages/count_tokens of ANTHROPIC_ROUND_TRIP. Llamba rendered the call and the result as
# llama.cpp's generic-format JSON before (129 and 119 tokens).
ROUND_TRIP = [
    {"role": "user", "content": "What is 2+2?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    },
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
]
ANTHROPIC_ROUND_TRIP = [
    {"role": "user", "content": "What is 2+2?"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]},
]
LLAMA_SERVER_ROUND_TRIP = {
    "smollm2": (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n",
        50,
    ),
    "gemma3": (
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n<end_of_turn>\n"
        "<start_of_turn>tool\nsunny<end_of_turn>\n<start_of_turn>model\n",
        27,
    ),
}


def test_a_tool_round_trip_renders_as_llama_server_gives_it_to_the_template(
    any_server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    """A template without tool support is given the assistant's calls and the tool results as they are
    (llama-server 0c1e570 has no polyfills): /apply-template, /tokenize with messages and Anthropic's
    count_tokens are llama-server's, with the tools under tool_choice auto or none (left out) as without
    them. A request that demands a call (`required`) gets the tools described in llama.cpp's generic
    JSON format, and the history in the JSON it is asked to write."""
    expected, count = LLAMA_SERVER_ROUND_TRIP[request.node.callspec.params["any_server"]]
    anthropic_tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
    with httpx.Client(base_url=any_server.base_url, timeout=60) as http:
        for shown in ({}, {"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "none"}):
            body = {"messages": ROUND_TRIP, **shown}
            assert http.post("/apply-template", json=body).json()["prompt"] == expected, shown
            tokens = http.post("/tokenize", json=body).json()["tokens"]
            text = {"content": expected, "add_special": True, "parse_special": True}
            assert tokens == http.post("/tokenize", json=text).json()["tokens"] and len(tokens) == count
        for shown in (
            {},
            {"tools": [anthropic_tool]},
            {"tools": [anthropic_tool], "tool_choice": {"type": "none"}},
        ):
            body = {"model": "any", "messages": ANTHROPIC_ROUND_TRIP, **shown}
            assert http.post("/v1/messages/count_tokens", json=body).json()["input_tokens"] == count, shown
        required = {"messages": ROUND_TRIP, "tools": TOOLS, "tool_choice": "required"}
        generic = http.post("/apply-template", json=required).json()["prompt"]
    assert '"tool_calls": [' in generic and '"tool_response": {' in generic


def test_an_assistant_prefill_is_continued(server: ServerProcess) -> None:
    """A final assistant message is continued, not answered (llama-server's prefill; vLLM's
    continue_final_message): the prompt ends with its text and the reply goes on from there; the
    reply's message is the prefill joined with the continuation, as llama-server reports it."""
    messages = [
        {"role": "user", "content": "Name the capital of France."},
        {"role": "assistant", "content": "The capital of France is"},
    ]
    with httpx.Client(base_url=server.base_url, timeout=60) as api:
        prompt = api.post("/apply-template", json={"messages": messages}).json()["prompt"]
        assert prompt.endswith("The capital of France is")
        opened = api.post("/apply-template", json={"messages": messages, "continue_final_message": False})
        assert opened.json()["prompt"].rstrip().endswith("assistant")  # a new turn after the message
        body = {"messages": messages, "temperature": 0, "max_tokens": 8}
        reply = api.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        assert reply.startswith("The capital of France is") and "Paris" in reply[len("The capital") :]
        both = {**body, "continue_final_message": True, "add_generation_prompt": True}
        assert api.post("/v1/chat/completions", json=both).status_code == 400


def test_a_qwen_round_trip_in_its_native_hermes_format(qwen_server: ServerProcess) -> None:
    """Qwen2.5-Coder's template asks for `<tool_call>{"name": ..., "arguments": ...}</tool_call>`. The
    call, whole and streamed: get_weather for Paris, its arguments JSON; the history renders it and the
    tool's result in Qwen's tags; the answer from the result ends with finish_reason stop, whole and
    streamed alike.

    tool_choice "required" (the grammar holds the model to `<tool_call>`): under "auto" the 1.5B coder
    model writes its call in a ```json fence, which is content to llama-server 0c1e570 as to Llamba
    (its parser for Qwen 2.5's template takes calls only inside `<tool_call>`: tests/test_tool_calls.py
    test_a_fenced_call_stays_content_in_hermes_format). The answer is asked with "none", as agents do
    last: under "auto" this model echoes the call's JSON."""
    asked: dict[str, Any] = {
        "model": "qwen", "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "temperature": 0,
    }  # fmt: skip
    with client(qwen_server) as api:
        whole = api.chat.completions.create(**asked).choices[0]
        assert whole.finish_reason == "tool_calls" and whole.message.content is None
        assert calls_of(whole.message) == [("get_weather", {"city": "Paris"})]
        call = whole.message.tool_calls[0]
        calling = streamed(api.chat.completions.create(stream=True, **asked))
        assert calling == ("", [("get_weather", call.function.arguments)], "tool_calls")
        history = [
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny", "celsius": 21})},
        ]
        answering = {**asked, "messages": history, "tool_choice": "none", "max_tokens": 64}
        answer = api.chat.completions.create(**answering).choices[0]
        assert answer.finish_reason == "stop" and not answer.message.tool_calls
        assert "sunny" in answer.message.content and "21" in answer.message.content
        answering_stream = streamed(api.chat.completions.create(stream=True, **answering))
        assert answering_stream == (answer.message.content, [], "stop")
    prompt = httpx.post(qwen_server.base_url + "/apply-template", json={"messages": history}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"sky": "sunny", "celsius": 21}\n</tool_response>' in prompt
