"""`llamba-server -m <synthetic qwen3moe GGUF>` serves like a dense model: chat (whole and streamed), a
tool call, and /completion, over real HTTP with the OpenAI client.

The file is tests/synthetic_moe_gguf.py's Q4_K_M-style qwen3moe (16 experts, 4 used per token), the one
llama.cpp ran for tests/golden/moe_archs.json: /completion's greedy token and top log-probabilities on
the golden prompt are llama.cpp's last-position distribution. It has no chat template, so chats use
the built-in chatml, as llama-server's would; its random weights make the text noise, which is fine:
what is checked is what the server makes of it.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import load_golden
from tests.server_process import ServerProcess
from tests.synthetic_moe_gguf import CASES, prompt_tokens, write_gguf
from tests.test_moe import logits_of

CASE = CASES["qwen3moe-q4_k_m"]
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    path = write_gguf(CASE, Path(tmp_path_factory.mktemp("moe")) / "qwen3moe.gguf")
    proc = ServerProcess("-m", str(path), "-c", "4096", "-np", "2").wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")


def test_completion_is_llama_cpp_s_distribution(server: ServerProcess) -> None:
    golden = load_golden("moe_archs")["cases"][CASE.name]
    body = {"prompt": prompt_tokens(CASE), "n_predict": 1, "temperature": 0, "n_probs": 3}
    reply = httpx.post(server.base_url + "/completion", json=body, timeout=60).json()
    last = logits_of(golden)[-1].astype(np.float64)
    logprobs = last - last.max() - np.log(np.exp(last - last.max()).sum())
    (step,) = reply["completion_probabilities"]
    assert step["id"] == int(last.argmax())
    assert [top["id"] for top in step["top_logprobs"]] == np.argsort(-last)[:3].tolist()
    for top in step["top_logprobs"]:
        assert top["logprob"] == pytest.approx(logprobs[top["id"]], abs=0.05)


def test_chat_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="x", messages=MESSAGES, temperature=0, max_tokens=12)
    assert whole.choices[0].finish_reason in ("length", "stop")
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 12
    stream = client.chat.completions.create(
        model="x", messages=MESSAGES, temperature=0, max_tokens=12, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_a_required_tool_call_comes_back_parsed(client: openai.OpenAI) -> None:
    """tool_choice required: the grammar makes the noise model emit a call (chatml has no call syntax:
    llama.cpp's generic JSON format), the parser returns it as a tool call."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 8}},
                    "required": ["city"],
                    "additionalProperties": False,  # else the noise runs on in keys of its own
                },
            },
        }
    ]
    reply = client.chat.completions.create(
        model="x", messages=MESSAGES, tools=tools, tool_choice="required", temperature=0, max_tokens=400
    )
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}
    assert reply.choices[0].finish_reason == "tool_calls"


def test_two_requests_at_once_get_what_each_gets_alone(server: ServerProcess) -> None:
    """Two slots decode in shared batches (their tokens routed to different experts in one step): each
    reply is the one it gets alone (greedy)."""

    def complete(prompt: str) -> str:
        body = {"prompt": prompt, "n_predict": 10, "temperature": 0, "cache_prompt": False}
        return httpx.post(server.base_url + "/completion", json=body, timeout=60).json()["content"]

    prompts = ["the cat sat on", "in the beginning there was"]
    alone = [complete(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        together = list(pool.map(complete, prompts))
    assert together == alone
