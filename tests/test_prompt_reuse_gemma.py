"""Multi-turn chat on Gemma 3 (sliding-window layers): each turn evaluates only what is new.

Llamba's KV cache keeps every position of a slot, sliding-window layers included, so a conversation's
cached prefix is reused by truncation — after another conversation took the slot (host prompt cache)
and after the last user message was edited — where llama.cpp needs context checkpoints.
"""

from __future__ import annotations

import httpx
import pytest

from tests.server_process import ServerProcess


@pytest.fixture(scope="module")
def gemma_server():  # type: ignore[no-untyped-def]
    proc = ServerProcess("-m", "gemma3", "--chat-template", "gemma", "-c", "2048", "-np", "1").wait_healthy()
    yield proc
    proc.stop()


def chat(url: str, messages: list[dict], cache: bool = True) -> dict:
    body = {"messages": messages, "temperature": 0, "max_tokens": 8, "cache_prompt": cache}
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def turn(url: str, messages: list[dict]) -> tuple[dict, list[dict]]:
    reply = chat(url, messages)
    cold = chat(url, messages, cache=False)
    assert reply["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    answer = {"role": "assistant", "content": reply["choices"][0]["message"]["content"]}
    return reply, [*messages, answer]


def test_each_turn_evaluates_only_new_tokens(gemma_server) -> None:  # type: ignore[no-untyped-def]
    url = gemma_server.base_url
    a1, convo = turn(url, [{"role": "user", "content": "List three colours."}])
    a2, convo = turn(url, [*convo, {"role": "user", "content": "And three animals?"}])
    assert a2["timings"]["cache_n"] >= a1["usage"]["prompt_tokens"]
    assert a2["timings"]["prompt_n"] + a2["timings"]["cache_n"] == a2["usage"]["prompt_tokens"]
    # Another conversation takes the (only) slot; A's next turn comes back from the host cache.
    turn(url, [{"role": "user", "content": "What is the boiling point of water?"}])
    a3, _ = turn(url, [*convo, {"role": "user", "content": "And three fruits?"}])
    assert a3["timings"]["cache_n"] >= a2["usage"]["prompt_tokens"]
    # The user edits that last message: everything before it is still reused.
    edited, _ = turn(url, [*convo, {"role": "user", "content": "And three trees instead?"}])
    assert edited["timings"]["cache_n"] >= a2["usage"]["prompt_tokens"]
    assert edited["timings"]["prompt_n"] < 20
