"""Request fields as llama-server reads them, on a real server: a field Llamba does not know is accepted,
named once in the log and counted in /metrics (a 400 with --strict-fields); llama-server's own fields
that its clients send (`return_tokens` on /completion, `n_probs` on chat, `t_max_predict_ms`) act as
there; its checks (`top_logprobs` without `logprobs`, `-1` windows meaning the context) are made."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from engine.memory.context_shift import discard_count
from tests.server_process import ServerProcess

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0}
# Lines forever (EOS banned): a generation that only a limit ends.
LINES = {"grammar": 'root ::= ("ab\\n")+', "ignore_eos": True}


def post(server: ServerProcess, path: str, body: object) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=120)


@pytest.fixture(scope="module")
def strict() -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", "smollm2", "-np", "1", "-c", "512", "--strict-fields").wait_healthy()
    yield proc
    proc.stop()


def test_unknown_field_is_accepted_logged_once_and_counted(server: ServerProcess) -> None:
    name = "llamba_test_unknown_field"
    for path, body in (
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", CHAT),
        ("/completion", {"prompt": "Hi", "n_predict": 2}),
        ("/v1/messages", {"messages": CHAT["messages"], "max_tokens": 2}),
    ):
        reply = post(server, path, {**body, name: {"any": "value"}})
        assert reply.status_code == 200, reply.text
    warned = [line for line in server.log_path.read_text().splitlines() if "request.unknown_field" in line]
    assert len([line for line in warned if name in line]) == 1, warned
    metrics = httpx.get(server.base_url + "/metrics").text
    assert f'llamba:unknown_fields_total{{field="{name}"}} 4.0' in metrics


def test_strict_fields_refuses_unknown_fields_in_the_routes_shape(strict: ServerProcess) -> None:
    chat = post(strict, "/v1/chat/completions", {**CHAT, "no_such_field": 1})
    assert chat.status_code == 400
    error = chat.json()["error"]
    assert error["type"] == "invalid_request_error" and "'no_such_field': unknown field" in error["message"]
    messages = post(strict, "/v1/messages", {"messages": CHAT["messages"], "max_tokens": 2, "no_such": 1})
    assert messages.status_code == 400
    assert messages.json()["type"] == "error" and "'no_such': unknown field" in messages.text
    # llama-server's fields with nothing to change here are not unknown
    known = {"n_cache_reuse": 256, "sse_ping_interval": 30, "response_fields": ["content"]}
    assert post(strict, "/v1/chat/completions", {**CHAT, **known}).status_code == 200


def test_return_tokens_gives_the_generated_ids(server: ServerProcess) -> None:
    body = {"prompt": "The capital of France is", "n_predict": 5, "temperature": 0}
    asked = post(server, "/completion", {**body, "return_tokens": True}).json()
    assert len(asked["tokens"]) == asked["tokens_predicted"] == 5
    text = post(server, "/detokenize", {"tokens": asked["tokens"]}).json()["content"]
    assert text == asked["content"]
    assert post(server, "/completion", body).json()["tokens"] == []  # llama-server's: only when asked
    with httpx.stream("POST", server.base_url + "/completion", json={**body, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [t for c in chunks for t in c["tokens"]] == asked["tokens"]  # each chunk carries its token


def test_n_probs_on_chat_gives_logprobs(server: ServerProcess) -> None:
    reply = post(server, "/v1/chat/completions", {**CHAT, "n_probs": 3})
    assert reply.status_code == 200, reply.text
    content = reply.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == reply.json()["usage"]["completion_tokens"]
    assert all(len(entry["top_logprobs"]) == 3 and entry["logprob"] <= 0 for entry in content)
    assert content[0]["top_logprobs"][0]["logprob"] >= content[0]["top_logprobs"][1]["logprob"]
    # streamed: each token's logprobs ride on its chunk
    with httpx.stream("POST", server.base_url + "/v1/chat/completions",
                      json={**CHAT, "n_probs": 2, "stream": True}) as r:  # fmt: skip
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
    streamed = [c["choices"][0].get("logprobs") for c in map(json.loads, lines) if c["choices"]]
    assert [len(p["content"][0]["top_logprobs"]) for p in streamed if p] == [2] * len(content)
    assert "logprobs" not in post(server, "/v1/chat/completions", CHAT).json()["choices"][0]
    completion = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "n_probs": 2}).json()
    assert [len(e["top_logprobs"]) for e in completion["choices"][0]["logprobs"]["content"]] == [2, 2]
    native = post(server, "/completion", {"prompt": "Hi", "n_predict": 2, "logprobs": 3}).json()
    assert [len(e["top_logprobs"]) for e in native["completion_probabilities"]] == [3, 3]  # as n_probs


def test_top_logprobs_requires_logprobs(server: ServerProcess) -> None:
    reply = post(server, "/v1/chat/completions", {**CHAT, "top_logprobs": 2})
    assert reply.status_code == 400
    assert "top_logprobs requires logprobs to be set to true" in reply.json()["error"]["message"]


def test_t_max_predict_ms_ends_a_long_generation_at_a_line_end(server: ServerProcess) -> None:
    body = {"prompt": "Lines:\n", "n_predict": 900, "temperature": 0, **LINES, "t_max_predict_ms": 300}
    reply = post(server, "/completion", body).json()
    assert reply["stop_type"] == "limit"
    assert reply["tokens_predicted"] < 900 and reply["timings"]["predicted_ms"] >= 300
    assert reply["content"].endswith("\n")
    unlimited = post(server, "/completion", {**body, "n_predict": 60, "t_max_predict_ms": 0}).json()
    assert unlimited["tokens_predicted"] == 60  # 0: no limit


def test_values_follow_llama_servers_limits_and_types(server: ServerProcess) -> None:
    """server-schema.cpp's rules: a hard limit is a 400 (a request's -1 window too, 0c1e570), a soft one
    clamps, null is the default, a wrong JSON type is a 400 (tests/test_llama_server_fields.py has
    every field against the real llama-server)."""
    body = {"prompt": "Hi", "n_predict": 1}
    for bad in ({"repeat_last_n": -1}, {"dry_penalty_last_n": -1}, {"n_cache_reuse": -1}, {"stream": "yes"}):
        reply = post(server, "/completion", {**body, **bad})
        assert reply.status_code == 400 and f"Field '{next(iter(bad))}'" in reply.text, reply.text
    clamped = {"top_p": 1.5, "min_p": -1, "temperature": -0.5, "mirostat": 7, "top_k": None, "dry_base": 0.5}
    settings = post(server, "/completion", {**body, **clamped}).json()["generation_settings"]
    assert (settings["top_p"], settings["min_p"], settings["temperature"], settings["mirostat"]) == (
        1,
        0,
        0,
        2,
    )
    assert settings["top_k"] == 40 and settings["dry_base"] == 1.75  # the server's defaults


def test_n_discard_sets_what_a_context_shift_drops() -> None:
    assert discard_count(100, 4) == 48  # half of the rest by default
    assert discard_count(100, 4, 10) == 10
    assert discard_count(100, 4, 500) == 95  # never all of the rest


def test_adaptive_p_acts_where_samplers_name_it(server: ServerProcess) -> None:
    """adaptive_target/adaptive_decay drive the adaptive-p sampler when `samplers` names it (seeded: the
    same answer twice), and change nothing otherwise, as in llama-server (engine/sampling/adaptive_p.py;
    its tokens against llama.cpp's are tests/test_sampler_goldens.py's)."""
    base = {"prompt": "Once upon a time", "n_predict": 16, "seed": 7, "temperature": 1.0, "ignore_eos": True}
    chain = {**base, "samplers": ["top_k", "adaptive_p"], "top_k": 40}

    def content(body: dict) -> str:
        reply = post(server, "/completion", body)
        assert reply.status_code == 200, reply.text
        return reply.json()["content"]

    adaptive = content({**chain, "adaptive_target": 0.2, "adaptive_decay": 0.5})
    assert adaptive == content({**chain, "adaptive_target": 0.2, "adaptive_decay": 0.5})
    assert adaptive != content(chain)  # a negative target (the default): the plain draw
    assert content({**base, "adaptive_target": 0.2}) == content(base)  # not named in samplers: no effect
    assert post(server, "/completion", {**chain, "adaptive_decay": 1.5}).status_code == 400
