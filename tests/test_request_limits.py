"""Hostile and over-limit input (issue #20): strict JSON bodies, each limit's flag and its 4xx in the
route's error shape, the queue's 503 with Retry-After, hypercorn's header size and slow-header limits."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from pydantic import ValidationError

from engine.api import TokenEvent
from engine.handle import RequestHandle
from server.chat.schemas import CompletionRequest
from server.config.limits import RequestLimits
from server.http import errors
from server.http.limits import check_body
from server.http.request_body import nesting_depth, parse_json
from server.model.admission import Admission
from tests.server_process import LIVENESS_S, ServerProcess, wait_until

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
# Every POST route of the shared server that reads a JSON body (embeddings, rerank, /tools and the
# slots actions answer 501/404 without their flags; the fuzz tests cover them).
POST_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/infill",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/chat/completions/control",
    "/v1/streams/lookup",
)


def bad_request(raw: bytes) -> str:
    with pytest.raises(errors.APIError) as caught:
        parse_json(raw, 8)
    assert caught.value.status == 400
    return caught.value.message


# -- the body parser, without a server --------------------------------------------------------------
def test_parse_json_refuses_what_nlohmann_refuses() -> None:
    assert "not UTF-8" in bad_request(b'{"content": "\xff\xfe"}')
    assert "NaN is not a JSON number" in bad_request(b'{"temperature": NaN}')
    assert "-Infinity" in bad_request(b'{"temperature": -Infinity}')
    assert "out of range" in bad_request(b'{"temperature": 1e400}')
    assert "duplicate key 'stream'" in bad_request(b'{"stream": false, "x": {}, "stream": true}')
    assert "nested deeper than 8" in bad_request(b"[" * 9 + b"]" * 9)
    assert "nested deeper than 8" in bad_request(b"[" * 100_000)  # CPython's json recursion, not a 500
    assert "Exceeds the limit" in bad_request(b'{"seed": ' + b"9" * 5000 + b"}")
    assert "Expecting" in bad_request(b'{"a": ')
    assert "surrogate" in bad_request(b'{"content": "\\ud800 alone"}')
    assert parse_json(b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}', 8) == {"a": "\U0001f600", "b": "\\ud800"}
    assert parse_json(b'{"a": [[1, 2.5], {"b": "\xc3\xa9"}]}', 8) == {"a": [[1, 2.5], {"b": "é"}]}


def test_nesting_depth_counts_containers_only() -> None:
    assert nesting_depth(3) == 0
    assert nesting_depth({"tokens": list(range(10_000))}) == 2
    assert nesting_depth({"a": [{"b": [[]]}]}) == 5


def test_body_limits_name_the_field_and_the_flag() -> None:
    limits = RequestLimits(max_messages=2, max_stop_strings=1, max_stop_length=3)
    check_body(limits, {"messages": [{}, {}], "stop": ["abc"]})
    for body, words in (
        ({"messages": [{}, {}, {}]}, "'messages': 3 items, more than the server's 2 (--max-messages)"),
        ({"input": [{}, {}, {}]}, "'input': 3 items"),
        ({"stop": ["a", "b"]}, "--max-stop-strings"),
        ({"stop_sequences": ["abcd"]}, "'stop_sequences': a stop string of 4 characters"),
        ({"stop": "abcd"}, "--max-stop-length"),
    ):
        with pytest.raises(errors.APIError) as caught:
            check_body(limits, body)
        assert words in caught.value.message and caught.value.status == 400


def test_the_requests_n_predict_wins_over_the_servers_as_llama_server_does() -> None:
    assert CompletionRequest(max_tokens=100_000).max_new_tokens(64) == 100_000
    assert CompletionRequest(n_predict=80).max_new_tokens(64) == 80
    assert CompletionRequest(n_predict=-1).max_new_tokens(64) == 64
    assert CompletionRequest().max_new_tokens(64) == 64
    assert CompletionRequest(n_predict=10).max_new_tokens(64) == 10
    assert CompletionRequest(n_predict=2**31 - 1).max_new_tokens(-1) == 2**31 - 1  # the context ends it
    with pytest.raises(ValidationError, match="Field 'n_predict': Value must be between"):
        CompletionRequest(n_predict=10**30)  # past llama-server's hard limit (INT32_MAX)
    assert CompletionRequest().max_new_tokens(-1) == -1


# -- the shared server --------------------------------------------------------------------------------
def shape_ok(route: str, reply: httpx.Response, status: int) -> str:
    """The reply's status and its error body in the route's shape; the message."""
    assert reply.status_code == status, (route, reply.status_code, reply.text[:300])
    body = reply.json()
    if route.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        return body["error"]["message"]
    assert {"code", "message", "type"} <= set(body["error"]) and body["error"]["code"] == status
    return body["error"]["message"]


def test_malformed_bodies_are_400s_on_every_post_route(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for route in POST_ROUTES:
            for raw, words in (
                (b'{"content": "\xc3\x28"}', "not UTF-8"),
                (b'{"n_predict": NaN}', "NaN"),
                (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
                (b"[" * 5000 + b"]" * 5000, "nested deeper than 128"),
                (b'{"x": Infinity}', "Infinity"),
            ):
                assert words in shape_ok(route, client.post(route, content=raw), 400), route
            form = client.post(
                route, content=b"--x\r\n", headers={"Content-Type": "multipart/form-data; b=x"}
            )
            assert "multipart/form-data" in shape_ok(route, form, 415)


def test_too_many_messages_and_stop_strings_are_400s_naming_the_flag(server: ServerProcess) -> None:
    many = {"messages": [{"role": "user", "content": "x"}] * 4097, "max_tokens": 1}
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        assert "--max-messages" in shape_ok(
            "/v1/chat/completions", client.post("/v1/chat/completions", json=many), 400
        )
        anthropic = {**many, "model": "m", "max_tokens": 1}
        assert "--max-messages" in shape_ok("/v1/messages", client.post("/v1/messages", json=anthropic), 400)
        stops = {**CHAT, "stop": [f"s{i}" for i in range(65)]}
        assert "--max-stop-strings" in shape_ok(
            "/v1/chat/completions", client.post("/v1/chat/completions", json=stops), 400
        )
        long_stop = {"prompt": "a", "n_predict": 1, "stop": ["x" * 1025]}
        assert "--max-stop-length" in shape_ok("/completion", client.post("/completion", json=long_stop), 400)
        assert client.get("/health").status_code == 200


# -- the server with small limits (tests/conftest.py) -----------------------------------------------
def test_body_size_is_a_413_and_depth_follows_its_flag(limited_server: ServerProcess) -> None:
    big = {"content": "a" * 17000}
    anthropic = {"model": "m", "max_tokens": 1, "messages": [], "x": "a" * 17000}
    deep: object = 1
    for _ in range(16):
        deep = [deep]
    with httpx.Client(base_url=limited_server.base_url, timeout=60) as client:
        assert "--max-body-size" in shape_ok("/tokenize", client.post("/tokenize", json=big), 413)
        reply = client.post("/v1/messages", json=anthropic)
        assert shape_ok("/v1/messages", reply, 413) and reply.json()["error"]["type"] == "request_too_large"
        too_deep = {"content": "a", "x": deep}
        message = shape_ok("/tokenize", client.post("/tokenize", json=too_deep), 400)
        assert "nested deeper than 16 levels (--max-json-depth)" in message
        assert client.post("/tokenize", json={"content": "fine"}).json()["tokens"]


def test_admission_counts_live_requests_beyond_the_slots() -> None:
    """server/model/admission.py over real RequestHandles: a request is live until the engine pushes its
    final event (read or not); live requests beyond the slots are the queue."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        gate = Admission(max_queue=1)
        handles = [RequestHandle(f"r{i}", loop, lambda _: None) for i in range(2)]
        gate.track(*handles)  # one in the slot, one queued: the queue is full
        with pytest.raises(errors.APIError) as refused:
            gate.check(n_slots=1)
        assert refused.value.status == 503 and refused.value.headers == {"Retry-After": "1"}
        gate.check(n_slots=2)  # with two slots nothing waits
        handles[0].push(TokenEvent("", finish_reason="stop"))  # ended, never read
        gate.check(n_slots=1)
        assert Admission(max_queue=-1).check(n_slots=0) is None

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def one_slot() -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", "smollm2", "-np", "1", "-c", "1024", "--metrics", "--max-queue", "1")
    yield proc.wait_healthy()
    proc.stop()


