"""A kernel failure inside the engine thread, over HTTP (issue #20): the client gets a clear error, the slot
is freed, the server keeps serving.

A correct kernel cannot be made to fail on demand, so the server runs with LLAMBA_FAIL_FORWARD (engine
forward passes that raise as a broken kernel would; server/model/loading.py).
Requests run one after another, so
the pass numbers are known: each prompt is one pass, each further token one more.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.server_process import ServerProcess

CHAT = {"messages": [{"role": "user", "content": "Count to fifty."}], "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def failing_server() -> Iterator[ServerProcess]:
    # pass 3: the streamed chat's third pass; pass 9: the plain chat's fifth (it starts at pass 5)
    proc = ServerProcess("-m", "smollm2", "-np", "2", "-c", "2048", env={"LLAMBA_FAIL_FORWARD": "3,9"})
    yield proc.wait_healthy()
    proc.stop()


def stream_chat(url: str, max_tokens: int) -> tuple[list[dict], list[dict]]:
    """A streamed chat's chunks and its error events: `data: {"error": ...}`, then `data: [DONE]`
    (llama-server's ending of a failed OpenAI-compatible stream, ggml-org/llama.cpp#16109)."""
    body = {**CHAT, "stream": True, "max_tokens": max_tokens}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200  # the failure comes after the first bytes
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(line.startswith("data: ") for line in lines), lines  # no field an SSE parser would drop
    return [e for e in events if "error" not in e], [e for e in events if "error" in e]


def test_a_failed_step_ends_its_requests_with_an_error_and_the_server_keeps_serving(
    failing_server: ServerProcess,
) -> None:
    url = failing_server.base_url
    data, errors = stream_chat(url, 3)
    assert len(errors) == 1, errors
    error = errors[0]["error"]
    assert error["type"] == "server_error" and "injected failure" in error["message"], error
    # passes 1 and 2 made two tokens, sent before the error
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in data)
    assert not any(c["choices"][0].get("finish_reason") for c in data)  # it did not end as a finished one

    ok = httpx.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 1}, timeout=120)  # pass 4
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"

    failed = httpx.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 16}, timeout=120)  # 5..9
    assert failed.status_code == 500, failed.text
    body = failed.json()["error"]
    assert body["type"] == "server_error" and "injected failure" in body["message"]

    slots = httpx.get(url + "/slots", timeout=10).json()
    assert not any(s["is_processing"] for s in slots)  # the slots were freed

    again = httpx.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 8}, timeout=120)
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 8
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert "engine.step_failed" in failing_server.log()


@pytest.fixture(scope="module")
def failing_agents_server() -> Iterator[ServerProcess]:
    # pass 2: the Responses request's second pass; pass 5: the Anthropic request's third (it starts at 3)
    proc = ServerProcess("-m", "smollm2", "-np", "2", "-c", "2048", env={"LLAMBA_FAIL_FORWARD": "2,5"})
    yield proc.wait_healthy()
    proc.stop()


def test_a_failed_step_ends_responses_and_anthropic_requests_in_their_shapes(
    failing_agents_server: ServerProcess,
) -> None:
    url, ask = failing_agents_server.base_url, "Count to fifty."
    responses = {"input": ask, "max_output_tokens": 8, "temperature": 0}
    # The Responses API reports a generation that failed as the Response's state, not an HTTP error: a
    # Response with status "failed" and its error; the message cut short is "incomplete".
    failed = httpx.post(url + "/v1/responses", json=responses, timeout=120)  # passes 1, 2
    assert failed.status_code == 200, failed.text
    response = failed.json()
    assert response["status"] == "failed" and response["error"]["code"] == "server_error", response
    assert "injected failure" in response["error"]["message"]
    assert [item["status"] for item in response["output"]] == ["incomplete"]

    # greedy: the server's default temperature (0.8) samples, and a reply may end before its third pass
    messages = {
        "model": "smollm2",
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "user", "content": ask}],
    }
    failed = httpx.post(url + "/v1/messages", json=messages, timeout=120)  # passes 3, 4, 5
    assert failed.status_code == 500, failed.text
    body = failed.json()
    assert body["type"] == "error" and "injected failure" in body["error"]["message"], body

    ok = httpx.post(url + "/v1/messages", json=messages, timeout=120)
    assert ok.status_code == 200 and ok.json()["stop_reason"] == "max_tokens", ok.text
    ok = httpx.post(url + "/v1/responses", json=responses, timeout=120)
    assert ok.status_code == 200 and ok.json()["status"] in ("completed", "incomplete"), ok.text
    assert not any(s["is_processing"] for s in httpx.get(url + "/slots", timeout=10).json())


@pytest.fixture(scope="module")
def failing_sdk_server() -> Iterator[ServerProcess]:
    # pass 2: the OpenAI stream's second pass; pass 4: the Anthropic stream's second (it starts at 3)
    proc = ServerProcess("-m", "smollm2", "-np", "2", "-c", "2048", env={"LLAMBA_FAIL_FORWARD": "2,4"})
    yield proc.wait_healthy()
    proc.stop()


def test_sdk_clients_get_a_mid_stream_failure_as_an_exception(failing_sdk_server: ServerProcess) -> None:
    """The error event is one the SDKs parse: a stream that failed raises in the client instead of ending
    as if it were complete (an `error:` line, llama-server's framing before ggml-org/llama.cpp#16109, is
    dropped by every SSE parser)."""
    url = failing_sdk_server.base_url
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model="smollm2", messages=CHAT["messages"], max_tokens=8, temperature=0, stream=True
    )
    text = []
    with pytest.raises(openai.APIError, match="injected failure"):
        for chunk in stream:
            text.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert "".join(text)  # the first pass's token came before the failure

    claude = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=120)
    ask = {"model": "smollm2", "max_tokens": 8, "messages": CHAT["messages"]}
    with pytest.raises(anthropic.APIStatusError, match="injected failure"):  # greedy: extra_body (this SDK)
        for _ in claude.messages.create(**ask, stream=True, extra_body={"temperature": 0}):
            pass
    assert httpx.get(url + "/health", timeout=10).status_code == 200
