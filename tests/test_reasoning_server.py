"""Reasoning end to end: reasoning_content, budgets and the control endpoint on a real server.

SmolLM2 is not a thinking model, but the test template's generation prompt ends in `<think>\\n`, so it
continues inside a thinking block whatever it is, and never closes it by itself on these prompts: every
end tag seen here was forced by a budget or a control call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess, wait_until

MESSAGE = " Okay, time to answer."
SERVER_BUDGET = 8
BREAD = "Explain step by step how to bake bread at home."


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "-m", "smollm2", "-c", "2048", "-np", "2",
        "--chat-template-file", "tests/templates/chatml-think.jinja",
        "--reasoning-budget", str(SERVER_BUDGET), "--reasoning-budget-message", MESSAGE,
    ).wait_healthy()  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def chat_body(content: str = BREAD, max_tokens: int = 60, **extra: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": max_tokens}
    return body | extra


def chat(client: httpx.Client, **extra: Any) -> dict[str, Any]:
    reply = client.post("/v1/chat/completions", json=chat_body(logprobs=True, **extra))
    assert reply.status_code == 200, reply.text
    return reply.json()


def token_ids(reply: dict[str, Any]) -> list[int]:
    return [entry["id"] for entry in reply["choices"][0]["logprobs"]["content"]]


def tokenize(client: httpx.Client, text: str) -> list[int]:
    return client.post("/tokenize", json={"content": text}).json()["tokens"]


def find(haystack: list[int], needle: list[int]) -> int:
    return next(i for i in range(len(haystack)) if haystack[i : i + len(needle)] == needle)


def assert_budget_cut(client: httpx.Client, reply: dict[str, Any], budget: int, message: str) -> None:
    """The block holds at most `budget` model tokens, then the forced message and end tag; then an answer."""
    msg = reply["choices"][0]["message"]
    assert msg["reasoning_content"].endswith(message.strip()) if message else "reasoning_content" not in msg
    assert msg["content"].strip(), "no answer after the forced end of the block"
    # (The answer may repeat the tag: a model that never learnt it sometimes echoes what it was fed.)
    assert "think>" not in msg.get("reasoning_content", "")
    tokens = token_ids(reply)
    forced = (tokenize(client, message) if message else []) + tokenize(client, "</think>")
    at = find(tokens, forced)
    assert at <= budget
    assert reply["usage"]["completion_tokens"] == len(tokens)  # forced tokens are completion tokens


def stream_deltas(client: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    deltas = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                deltas += [c["delta"] for c in json.loads(line[6:])["choices"]]
    return deltas


def lookup(client: httpx.Client, conv: str) -> list[dict[str, Any]]:
    return client.post("/v1/streams/lookup", json={"conversation_ids": [conv]}).json()


def joined(deltas: list[dict[str, Any]], key: str) -> str:
    return "".join(d.get(key) or "" for d in deltas)


# -- budgets ----------------------------------------------------------------------------------------
def test_server_budget_ends_reasoning_with_the_message(client: httpx.Client) -> None:
    reply = chat(client)
    assert_budget_cut(client, reply, SERVER_BUDGET, MESSAGE)
    assert find(token_ids(reply), tokenize(client, MESSAGE)) == SERVER_BUDGET  # the model never stopped


@pytest.mark.parametrize(
    "fields, budget, message",
    [
        ({"reasoning_budget_tokens": 3}, 3, MESSAGE),
        ({"thinking_budget_tokens": 5, "reasoning_budget_message": " Enough."}, 5, " Enough."),
        ({"reasoning_budget_tokens": 0}, 0, MESSAGE),
        ({"thinking_budget_tokens": 0, "thinking_budget_message": ""}, 0, ""),
    ],
)
def test_request_budget_overrides_the_server(
    client: httpx.Client, fields: dict[str, Any], budget: int, message: str
) -> None:
    reply = chat(client, **fields)
    assert_budget_cut(client, reply, budget, message)
    if budget == 0:  # the block is closed before the model writes anything
        assert reply["choices"][0]["message"].get("reasoning_content", "") == message.strip()


def test_unlimited_budget_leaves_the_model_thinking(client: httpx.Client) -> None:
    msg = chat(client, reasoning_budget_tokens=-1, max_tokens=30)["choices"][0]["message"]
    assert msg["content"] == "" and len(msg["reasoning_content"]) > 50


# -- split ------------------------------------------------------------------------------------------
def test_stream_and_non_stream_give_the_same_split(client: httpx.Client) -> None:
    body = chat_body(max_tokens=50)
    msg = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    deltas = stream_deltas(client, body)
    assert joined(deltas, "reasoning_content") == msg["reasoning_content"]
    assert joined(deltas, "content") == msg["content"]
    assert msg["reasoning_content"] and msg["content"]
    for delta in deltas[1:]:  # after the role chunk: one non-empty field per delta, or none (final)
        assert len(delta) <= 1 and all(isinstance(v, str) and v for v in delta.values()), delta


def test_reasoning_format_none_returns_everything_as_content(client: httpx.Client) -> None:
    msg = chat(client, reasoning_format="none", reasoning_budget_tokens=2)["choices"][0]["message"]
    assert "reasoning_content" not in msg
    assert f"{MESSAGE}</think>" in msg["content"]  # the raw text, forced end tag included


def test_a_prompt_with_a_closed_block_answers_in_content(client: httpx.Client) -> None:
    msg = chat(client, chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]
    assert "reasoning_content" not in msg and msg["content"].strip()


def test_props_show_the_reasoning_settings(client: httpx.Client) -> None:
    reasoning = client.get("/props").json()["reasoning"]
    assert reasoning["budget"] == SERVER_BUDGET and reasoning["budget_message"] == MESSAGE
    assert reasoning["format"] == "auto" and reasoning["template_has_thinking"] is True
    assert reasoning["start_tag"] == "<think>" and "</think>" in reasoning["end_tags"]


# -- control ----------------------------------------------------------------------------------------
async def control_mid_stream(base_url: str, after_deltas: int = 4) -> dict[str, Any]:
    """Stream an unbounded thinking request, end its reasoning after a few deltas, and report what the
    stream did after the control call answered."""
    body = chat_body(max_tokens=200, stream=True, reasoning_budget_tokens=-1, reasoning_control=True)
    seen: dict[str, Any] = {"reasoning_after": 0, "content": "", "reasoning": "", "result": None}
    answered = asyncio.Event()
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:

        async def end_reasoning(completion_id: str) -> None:
            reply = await client.post(
                "/v1/chat/completions/control", json={"id": completion_id, "action": "reasoning_end"}
            )
            seen["result"] = reply.json()
            answered.set()

        n_reasoning, task = 0, None
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
                if delta.get("reasoning_content"):
                    n_reasoning += 1
                    seen["reasoning"] += delta["reasoning_content"]
                    if answered.is_set() and not seen["content"]:
                        seen["reasoning_after"] += 1
                    if n_reasoning == after_deltas:
                        task = asyncio.create_task(end_reasoning(chunk["id"]))
                seen["content"] += delta.get("content") or ""
                seen["id"] = chunk["id"]
        assert task is not None
        await task
    return seen


def test_control_ends_reasoning_mid_stream(server: ServerProcess, client: httpx.Client) -> None:
    seen = asyncio.run(control_mid_stream(server.base_url))
    assert seen["result"] == {"success": True}
    assert seen["reasoning_after"] <= 2, "reasoning went on after the control call"
    assert seen["content"].strip() and "think>" not in seen["reasoning"]
    # The completion is finished now: the same id matches nothing.
    late = client.post("/v1/chat/completions/control", json={"id": seen["id"], "action": "reasoning_end"})
    assert late.status_code == 200 and late.json()["success"] is False and late.json()["message"]


def test_control_refusals(client: httpx.Client) -> None:
    url = "/v1/chat/completions/control"
    unknown = client.post(url, json={"id": "chatcmpl-unknown", "action": "reasoning_end"}).json()
    assert unknown["success"] is False and "chatcmpl-unknown" in unknown["message"]
    assert client.post(url, json={"id": "chatcmpl-x", "action": "explode"}).status_code == 400
    assert client.post(url, json={"action": "reasoning_end"}).status_code == 400
    body = chat_body(max_tokens=200, stream=True, reasoning_budget_tokens=-1)  # no reasoning_control
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        for line in resp.iter_lines():
            if "reasoning_content" in line:
                completion_id = json.loads(line[6:])["id"]
                refused = client.post(url, json={"id": completion_id, "action": "reasoning_end"}).json()
                break
    assert refused["success"] is False and "reasoning_control" in refused["message"]


def test_control_reaches_a_resumable_session_after_its_client_left(client: httpx.Client) -> None:
    conv = "reasoning-control-session"
    body = chat_body(max_tokens=200, stream=True, reasoning_budget_tokens=-1, reasoning_control=True)
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv}) as r:
        for line in r.iter_lines():
            if "reasoning_content" in line:
                completion_id = json.loads(line[6:])["id"]
                break
    # The client is gone; the session's task keeps generating.
    result = client.post(
        "/v1/chat/completions/control", json={"id": completion_id, "action": "reasoning_end"}
    )
    assert result.json() == {"success": True}
    # Liveness bound: the session runs to its end without a reader (generous: up to 200 tokens).
    wait_until(lambda: all(i["is_done"] for i in lookup(client, conv)), 120, "the session finished")
    replay = client.get("/v1/stream", params={"conv_id": conv})
    deltas = [
        c["delta"]
        for line in replay.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
        for c in json.loads(line[6:])["choices"]
    ]
    assert joined(deltas, "reasoning_content") and joined(deltas, "content").strip()
