"""OpenAI's Responses API end to end with the `openai` SDK's `client.responses`, unmodified, on a real
server: whole and streamed responses agree, the stream's documented events and sequence numbers, a
function-tool round trip, previous_response_id continuing a stored conversation, structured output via
text.format, background responses resumed after a socket reset (the same events as an uninterrupted
stream), retrieve/delete/cancel, the store surviving a restart with --responses-dir, and bad input as a
400 in OpenAI's shape. `mcp` tools (the server-side tool loop): tests/test_responses_mcp_server.py.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.server_process import LIVENESS_S, ServerProcess, wait_until

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ASK = "What is the weather like in Paris?"
HELLO = "Say hello and introduce yourself."
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def api(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with client(server) as c:
        yield c


def outputs(response: Any) -> list[dict[str, Any]]:
    """The output items without their ids and call ids (fresh in every response)."""
    return [
        item.model_dump(exclude_none=True, exclude={"id", "call_id", "parsed"}) for item in response.output
    ]


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The payloads of a complete Responses SSE stream; each event's name is its type."""
    out = []
    for frame in raw.decode().strip().split("\n\n"):
        name_line, data_line = frame.split("\n")
        payload = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {payload['type']}"
        out.append(payload)
    return out


def busy_slots(server: ServerProcess) -> int:
    return sum(s["is_processing"] for s in httpx.get(server.base_url + "/slots", timeout=30).json())


def test_a_whole_and_a_streamed_response_agree(api: openai.OpenAI) -> None:
    # Room to finish: the SDK's stream helper wants response.completed, not response.incomplete.
    asked = {"model": "any", "input": HELLO, "temperature": 0, "max_output_tokens": 200}
    whole = api.responses.create(**asked)
    assert whole.object == "response" and whole.id.startswith("resp_") and whole.output_text.strip()
    assert whole.status == "completed" and whole.usage.output_tokens > 0
    with api.responses.stream(**asked) as stream:
        events = list(stream)
        streamed = stream.get_final_response()
    assert outputs(streamed) == outputs(whole) and streamed.status == whole.status
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[-1].type == f"response.{whole.status}"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text


def test_the_stream_has_the_documented_events_in_order(server: ServerProcess) -> None:
    body = {"input": HELLO, "temperature": 0, "max_output_tokens": 16, "stream": True}
    raw = httpx.post(server.base_url + "/v1/responses", json=body, timeout=120)
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    types = [e["type"] for e in sse_events(raw.content)]
    deltas = types.count("response.output_text.delta")
    assert deltas > 0
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]


def test_llama_servers_stream_telemetry(server: ServerProcess) -> None:
    """llama-server's `return_progress` and `timings_per_token` on a Responses stream: prompt progress
    as `response.in_progress` events (the first at 0%), `timings` on each delta, and on the last event."""
    body = {"input": HELLO, "max_output_tokens": 8, "stream": True, "store": False}
    body |= {"return_progress": True, "timings_per_token": True}
    raw = httpx.post(server.base_url + "/v1/responses", json=body, timeout=120)
    assert raw.status_code == 200, raw.text
    events = sse_events(raw.content)
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert progress[0]["prompt_progress"]["processed"] == progress[0]["prompt_progress"]["cache"]
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"] > 0
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("predicted_per_second" in e["timings"] for e in deltas)
    assert events[-1]["timings"]["predicted_n"] == events[-1]["response"]["usage"]["output_tokens"]


def test_a_function_tool_round_trip_with_previous_response_id(api: openai.OpenAI) -> None:
    asked = {"model": "any", "tools": [WEATHER], "temperature": 0, "parallel_tool_calls": False}
    first = api.responses.create(input=ASK, tool_choice="required", **asked)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    with api.responses.stream(input=ASK, tool_choice="required", **asked) as stream:
        assert outputs(stream.get_final_response()) == outputs(first)

    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 degrees"}
    # The tiny model would call again under "auto"; "none" asks for the answer, as agents do last.
    answer = api.responses.create(
        input=[result], previous_response_id=first.id, tool_choice="none", max_output_tokens=60, **asked
    )
    assert answer.previous_response_id == first.id and answer.output_text.strip()
    assert all(item.type == "message" for item in answer.output)
    # The same conversation sent whole (the call as an input item) runs on the same prompt.
    whole = api.responses.create(
        input=[{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), result],
        tool_choice="none",
        max_output_tokens=60,
        **asked,
    )
    assert whole.usage.input_tokens == answer.usage.input_tokens
    assert whole.output_text == answer.output_text


