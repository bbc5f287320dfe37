"""`n` choices on /v1/chat/completions and /v1/completions, on the shared SmolLM2 server (-np 4): every
choice, streamed and whole, equals the request with seed + i run alone; the prompt counts once."""

from __future__ import annotations

import json
import uuid

import httpx
import openai
import pytest

from tests.server_process import ServerProcess


def chat_body(**fields: object) -> dict:
    # A new prompt each time, so no slot holds its prefix and the prompt's tokens are all evaluated;
    # ignore_eos, so each choice runs its 16 tokens (a random prompt sometimes drew an early end: 63 of 64).
    topic = uuid.uuid4().hex[:8]
    messages = [{"role": "user", "content": f"Write two lines about the sea ({topic})."}]
    body = {"messages": messages, "max_tokens": 16, "temperature": 1.0, "seed": 42, "ignore_eos": True}
    return body | fields


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=300)


def stream_choices(server: ServerProcess, path: str, body: dict) -> tuple[dict[int, str], list[dict]]:
    texts: dict[int, str] = {}
    chunks = []
    with httpx.stream("POST", server.base_url + path, json=body | {"stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                chunks.append(chunk)
                for c in chunk["choices"]:
                    piece = c["delta"].get("content") if "delta" in c else c["text"]
                    texts[c["index"]] = texts.get(c["index"], "") + (piece or "")
    return texts, chunks


def test_chat_choices_equal_their_seeds_alone(server: ServerProcess) -> None:
    body = chat_body(n=4)
    reply = post(server, "/v1/chat/completions", body).json()
    texts = [c["message"]["content"] for c in reply["choices"]]
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3] and len(set(texts)) > 1
    n_prompt = reply["usage"]["prompt_tokens"]
    timings = reply["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == n_prompt  # evaluated once, not 4 times
    assert reply["usage"]["completion_tokens"] == timings["predicted_n"] == 4 * 16
    for i, text in enumerate(texts):
        alone = post(server, "/v1/chat/completions", body | {"n": 1, "seed": 42 + i}).json()
        assert alone["choices"][0]["message"]["content"] == text
    streamed, chunks = stream_choices(
        server, "/v1/chat/completions", body | {"stream_options": {"include_usage": True}}
    )
    assert [streamed[i] for i in range(4)] == texts
    finishes = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(c["choices"][0]["index"] for c in finishes) == [0, 1, 2, 3]
    assert sum(c["timings"]["prompt_n"] + c["timings"]["cache_n"] for c in finishes) == 4 * n_prompt
    assert sum(c["timings"]["prompt_n"] for c in finishes) <= n_prompt
    assert chunks[-1]["usage"]["completion_tokens"] == 4 * 16


def test_completion_choices_and_n_cmpl(server: ServerProcess) -> None:
    body = {"prompt": f"Once upon a time ({uuid.uuid4().hex[:6]})", "max_tokens": 10, "temperature": 1.0}
    reply = post(server, "/v1/completions", body | {"n": 3, "seed": 5}).json()
    texts = [c["text"] for c in reply["choices"]]
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    assert reply["timings"]["prompt_n"] + reply["timings"]["cache_n"] == reply["usage"]["prompt_tokens"]
    for i, text in enumerate(texts):
        assert post(server, "/v1/completions", body | {"seed": 5 + i}).json()["choices"][0]["text"] == text
    streamed, _ = stream_choices(server, "/v1/completions", body | {"n": 3, "seed": 5})
    assert [streamed[i] for i in range(3)] == texts
    by_n_cmpl = post(server, "/v1/completions", body | {"n_cmpl": 3, "seed": 5}).json()
    assert [c["text"] for c in by_n_cmpl["choices"]] == texts


def test_openai_sdk_n(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
    body = chat_body()
    reply = client.chat.completions.create(
        model="x", messages=body["messages"], n=2, max_tokens=8, seed=3, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in reply.choices] == [0, 1] and all(c.message.content for c in reply.choices)


@pytest.mark.parametrize(
    ("path", "fields", "message"),
    [
        ("/v1/chat/completions", {"n": 0}, "'n'"),
        ("/v1/chat/completions", {"n": "two"}, "'n'"),
        ("/v1/chat/completions", {"n": 5}, "'n': at most 4 choices"),
        ("/v1/completions", {"n_cmpl": 0}, "'n_cmpl'"),
        ("/completion", {"n": 2}, "'n'"),
    ],
)
def test_bad_n_is_400_naming_it(server: ServerProcess, path: str, fields: dict, message: str) -> None:
    body = chat_body(**fields) if "chat" in path else {"prompt": "Hi", "max_tokens": 2, **fields}
    r = post(server, path, body)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
