"""The streams and the `__verbose` objects as llama-server 0c1e570 writes them (server-task.cpp's to_json_*
functions), checked on a real server: each event's keys and the events' order, as the real llama-server
answered the same requests on the same model (SmolLM2, -np 4 -c 4096).

- /completion streams a partial result per prompt-progress update and per token (the last token's too),
  then a final result with no text, `response_fields` applied to it.
- /v1/completions streams the same way; each choice's final chunk carries `usage` and `timings` (whatever
  stream_options says: there is no separate usage chunk on this route).
- `verbose` puts /completion's result under `__verbose`: on every /v1/completions chunk and reply, and on
  a chat reply or a chat stream's finish chunk.
- /v1/messages streams message_start (its usage with the prompt cache's share) with the first events and
  ends with message_delta's usage of output tokens alone.
- A chat stream's prompt-progress chunk is the role delta with `prompt_progress`; the role chunk proper
  comes with the first token, after them.

Where Llamba writes otherwise on purpose: a progress event's `tokens` is [] (llama-server writes [0], a
token nobody generated) and a partial result's `id_slot` is the slot (llama-server's is -1 there); the
Anthropic stream keeps its `ping` events (Anthropic's own API sends them; llama-server sends none).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess

PARTIAL = {"index", "content", "tokens", "stop", "id_slot", "tokens_predicted", "tokens_evaluated"}
FINAL = PARTIAL | {"model", "generation_settings", "prompt", "has_new_line", "truncated", "stop_type"}
FINAL |= {"stopping_word", "tokens_cached", "timings"}
HEAD = {"id", "object", "created", "model", "system_fingerprint", "choices"}
USAGE = {"completion_tokens", "prompt_tokens", "total_tokens", "prompt_tokens_details"}
ROLE = {"role": "assistant", "content": None}
CHAT = [{"role": "user", "content": "What is 2+2?"}]


def events(server: ServerProcess, path: str, body: dict[str, Any]) -> list[Any]:
    """The stream's events: each data line's JSON ("[DONE]" as it is), Anthropic's as (name, payload)."""
    out: list[Any] = []
    name = None
    with httpx.stream("POST", server.base_url + path, json=body | {"stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                out.append((name, data) if name else data)
    return out


def n_prompt_tokens(server: ServerProcess, prompt: str) -> int:
    reply = httpx.post(server.base_url + "/tokenize", json={"content": prompt, "add_special": True})
    return len(reply.json()["tokens"])


# -- /completion ------------------------------------------------------------------------------------
def test_completion_stream_sends_every_token_then_a_final_result_without_text(server: ServerProcess) -> None:
    body = {"prompt": "Hello", "n_predict": 3, "temperature": 0, "ignore_eos": True}
    *partials, final = events(server, "/completion", body)
    assert [set(p) for p in partials] == [PARTIAL] * 3
    assert [p["tokens_predicted"] for p in partials] == [1, 2, 3]
    assert all(len(p["tokens"]) == 1 and p["stop"] is False and p["index"] == 0 for p in partials)
    assert {p["tokens_evaluated"] for p in partials} == {n_prompt_tokens(server, "Hello")}
    assert set(final) == FINAL and final["stop"] is True
    assert (final["content"], final["tokens"], final["tokens_predicted"]) == ("", [], 3)
    whole = httpx.post(server.base_url + "/completion", json=body, timeout=120).json()
    assert "".join(p["content"] for p in partials) == whole["content"]
    assert set(whole) == FINAL and whole["prompt"] == final["prompt"] == "Hello"


def test_completion_stream_with_probabilities_progress_and_timings(server: ServerProcess) -> None:
    body = {"prompt": "Hello", "n_predict": 2, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    body |= {"n_probs": 2, "return_progress": True, "timings_per_token": True}
    got = events(server, "/completion", body)
    progress = [e for e in got if "prompt_progress" in e]
    assert progress and got[: len(progress)] == progress  # the prompt's updates come first
    for event in progress:
        assert set(event) == PARTIAL | {"timings", "prompt_progress"}
        assert (event["content"], event["tokens"], event["tokens_predicted"]) == ("", [], 0)
    *tokens, final = got[len(progress) :]
    assert [set(t) for t in tokens] == [PARTIAL | {"timings", "completion_probabilities"}] * 2
    assert set(final) == FINAL  # no completion_probabilities: they went out with the tokens


def test_completion_stream_last_token_has_timings_only_after_a_stop_word(server: ServerProcess) -> None:
    """llama-server has set the stop by then for a stop word only (the limit is found after)."""
    body = {"prompt": "Hello", "n_predict": 3, "temperature": 0}
    *partials, last, _ = events(server, "/completion", body)
    assert "timings" not in last
    word = partials[1]["content"]  # greedy: the same second token ends the next run
    *_, last, final = events(server, "/completion", body | {"stop": [word]})
    assert final["stop_type"] == "word" and "timings" in last and set(last) == PARTIAL | {"timings"}


def test_response_fields_apply_to_the_streamed_final_result(server: ServerProcess) -> None:
    body = {"prompt": "Hello", "n_predict": 2, "response_fields": ["content", "timings/prompt_n"]}
    *partials, final = events(server, "/completion", body)
    assert [set(p) for p in partials] == [PARTIAL] * 2
    assert set(final) == {"content", "timings/prompt_n"}
    # anything but a list of paths is no filter: llama-server answers the whole reply
    whole = httpx.post(server.base_url + "/completion", json=body | {"response_fields": "content"})
    assert whole.status_code == 200 and set(whole.json()) == FINAL


# -- /v1/completions --------------------------------------------------------------------------------
@pytest.mark.parametrize("stream_options", [None, {"include_usage": True}])
def test_completions_stream_ends_with_usage_and_timings(
    server: ServerProcess, stream_options: dict | None
) -> None:
    body: dict[str, Any] = {"prompt": "Hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    if stream_options:
        body["stream_options"] = stream_options
    *chunks, final, done = events(server, "/v1/completions", body)
    assert done == "[DONE]" and [set(c) for c in chunks] == [HEAD] * 3
    assert all(
        c["choices"][0]["finish_reason"] is None and c["choices"][0]["logprobs"] is None for c in chunks
    )
    assert set(final) == HEAD | {"usage", "timings"} and set(final["usage"]) == USAGE
    assert final["choices"] == [{"index": 0, "text": "", "finish_reason": "length", "logprobs": None}]
    n_prompt = n_prompt_tokens(server, "Hello")
    assert final["usage"]["completion_tokens"] == 3 and final["usage"]["prompt_tokens"] == n_prompt
    assert (
        final["usage"]["total_tokens"] == 3 + n_prompt
        and "cached_tokens" in final["usage"]["prompt_tokens_details"]
    )


def test_completions_stream_with_progress_timings_and_logprobs(server: ServerProcess) -> None:
    body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    body |= {"return_progress": True, "timings_per_token": True, "logprobs": 2}
    *chunks, final, _ = events(server, "/v1/completions", body)
    progress = [c for c in chunks if "prompt_progress" in c]
    assert progress and chunks[: len(progress)] == progress
    assert all(set(c) == HEAD | {"timings", "prompt_progress"} for c in progress)
    assert all(c["choices"][0]["text"] == "" and c["choices"][0]["logprobs"] is None for c in progress)
    tokens = chunks[len(progress) :]
    assert [set(c) for c in tokens] == [HEAD | {"timings"}] * 2
    assert all(len(c["choices"][0]["logprobs"]["content"]) == 1 for c in tokens)
    assert set(final) == HEAD | {"usage", "timings"} and final["choices"][0]["logprobs"] is None


def test_completions_verbose_is_the_completion_result(server: ServerProcess) -> None:
    body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0, "verbose": True, "n_probs": 1}
    whole = httpx.post(server.base_url + "/v1/completions", json=body, timeout=120).json()
    verbose = whole["__verbose"]
    assert set(verbose) == FINAL | {"completion_probabilities"}
    assert verbose["content"] == whole["choices"][0]["text"] and verbose["prompt"] == "Hello"
    fields = ["content", "tokens_predicted"]
    kept = httpx.post(server.base_url + "/v1/completions", json=body | {"response_fields": fields}).json()
    assert kept["__verbose"] == {"content": kept["choices"][0]["text"], "tokens_predicted": 3}
    quiet = httpx.post(server.base_url + "/v1/completions", json=body | {"verbose": False}).json()
    assert "__verbose" not in quiet

    streamed = events(server, "/v1/completions", body | {"response_fields": fields})
    *chunks, final, _ = streamed
    assert [set(c["__verbose"]) for c in chunks] == [PARTIAL | {"completion_probabilities"}] * 3
    assert [c["__verbose"]["content"] for c in chunks] == [c["choices"][0]["text"] for c in chunks]
    assert final["__verbose"] == {"content": "", "tokens_predicted": 3}


# -- chat -------------------------------------------------------------------------------------------
def test_chat_verbose_is_the_completion_result(server: ServerProcess) -> None:
    body = {"messages": CHAT, "max_tokens": 3, "temperature": 0, "verbose": True}
    whole = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120).json()
    verbose = whole["__verbose"]
    assert set(verbose) == FINAL
    assert verbose["content"] == whole["choices"][0]["message"]["content"]
    prompt = httpx.post(server.base_url + "/apply-template", json={"messages": CHAT}).json()["prompt"]
    assert verbose["prompt"] == prompt and verbose["tokens_evaluated"] == whole["usage"]["prompt_tokens"]
    kept = httpx.post(server.base_url + "/v1/chat/completions", json=body | {"response_fields": ["prompt"]})
    assert kept.json()["__verbose"] == {"prompt": prompt}

    *chunks, finish, done = events(server, "/v1/chat/completions", body)
    assert all("__verbose" not in c for c in chunks)  # only the finish chunk carries it
    assert set(finish["__verbose"]) == FINAL and finish["__verbose"]["content"] == ""


def kind(chunk: Any) -> str:
    """A chat chunk's kind: progress, role, content, finish, usage or [DONE]."""
    if chunk == "[DONE]":
        return chunk
    if not chunk["choices"]:
        return "usage"
    choice = chunk["choices"][0]
    if "prompt_progress" in chunk:
        assert choice == {"index": 0, "finish_reason": None, "delta": ROLE}, chunk
        return "progress"
    if choice["finish_reason"] is not None:
        return "finish"
    return "role" if choice["delta"] == ROLE else "content"


@pytest.mark.parametrize("timings_per_token", [False, True])
def test_chat_progress_chunks_come_before_the_role_chunk(
    server: ServerProcess, timings_per_token: bool
) -> None:
    """As llama-server's: each prompt-progress update is the role delta with prompt_progress, and no chunk
    has empty choices but the usage chunk (a client such as langchain-llama-cpp's ChatLlama takes a chunk
    without choices for the usage chunk)."""
    body = {"messages": CHAT, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    body |= {"return_progress": True, "timings_per_token": timings_per_token}
    got = events(server, "/v1/chat/completions", body)
    kinds = [kind(c) for c in got]
    n_progress = kinds.count("progress")
    assert n_progress >= 2  # the 0% update, then one per prompt chunk
    assert kinds == ["progress"] * n_progress + ["role", "content", "content", "content", "finish", "[DONE]"]
    progress = got[:n_progress]
    assert all(
        set(c) == HEAD | {"prompt_progress"} | ({"timings"} if timings_per_token else set()) for c in progress
    )
    assert progress[0]["prompt_progress"]["processed"] == 0
    assert set(got[n_progress]) == HEAD  # the role chunk: no progress, no timings
    with_usage = events(server, "/v1/chat/completions", body | {"stream_options": {"include_usage": True}})
    assert [kind(c) for c in with_usage][-3:] == ["finish", "usage", "[DONE]"]


def test_chat_without_progress_opens_with_the_role_chunk(server: ServerProcess) -> None:
    body = {
        "messages": CHAT,
        "max_tokens": 2,
        "temperature": 0,
        "ignore_eos": True,
        "timings_per_token": True,
    }
    got = events(server, "/v1/chat/completions", body)
    assert [kind(c) for c in got] == ["role", "content", "content", "finish", "[DONE]"]
    assert "timings" not in got[0] and all("timings" in c for c in got[1:4])


# -- /v1/messages -----------------------------------------------------------------------------------
def test_messages_stream_usage_as_llama_server_writes_it(server: ServerProcess) -> None:
    body = {"model": "m", "messages": CHAT, "max_tokens": 3, "temperature": 0}
    counted = httpx.post(server.base_url + "/v1/messages/count_tokens", json={"model": "m", "messages": CHAT})
    n_prompt = counted.json()["input_tokens"]
    for _ in range(2):  # cold, then the prompt cache holding all but the last token
        got = events(server, "/v1/messages", body)
        names = [name for name, _ in got if name != "ping"]
        blocks = ["content_block_start", *["content_block_delta"] * 3, "content_block_stop"]
        assert names == ["message_start", *blocks, "message_delta", "message_stop"]
        assert got[0][0] == "message_start"  # a ping comes after it
        message = got[0][1]["message"]
        assert set(message) == {
            "id",
            "type",
            "role",
            "content",
            "model",
            "stop_reason",
            "stop_sequence",
            "usage",
        }
        usage = message["usage"]
        assert set(usage) == {"cache_read_input_tokens", "input_tokens", "output_tokens"}
        assert (
            usage["cache_read_input_tokens"] + usage["input_tokens"] == n_prompt
            and usage["output_tokens"] == 0
        )
        delta = got[-2][1]
        assert delta["usage"] == {"output_tokens": 3} and delta["delta"]["stop_reason"] == "max_tokens"
    assert usage["cache_read_input_tokens"] > 0