def test_previous_response_id_continues_the_stored_conversation(
    api: openai.OpenAI, server: ServerProcess
) -> None:
    """The continued prompt is the first input, its output and the new input (instructions are not
    carried over): its token count is the chat's of those messages."""
    first = api.responses.create(
        model="any", input="My name is Zed.", instructions="Be brief.", temperature=0, max_output_tokens=20
    )
    second = api.responses.create(
        model="any",
        input="What is my name?",
        previous_response_id=first.id,
        temperature=0,
        max_output_tokens=20,
    )
    chat = [
        {"role": "user", "content": "My name is Zed."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    counted = httpx.post(server.base_url + "/tokenize", json={"messages": chat}, timeout=60).json()["tokens"]
    assert second.usage.input_tokens == len(counted)
    assert second.usage.input_tokens_details.cached_tokens > 0  # the stored prefix was reused
    assert api.responses.retrieve(second.id).output_text == second.output_text


def test_text_format_json_schema_answers_validate(api: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    for seed in range(4):
        reply = api.responses.create(
            model="any",
            input="Describe a person.",
            text={"format": fmt},
            temperature=1.0,
            extra_body={"seed": seed},
        )
        assert reply.status == "completed" and reply.text.format.type == "json_schema"
        jsonschema.validate(json.loads(reply.output_text), PERSON)
    # json_object allows any object, which SmolLM2 may keep open to the token limit (greedy too: which
    # answers finish moves with the last bits of the numerics): a cut one is `incomplete` for that
    # reason and still an object so far, not a failure of the format.
    loose = api.responses.create(
        model="any", input="Describe a person.", text={"format": {"type": "json_object"}}, temperature=0
    )
    if loose.status == "incomplete":
        assert loose.incomplete_details is not None
        assert loose.incomplete_details.reason == "max_output_tokens"
        assert loose.output_text.lstrip().startswith("{")
    else:
        assert loose.status == "completed" and isinstance(json.loads(loose.output_text), dict)


class RawResponseStream:
    """A streaming background POST over a bare socket: reads the chunked body, can drop mid-stream."""

    def __init__(self, port: int, body: dict) -> None:
        payload = json.dumps(body).encode()
        head = f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        self._raw = b""
        assert self._through(b"\r\n\r\n").lower().startswith(b"http/1.1 200")

    def _through(self, marker: bytes) -> bytes:
        while marker not in self._raw:
            data = self.sock.recv(65536)
            assert data, "connection closed"
            self._raw += data
        head, _, self._raw = self._raw.partition(marker)
        return head

    def _take(self, n: int) -> bytes:
        while len(self._raw) < n:
            data = self.sock.recv(65536)
            assert data, "connection closed"
            self._raw += data
        out, self._raw = self._raw[:n], self._raw[n:]
        return out

    def events(self, n: int) -> bytes:
        """Body bytes up to the end of the n-th event."""
        body = b""
        while body.count(b"\n\n") < n:
            size = int(self._through(b"\r\n").split(b";")[0], 16)
            assert size, "the stream ended early"
            body += self._take(size + 2)[:-2]
        return body[: _nth_end(body, n)]

    def until(self, marker: bytes) -> bytes:
        """Body bytes up to the end of the first event that holds `marker`."""
        body = b""
        while marker not in body:
            size = int(self._through(b"\r\n").split(b";")[0], 16)
            assert size, "the stream ended early"
            body += self._take(size + 2)[:-2]
        return body[: body.index(b"\n\n", body.index(marker)) + 2]

    def drop(self) -> None:
        """Close with a reset, as a killed client would."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def _nth_end(body: bytes, n: int) -> int:
    end = 0
    for _ in range(n):
        end = body.index(b"\n\n", end) + 2
    return end


def test_a_background_response_resumes_after_a_socket_reset(
    server: ServerProcess, api: openai.OpenAI
) -> None:
    """The events after a dropped connection, fetched from starting_after, are the uninterrupted
    stream's own: the same bytes as a replay from the start, numbered on without a gap."""
    body = {"input": "Write a short poem about the sea.", "max_output_tokens": 40, "temperature": 0}
    raw = RawResponseStream(server.port, body | {"background": True, "stream": True})
    seen = raw.events(6)
    raw.drop()
    first = sse_events(seen)
    response_id = first[0]["response"]["id"]
    assert first[0]["response"]["status"] == "queued" and first[0]["response"]["background"] is True
    assert first[-1]["sequence_number"] == 5

    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        resumed = http.get(f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": 5})
        full = http.get(f"/v1/responses/{response_id}", params={"stream": "true"})
    assert resumed.status_code == full.status_code == 200
    assert full.content == seen + resumed.content
    events = sse_events(full.content)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = api.responses.retrieve(response_id)
    assert events[-1]["type"] == f"response.{final.status}" and final.status in ("completed", "incomplete")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == final.output_text
    # The SDK's own resume: every event after 10, parsed.
    later = list(api.responses.retrieve(response_id, stream=True, starting_after=10))
    assert [e.sequence_number for e in later] == list(range(11, len(events)))
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        for bad in (len(events), -2, "ten"):
            reply = http.get(f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": bad})
            assert reply.status_code == 400 and "starting_after" in reply.json()["error"]["message"]


def test_retrieve_cancel_and_delete(server: ServerProcess, api: openai.OpenAI) -> None:
    long = api.responses.create(
        model="any",
        input="Tell me a very long story about dragons.",
        background=True,
        max_output_tokens=3000,
        extra_body={"ignore_eos": True},
    )
    assert long.status == "queued" and long.background
    wait_until(lambda: api.responses.retrieve(long.id).status == "in_progress", 60, "the run started")
    [slot] = [s["id"] for s in httpx.get(server.base_url + "/slots").json() if s["is_processing"]]
    cancelled = api.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    # Liveness bound, not a speed check: a cancelled response frees its slot at its next decode step...
    wait_until(lambda: busy_slots(server) == 0, LIVENESS_S, "slot freed after cancel")
    # ... cut short, not run on within the bound: the slot holds the prompt's 39 tokens and those made
    # before the cancel, where a run to its end (3000 tokens, no context shift) fills its 1024.
    assert httpx.get(server.base_url + "/slots").json()[slot]["n_cached"] < 512
    assert api.responses.cancel(long.id).status == "cancelled"  # cancelling again changes nothing

    short = api.responses.create(model="any", input=HELLO, max_output_tokens=4)
    with pytest.raises(openai.BadRequestError):
        api.responses.cancel(short.id)  # only background responses can be cancelled
    with pytest.raises(openai.BadRequestError):
        api.responses.retrieve(short.id, stream=True)  # nor followed as a stream
    assert api.responses.retrieve(short.id).output_text == short.output_text
    api.responses.delete(short.id)
    for call in (api.responses.retrieve, api.responses.delete, api.responses.cancel):
        with pytest.raises(openai.NotFoundError):
            call(short.id)
    unstored = api.responses.create(model="any", input=HELLO, max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(unstored.id)


def test_the_store_survives_a_restart_with_responses_dir(tmp_path: Path) -> None:
    folder = tmp_path / "responses"
    args = ("-m", "smollm2", "-c", "1024", "--responses-dir", str(folder))
    proc = ServerProcess(*args).wait_healthy()
    try:
        with client(proc) as api:
            first = api.responses.create(
                model="any", input="My name is Zed.", temperature=0, max_output_tokens=8
            )
            gone = api.responses.create(model="any", input=HELLO, max_output_tokens=2)
            api.responses.delete(gone.id)
    finally:
        proc.stop()
    assert proc.exited_cleanly()
    assert sorted(p.name for p in folder.iterdir()) == [f"{first.id}.json"]
    proc = ServerProcess(*args).wait_healthy()
    try:
        with client(proc) as api:
            kept = api.responses.retrieve(first.id)
            assert kept.model_dump() == first.model_dump()
            on = api.responses.create(
                model="any", input="And again?", previous_response_id=first.id, max_output_tokens=4
            )
            assert on.previous_response_id == first.id and on.usage.input_tokens > first.usage.input_tokens
            with pytest.raises(openai.NotFoundError):
                api.responses.retrieve(gone.id)
    finally:
        proc.stop()


def test_the_store_keeps_the_newest_responses_max() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "1024", "--responses-max", "2").wait_healthy()
    try:
        with client(proc) as api:
            made = [api.responses.create(model="any", input=HELLO, max_output_tokens=2) for _ in range(3)]
            with pytest.raises(openai.NotFoundError):
                api.responses.retrieve(made[0].id)
            assert [api.responses.retrieve(r.id).id for r in made[1:]] == [r.id for r in made[1:]]
            with pytest.raises(openai.BadRequestError):
                api.responses.create(model="any", input="Go on.", previous_response_id=made[0].id)
    finally:
        proc.stop()


# -- bad input: a 400 in OpenAI's shape, naming the field --------------------------------------------
BAD_BODIES = {
    "tools.0": {"tools": [{"type": "web_search"}]},
    "previous_response_id": {"previous_response_id": "resp_unknown"},
    "input.0.call_id": {"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]},
    "input.0.message.content.0.input_file": {
        "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]
    },
    "input.0": {"input": [{"type": "computer_call_output", "call_id": "c"}]},
    "input": {"input": []},
    "store": {"background": True, "store": False},
    "reasoning.effort": {"reasoning": {"effort": "high"}},
    "include": {"include": ["reasoning.encrypted_content"]},
    "tool_choice": {"tool_choice": {"type": "function", "name": "nope"}},
}


@pytest.mark.parametrize("field", list(BAD_BODIES))
def test_bad_input_is_400_naming_the_field(server: ServerProcess, field: str) -> None:
    body = {"model": "any", "input": HELLO, "max_output_tokens": 4} | BAD_BODIES[field]
    reply = httpx.post(server.base_url + "/v1/responses", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and field.split(".")[0] in error["message"]
    assert field in error["message"] or field == "store"
    if field == "tools.0":
        assert "'web_search'" in error["message"]


def test_an_unknown_response_is_404(api: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve("resp_nope")
    stream = httpx.get(server.base_url + "/v1/responses/resp_nope", params={"stream": "true"}, timeout=30)
    assert stream.status_code == 404 and stream.json()["error"]["type"] == "not_found_error"


# -- reasoning ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def think_server() -> Iterator[ServerProcess]:
    """SmolLM2 under a template whose generation prompt opens a thinking block (tests/templates), with
    a reasoning budget so the block ends."""
    proc = ServerProcess(
        "-m", "smollm2", "-c", "2048", "-np", "2",
        "--chat-template-file", "tests/templates/chatml-think.jinja", "--reasoning-budget", "6",
    ).wait_healthy()  # fmt: skip
    yield proc
    proc.stop()


def test_reasoning_comes_back_as_a_reasoning_item(think_server: ServerProcess) -> None:
    asked = {"model": "any", "input": HELLO, "temperature": 0, "max_output_tokens": 200}
    with client(think_server) as api:
        whole = api.responses.create(**asked)
        assert [item.type for item in whole.output] == ["reasoning", "message"]
        assert whole.output[0].content[0].type == "reasoning_text" and whole.output[0].content[0].text
        assert whole.usage.output_tokens_details.reasoning_tokens > 0
        with api.responses.stream(**asked) as stream:
            events = list(stream)
            assert outputs(stream.get_final_response()) == outputs(whole)
        reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        assert reasoning == whole.output[0].content[0].text
        # The reasoning item goes back as input (with previous_response_id or sent whole).
        replayed = [item.model_dump(exclude_none=True) for item in whole.output]
        again = api.responses.create(**(asked | {"input": [*replayed, {"role": "user", "content": "More."}]}))
        assert again.status in ("completed", "incomplete")
