"""Token counting on a real server: /tokenize with a chat's `messages` (and tools) renders them through
the chat template as /v1/chat/completions does, so its count is that route's usage.prompt_tokens."""

from __future__ import annotations

import httpx
import openai

from tests.server_process import ServerProcess

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the weather like in Paris?"},
]


def test_tokenize_with_messages_counts_the_chats_prompt(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        for extra in ({}, {"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "required"}):
            body = {"messages": CHAT, **extra}
            tokens = http.post("/tokenize", json=body).json()["tokens"]
            reply = http.post("/v1/chat/completions", json=body | {"max_tokens": 1}).json()
            assert len(tokens) == reply["usage"]["prompt_tokens"] > 0, extra
            pieces = http.post("/tokenize", json=body | {"with_pieces": True}).json()["tokens"]
            assert [p["id"] for p in pieces] == tokens
        # SmolLM2's template has no tool support: under auto the tools stay out of the prompt (llama-server's
        # rule), a demanded call gets the generic tool prompt
        plain = len(http.post("/tokenize", json={"messages": CHAT}).json()["tokens"])
        with_tools = len(http.post("/tokenize", json={"messages": CHAT, "tools": [WEATHER]}).json()["tokens"])
        required = {"messages": CHAT, "tools": [WEATHER], "tool_choice": "required"}
        assert with_tools == plain < len(http.post("/tokenize", json=required).json()["tokens"])
        text = http.post("/apply-template", json={"messages": CHAT}).json()["prompt"]
        assert http.post("/tokenize", json={"content": text}).json()["tokens"] == tokens_of(http, CHAT)


def tokens_of(http: httpx.Client, messages: list[dict]) -> list[int]:
    return http.post("/tokenize", json={"messages": messages}).json()["tokens"]


def test_tokenize_refuses_what_it_cannot_count(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        both = http.post("/tokenize", json={"messages": CHAT, "content": "x"})
        assert both.status_code == 400 and "content" in both.json()["error"]["message"]
        broken = http.post("/tokenize", json={"messages": [{"role": "wizard", "content": "x"}]})
        assert broken.status_code == 400 and "messages.0.role" in broken.json()["error"]["message"]


def test_input_token_counts_are_the_prompts_usage(server: ServerProcess) -> None:
    """/v1/chat/completions/input_tokens (llama-server's) and /v1/responses/input_tokens (OpenAI's, through
    the SDK) count what the matching generation reports as its prompt."""
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        counted = http.post("/v1/chat/completions/input_tokens", json={"messages": CHAT}).json()
        assert counted == {"object": "response.input_tokens", "input_tokens": len(tokens_of(http, CHAT))}
        empty = http.post("/chat/completions/input_tokens", json={"messages": []})
        assert empty.status_code == 400 and "messages" in empty.json()["error"]["message"]
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    ask = {"model": "smollm2", "instructions": "You are terse.", "input": "What is the weather in Paris?"}
    count = client.responses.input_tokens.count(**ask)
    reply = client.responses.create(**ask, max_output_tokens=16, store=False)
    assert reply.usage is not None and count.input_tokens == reply.usage.input_tokens > 5
    assert count.object == "response.input_tokens"