def test_a_full_queue_is_a_503_with_retry_after(one_slot: ServerProcess) -> None:
    """-np 1 --max-queue 1: one request generates, one waits, the next is turned away at once, in
    OpenAI's error shape with the header its SDKs retry on. Both long streams end when their clients
    leave: the queue empties and the server answers again."""
    small = one_slot
    long = {**CHAT, "max_tokens": 1000, "ignore_eos": True, "stream": True}

    def deferred() -> float:
        text = httpx.get(small.base_url + "/metrics", timeout=10).text
        return float(
            next(ln.split()[-1] for ln in text.splitlines() if ln.startswith("llamacpp:requests_deferred"))
        )

    async def scenario() -> httpx.Response:
        async with (
            httpx.AsyncClient(base_url=small.base_url, timeout=120) as client,
            client.stream("POST", "/v1/chat/completions", json=long) as first,
        ):
            first_lines = first.aiter_lines()  # held: a dropped iterator closes its response
            await anext(first_lines)
            async with client.stream("POST", "/v1/chat/completions", json=long) as second:
                second_lines = second.aiter_lines()
                await anext(second_lines)
                await asyncio.to_thread(wait_until, lambda: deferred() >= 1, 30, "the second request queued")
                return await client.post("/v1/chat/completions", json=CHAT)

    refused = asyncio.run(scenario())
    assert "--max-queue 1" in shape_ok("/v1/chat/completions", refused, 503)
    assert refused.json()["error"]["type"] == "unavailable_error"
    assert refused.headers["Retry-After"] == "1"
    wait_until(lambda: deferred() == 0, LIVENESS_S, "the queue emptied")
    assert httpx.post(small.base_url + "/v1/chat/completions", json=CHAT, timeout=60).status_code == 200


def raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


def test_oversized_headers_are_refused_and_slow_headers_cut_off(limited_server: ServerProcess) -> None:
    small = limited_server
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n"
    assert raw_exchange(small.port, head).startswith(b"HTTP/1.1 431")
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", small.port), timeout=2 * LIVENESS_S) as sock:
        sock.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\n")  # ... and never the rest
        assert sock.recv(65536) == b""  # closed by the server (--header-timeout 1)
    # Liveness bound: the server's 1 s timeout closed it, not the socket's own (twice the bound).
    assert time.monotonic() - start < LIVENESS_S
    assert httpx.get(small.base_url + "/health", timeout=10).status_code == 200


def test_apply_template_with_tools_and_a_system_message_without_text(server: ServerProcess) -> None:
    """The fuzz's 500: the generic tool format's system prompt was added to a system message by
    `content + text`, and a system message without content (or with content parts) raised."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for content in (None, [{"type": "text", "text": "Be brief."}]):
        system = {"role": "system"} if content is None else {"role": "system", "content": content}
        # required: SmolLM2's template has no tool support, and only a demanded call shows the tools
        body = {
            "messages": [system, {"role": "user", "content": "Hi"}],
            "tools": tools,
            "tool_choice": "required",
        }
        reply = httpx.post(server.base_url + "/apply-template", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert "You can call any of the following tools" in reply.json()["prompt"]
