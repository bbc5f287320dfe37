"""A kernel failure inside the engine thread, over HTTP (issue #20): the client gets a clear error, the slot
is freed, the server keeps serving.

A correct kernel cannot be made to fail on demand, so the server runs with LLAMBA_FAIL_FORWARD (engine
forward passes that raise as a broken kernel would; server/service.py). Requests run one after another, so
the pass numbers are known: each prompt is one pass, each further token one more.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.server_process import ServerProcess

CHAT = {"messages": [{"role": "user", "content": "Count to fifty."}], "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def failing_server() -> Iterator[ServerProcess]:
    # pass 3: the streamed chat's third pass; pass 9: the plain chat's fifth (it starts at pass 5)
    proc = ServerProcess("-m", "smollm2", "-np", "2", "-c", "2048", env={"LLAMBA_FAIL_FORWARD": "3,9"})
    yield proc.wait_healthy()
    proc.stop()


def stream_chat(url: str, max_tokens: int) -> tuple[list[dict], list[str]]:
    """A streamed chat's data events and its `error:` lines (llama-server's error event)."""
    body = {**CHAT, "stream": True, "max_tokens": max_tokens}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200  # the failure comes after the first bytes
        lines = list(r.iter_lines())
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
    assert "data: [DONE]" not in lines  # the stream did not end as a finished one
    return data, [line[7:] for line in lines if line.startswith("error: ")]


def test_a_failed_step_ends_its_requests_with_an_error_and_the_server_keeps_serving(
    failing_server: ServerProcess,
) -> None:
    url = failing_server.base_url
    data, errors = stream_chat(url, 3)
    assert len(errors) == 1, errors
    error = json.loads(errors[0])["error"]
    assert error["type"] == "server_error" and "injected failure" in error["message"], error
    # passes 1 and 2 made two tokens, sent before the error
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in data)

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
