"""Token counting on a real server: /tokenize with a chat's `messages` (and tools) renders them through
the chat template as /v1/chat/completions does, so its count is that route's usage.prompt_tokens."""

from __future__ import annotations

import httpx

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
        for extra in ({}, {"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "none"}):
            body = {"messages": CHAT, **extra}
            tokens = http.post("/tokenize", json=body).json()["tokens"]
            reply = http.post("/v1/chat/completions", json=body | {"max_tokens": 1}).json()
            assert len(tokens) == reply["usage"]["prompt_tokens"] > 0, extra
            pieces = http.post("/tokenize", json=body | {"with_pieces": True}).json()["tokens"]
            assert [p["id"] for p in pieces] == tokens
        with_tools = len(http.post("/tokenize", json={"messages": CHAT, "tools": [WEATHER]}).json()["tokens"])
        assert with_tools > len(http.post("/tokenize", json={"messages": CHAT}).json()["tokens"])
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
