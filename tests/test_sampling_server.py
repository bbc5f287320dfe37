"""llama-server's sampler fields over HTTP on the real server: each one acts, post-sampling probabilities
have llama-server's shape, the flags set the defaults, and bad values are 400s naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess

PARIS = 7042  # SmolLM2's " Paris", the greedy continuation of the prompt below
PROMPT = "The capital of France is"
REPEATS = "one two three one two three one two three one two"  # greedy goes on with " three" (1296)


def complete(server: ServerProcess, **fields: Any) -> dict[str, Any]:
    body = {"prompt": PROMPT, "n_predict": 6, "return_tokens": True, **fields}
    reply = httpx.post(server.base_url + "/completion", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def greedy_tokens(server: ServerProcess, prompt: str = PROMPT, n: int = 6) -> list[int]:
    return complete(server, prompt=prompt, n_predict=n, temperature=0)["tokens"]


def test_post_sampling_probs_have_llama_servers_shape(server: ServerProcess) -> None:
    reply = complete(server, temperature=1.0, top_k=3, min_p=0.0, n_probs=5, post_sampling_probs=True, seed=3)
    entries = reply["completion_probabilities"]
    assert len(entries) == 6
    for token, entry in zip(reply["tokens"], entries, strict=True):
        assert set(entry) == {"id", "token", "bytes", "prob", "top_probs"} and entry["id"] == token
        top = entry["top_probs"]
        assert 1 <= len(top) <= 3  # top-k 3 left at most three, whatever n_probs asks
        assert sum(t["prob"] for t in top) == pytest.approx(1.0, abs=1e-6)
        assert [t["prob"] for t in top] == sorted((t["prob"] for t in top), reverse=True)
        assert entry["prob"] == pytest.approx(next(t["prob"] for t in top if t["id"] == token), rel=1e-6)
    raw = complete(server, temperature=1.0, top_k=3, n_probs=5, seed=3)["completion_probabilities"][0]
    assert set(raw) == {"id", "token", "bytes", "logprob", "top_logprobs"} and len(raw["top_logprobs"]) == 5


def test_post_sampling_probs_on_chat_and_streams(server: ServerProcess) -> None:
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
        "post_sampling_probs": True,
    }
    reply = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120).json()
    content = reply["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    for entry in content:  # greedy: the chain leaves one token, probability 1 (zeros are left out)
        assert entry["prob"] == 1.0 and [t["prob"] for t in entry["top_probs"]] == [1.0]
    native = {
        "prompt": PROMPT,
        "n_predict": 3,
        "ignore_eos": True,
        "stream": True,
        "n_probs": 2,
        "post_sampling_probs": True,
    }
    with httpx.stream("POST", server.base_url + "/completion", json=native, timeout=120) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    probs = [c["completion_probabilities"][0] for c in chunks if c.get("completion_probabilities")]
    assert len(probs) == 3 and all("top_probs" in p and 0 < p["prob"] <= 1 for p in probs)


def test_the_samplers_order_decides_what_acts(server: ServerProcess) -> None:
    """top-k 1 alone is greedy even at temperature 5, which is left out of the chain; by name or letter."""
    greedy = greedy_tokens(server)
    for samplers in (["top_k"], ["Top-K"], "k"):
        assert complete(server, samplers=samplers, top_k=1, temperature=5.0, seed=1)["tokens"] == greedy
    # temperature first, then top-k 1: still the best token
    assert complete(server, samplers="tk", top_k=1, temperature=5.0)["tokens"] == greedy


def test_xtc_removes_the_top_choices(server: ServerProcess) -> None:
    """XTC always on, threshold 0: of top-k 2 only the second-best token is left, at every step."""
    reply = complete(
        server, top_k=2, top_p=1.0, min_p=0.0, xtc_probability=1.0, xtc_threshold=0.0, n_probs=2, seed=5
    )
    for token, entry in zip(reply["tokens"], reply["completion_probabilities"], strict=True):
        assert token == entry["top_logprobs"][1]["id"]


def test_mirostat_typical_and_top_n_sigma_can_narrow_to_one_token(server: ServerProcess) -> None:
    greedy = greedy_tokens(server)
    narrow: list[dict[str, Any]] = [
        {"mirostat": 2, "mirostat_tau": 0.0, "temperature": 1.0},
        {"mirostat": 1, "mirostat_tau": 0.0, "mirostat_eta": 0.0, "temperature": 1.0},
        {"top_n_sigma": 0.001, "top_k": 0, "temperature": 2.0},
    ]
    for fields in narrow:
        reply = complete(server, **fields, n_probs=4, post_sampling_probs=True, seed=7)
        assert reply["tokens"] == greedy, fields
        assert all(len(e["top_probs"]) == 1 for e in reply["completion_probabilities"]), fields
    typical = complete(server, typical_p=0.0, top_k=0, n_probs=4, post_sampling_probs=True, seed=7)
    assert all(len(e["top_probs"]) == 1 for e in typical["completion_probabilities"])


def test_min_keep_and_dynamic_temperature(server: ServerProcess) -> None:
    kept = complete(server, top_k=0, min_p=0.99, min_keep=4, n_probs=10, post_sampling_probs=True, seed=2)
    assert all(len(e["top_probs"]) == 4 for e in kept["completion_probabilities"])
    # exponent 0 puts the dynamic temperature at the top of its range: temperature 1 + 0.6 = 1.6
    common = {
        "n_predict": 1,
        "top_k": 5,
        "top_p": 1.0,
        "min_p": 0.0,
        "n_probs": 5,
        "post_sampling_probs": True,
    }
    dynamic = complete(server, **common, temperature=1.0, dynatemp_range=0.6, dynatemp_exponent=0.0)
    fixed = complete(server, **common, temperature=1.6)
    a = [t["prob"] for t in dynamic["completion_probabilities"][0]["top_probs"]]
    b = [t["prob"] for t in fixed["completion_probabilities"][0]["top_probs"]]
    assert len(a) == 5 and a == pytest.approx(b, rel=1e-5)


def test_dry_penalises_a_repeat_unless_a_breaker_stops_it(server: ServerProcess) -> None:
    greedy = greedy_tokens(server, REPEATS, 1)
    assert greedy == [1296]
    dry = {
        "prompt": REPEATS,
        "n_predict": 1,
        "temperature": 0,
        "dry_multiplier": 5.0,
        "dry_allowed_length": 1,
    }
    assert complete(server, **dry)["tokens"] != greedy
    assert complete(server, **dry, dry_sequence_breakers=[" two"])["tokens"] == greedy
    assert complete(server, **dry, samplers=["top_k", "temperature"])["tokens"] == greedy  # DRY left out


@pytest.mark.parametrize(
    "bias",
    [
        [[" Paris", False]],
        {" Paris": -100},
        {str(PARIS): False},
        [[PARIS, -100.0]],
    ],
    ids=["text-array", "text-object", "id-object", "id-array"],
)
def test_logit_bias_takes_ids_and_texts(server: ServerProcess, bias: Any) -> None:
    assert greedy_tokens(server, n=1) == [PARIS]
    assert complete(server, n_predict=1, temperature=0, logit_bias=bias)["tokens"] != [PARIS]


def test_a_seeded_non_default_chain_repeats(server: ServerProcess) -> None:
    fields = {"xtc_probability": 0.5, "xtc_threshold": 0.05, "typical_p": 0.9, "dynatemp_range": 0.5}
    first = complete(server, **fields, seed=1234, n_predict=12, cache_prompt=False)
    again = complete(server, **fields, seed=1234, n_predict=12)
    assert first["tokens"] == again["tokens"]


# (values past a soft limit of llama-server's are clamped, not refused: `typical_p: 1.5` is 1,
# `mirostat: 3` is 2, `dry_base: 0.5` the default; test_soft_limits_clamp_as_llama_server_does)
BAD_FIELDS = [
    ("typical_p", "x"),
    ("mirostat", "x"),
    ("mirostat_tau", -1),
    ("mirostat_eta", -1),
    ("dry_multiplier", -1),
    ("dry_allowed_length", -1),
    ("dry_penalty_last_n", -2),
    ("dry_sequence_breakers", []),
    ("dry_sequence_breakers", "\n"),
    ("dynatemp_range", -0.5),
    ("dynatemp_exponent", -1),
    ("top_n_sigma", "wide"),
    ("min_keep", -1),
    ("samplers", ["top_k", "bogus"]),
    ("samplers", "kq"),
    ("samplers", ["infill"]),
    ("samplers", 5),
    ("post_sampling_probs", "maybe"),
    ("logit_bias", [["Paris"]]),
    ("logit_bias", [[1.5, 1.0]]),
    ("logit_bias", {"12": True}),
    ("logit_bias", {"12": "high"}),
    ("logit_bias", [[999_999, 1.0]]),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS, ids=[f"{f}={v!r}" for f, v in BAD_FIELDS])
def test_bad_sampler_values_are_400_naming_the_field(server: ServerProcess, field: str, value: Any) -> None:
    for route, body in (
        ("/completion", {"prompt": "hi"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ):
        reply = httpx.post(server.base_url + route, json={**body, "max_tokens": 2, field: value}, timeout=60)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error" and field in error["message"], error


def test_soft_limits_clamp_as_llama_server_does(server: ServerProcess) -> None:
    """server-schema.cpp's set_limits: a value past a soft limit is clamped (a hard limit is a 400)."""
    asked = {"typical_p": 1.5, "xtc_probability": -0.1, "xtc_threshold": 2, "mirostat": 3, "dry_base": 0.5}
    reply = httpx.post(server.base_url + "/completion", json={"prompt": "hi", "n_predict": 2, **asked})
    assert reply.status_code == 200, reply.text
    settings = reply.json()["generation_settings"]
    clamped = {
        "typical_p": 1.0,
        "xtc_probability": 0.0,
        "xtc_threshold": 1.0,
        "mirostat": 2,
        "dry_base": 1.75,
    }
    assert {name: settings[name] for name in clamped} == clamped


