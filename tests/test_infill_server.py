"""/infill: llama-server's fill-in-the-middle route. Greedy answers equal llama-server's on
Qwen2.5-Coder (tests/golden/infill.json): two cases whole and streamed in `make test` on the shared Qwen
server (tests/conftest.py), all five, n_probs and /v1/completions' `suffix` in the slow test. The prompt
layout has llama-server's length, a model without FIM tokens answers 501, bad input 400 naming the
field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from engine.gguf import GGUFFile
from engine.model_files import resolve
from engine.text.fim import ExtraChunk, InfillLimits, infill_tokens
from engine.text.tokenizer import Tokenizer
from tests.conftest import load_golden
from tests.server_process import ServerProcess

GOLDEN = load_golden("infill")
AB = {"input_prefix": "a", "input_suffix": "b"}


@pytest.fixture(scope="module")
def qwen_tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(resolve("qwen")))


def test_qwen_has_fim_tokens_and_smollm2_has_none(qwen_tokenizer: Tokenizer) -> None:
    fim = qwen_tokenizer.fim
    assert [qwen_tokenizer.tokens[t] for t in (fim.pre, fim.suf, fim.mid, fim.rep, fim.sep)] == [
        "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>",
    ]  # fmt: skip
    assert Tokenizer.from_gguf(GGUFFile(resolve("smollm2"))).fim.missing() == ["prefix", "suffix", "middle"]


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["request"]["input_prefix"][:12])
def test_the_prompt_has_llama_servers_length(qwen_tokenizer: Tokenizer, case: dict[str, Any]) -> None:
    request = case["request"]
    tok = qwen_tokenizer

    def encode(text: str) -> list[int]:
        return tok.encode(text, False, False)

    extra = [ExtraChunk(**chunk) for chunk in request.get("input_extra", [])]
    prompt = tok.encode(request.get("prompt", ""), False, True)
    tokens = infill_tokens(tok.fim, encode, encode(request["input_prefix"]), encode(request["input_suffix"]),
                           extra, prompt, InfillLimits(2048, -1, 4096), None)  # fmt: skip
    assert len(tokens) == case["tokens_evaluated"]
    assert tokens[-1] == tok.fim.mid and tokens[0] == tok.fim.rep


def test_small_contexts_keep_only_the_tail_of_the_extra_chunks(qwen_tokenizer: Tokenizer) -> None:
    """llama-server gives the extra chunks what a slot has left after a batch and twice n_predict."""
    fim = qwen_tokenizer.fim
    extra = [ExtraChunk("def f(x):\n    return x + 1\n" * 8, "a.py")]
    full = infill_tokens(fim, lambda s: qwen_tokenizer.encode(s, False, False), [1], [2], extra, [],
                         InfillLimits(2048, -1, 4096), None)  # fmt: skip
    cut = infill_tokens(fim, lambda s: qwen_tokenizer.encode(s, False, False), [1], [2], extra, [],
                        InfillLimits(2048, 1020, 4096), None)  # fmt: skip
    assert len(full) > 13 + 50
    assert cut == full[-13:]  # 4096 - 2048 - 2 * 1020 = 8 extra tokens, then [pre] 1 [suf] 2 [mid]


# llama.cpp's top two log-probabilities closer than this are a tie the two kernels' rounding may break
# either way (Qwen's Q4_K_M: case 2 has one at its 11th token, -0.836 against -0.868).
NEAR_TIE = 0.1


def margin(case: dict[str, Any]) -> float:
    """The smallest gap between llama.cpp's top two log-probabilities over the case's tokens."""
    return min(first - second for first, second in case["top2_logprobs"])


# The two cases farthest from a near tie (margins 0.39 and 0.27): their answers equal llama-server's
# whole on any kernel, so `make test` can demand every token.
CLEAR_CASES = sorted(GOLDEN["cases"], key=margin, reverse=True)[:2]


def infill_body(case: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**case["request"], **GOLDEN["request"], "return_tokens": True, **extra}


@pytest.mark.parametrize("case", CLEAR_CASES, ids=lambda c: c["request"]["input_prefix"][:12])
def test_greedy_infill_equals_llama_server_whole_and_streamed(
    qwen_server: ServerProcess, case: dict[str, Any]
) -> None:
    """Token for token llama-server's answer, with its prompt length; the stream's chunks add up to
    it and end with the final fields."""
    assert margin(case) > NEAR_TIE
    reply = httpx.post(qwen_server.base_url + "/infill", json=infill_body(case), timeout=300)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["tokens"] == case["tokens"] and out["content"] == case["content"]
    assert out["tokens_evaluated"] == case["tokens_evaluated"] and out["stop"] is True
    body = infill_body(case, stream=True)
    with httpx.stream("POST", qwen_server.base_url + "/infill", json=body, timeout=300) as streamed:
        assert streamed.status_code == 200
        chunks = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: ")]
    assert "".join(c["content"] for c in chunks) == case["content"]
    assert chunks[-1]["stop"] is True and chunks[-1]["tokens_evaluated"] == case["tokens_evaluated"]


@pytest.mark.slow
def test_greedy_infill_equals_llama_server_on_qwen(qwen_server: ServerProcess) -> None:
    """Each answer equals llama-server's token for token, up to a near tie of llama.cpp's top two
    where the two may part (then the rest differs, and is not compared); at least 4 of 5 whole."""
    whole = 0
    for case in GOLDEN["cases"]:
        reply = httpx.post(qwen_server.base_url + "/infill", json=infill_body(case), timeout=300)
        assert reply.status_code == 200, reply.text
        out = reply.json()
        assert out["tokens_evaluated"] == case["tokens_evaluated"]
        ours, ref = out["tokens"], case["tokens"]
        split = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), None)
        if split is None:
            assert out["content"] == case["content"]
            whole += 1
            continue
        first, second = case["top2_logprobs"][split]
        assert first - second < NEAR_TIE, f"parts at token {split}, not a tie: {out['content']!r}"
    assert whole >= 4
    _check_probabilities(qwen_server, GOLDEN["cases"][0])
    _check_suffix_on_v1_completions(qwen_server, GOLDEN["cases"][0])


def _check_probabilities(proc: ServerProcess, case: dict[str, Any]) -> None:
    """n_probs on /infill, as on /completion: each step's probabilities, of llama-server's tokens."""
    out = httpx.post(proc.base_url + "/infill", json=infill_body(case, n_probs=2), timeout=300).json()
    assert [p["id"] for p in out["completion_probabilities"]] == case["tokens"]


def _check_suffix_on_v1_completions(proc: ServerProcess, case: dict[str, Any]) -> None:
    """OpenAI's `suffix` on /v1/completions runs as /infill: the prompt is the prefix, and the answer is
    /infill's, token for token (the same prompt, greedy), whole and streamed, with usage counting it."""
    fields = {"max_tokens": GOLDEN["request"]["n_predict"], "temperature": 0.0, "top_k": 1}
    body = {"prompt": case["request"]["input_prefix"], "suffix": case["request"]["input_suffix"], **fields}
    reply = httpx.post(proc.base_url + "/v1/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    infill = httpx.post(proc.base_url + "/infill", json=infill_body(case), timeout=300)
    out = reply.json()
    assert out["choices"][0]["text"] == infill.json()["content"]
    assert out["usage"]["prompt_tokens"] == case["tokens_evaluated"]
    with httpx.stream(
        "POST", proc.base_url + "/v1/completions", json={**body, "stream": True}, timeout=300
    ) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == infill.json()["content"]


def test_suffix_on_a_model_without_fim_tokens_answers_501(server: ServerProcess) -> None:
    reply = httpx.post(server.base_url + "/v1/completions", json={"prompt": "def f(", "suffix": "\n"})
    assert reply.status_code == 501
    error = reply.json()["error"]
    assert error["type"] == "not_supported_error" and error["message"].startswith("'suffix': Infill is not")
    assert "prefix token is missing" in error["message"]
    assert (
        httpx.post(server.base_url + "/v1/completions", json={"prompt": "a", "suffix": 3}).status_code == 400
    )


def test_a_model_without_fim_tokens_answers_501(server: ServerProcess) -> None:
    reply = httpx.post(server.base_url + "/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert reply.status_code == 501
    error = reply.json()["error"]
    assert error["type"] == "not_supported_error" and error["code"] == 501
    assert error["message"] == (
        "Infill is not supported by this model: prefix token is missing. suffix token is missing. "
        "middle token is missing."
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input_suffix": "b"}, "input_prefix"),
        ({"input_prefix": "a"}, "input_suffix"),
        ({**AB, "prompt": 3}, "prompt"),
        ({**AB, "input_extra": {"text": "x"}}, "input_extra"),
        ({**AB, "input_extra": [{"filename": "f"}]}, "input_extra.0.text"),
        ({**AB, "input_extra": [{"text": "x", "filename": 1}]},
         "input_extra.0.filename"),
        ({**AB, "n_predict": -2}, "n_predict"),
        ({**AB, "echo": True}, "echo"),
    ],
)  # fmt: skip
def test_bad_input_is_400_naming_the_field(server: ServerProcess, body: dict[str, Any], field: str) -> None:
    reply = httpx.post(server.base_url + "/infill", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and field in error["message"]