def test_the_sampling_flags_set_the_defaults() -> None:
    flags = [
        "--mirostat", "2", "--mirostat-ent", "0", "--temp", "1.0", "--dry-multiplier", "0.5",
        "--dry-sequence-breaker", "\n", "--dry-sequence-breaker", "###", "--xtc-probability", "0.25",
        "--typical", "0.9", "--top-n-sigma", "2", "--min-keep", "3", "--dynatemp-range", "0.4",
        "--sampler-seq", "kpt", "-l", f"{PARIS}-inf",
    ]  # fmt: skip
    proc = ServerProcess("-m", "smollm2", "-c", "1024", *flags).wait_healthy()
    try:
        params = httpx.get(proc.base_url + "/props").json()["default_generation_settings"]["params"]
        assert params["mirostat"] == 2 and params["mirostat_tau"] == 0.0 and params["dry_multiplier"] == 0.5
        assert params["dry_sequence_breakers"] == ["\n", "###"] and params["xtc_probability"] == 0.25
        assert params["typical_p"] == 0.9 and params["top_n_sigma"] == 2.0 and params["min_keep"] == 3
        assert params["dynatemp_range"] == 0.4 and params["samplers"] == ["top_k", "top_p", "temperature"]
        assert params["logit_bias"] == [[PARIS, False]]
        body = {
            "prompt": PROMPT,
            "n_predict": 1,
            "n_probs": 3,
            "post_sampling_probs": True,
            "return_tokens": True,
        }
        reply = httpx.post(proc.base_url + "/completion", json=body, timeout=120).json()
        # mirostat 2 at zero surprise keeps only the best token, and the banned " Paris" is not it
        assert reply["tokens"] != [PARIS] and len(reply["completion_probabilities"][0]["top_probs"]) == 1
        override = {**body, "logit_bias": [], "mirostat": 0, "temperature": 0}
        assert httpx.post(proc.base_url + "/completion", json=override, timeout=120).json()["tokens"] == [
            PARIS
        ]
    finally:
        proc.stop()
