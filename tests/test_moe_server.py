"""`llamba-server -m <synthetic MoE GGUF>` serves like a dense model: chat (whole and streamed), a
tool call, and /completion, over real HTTP with the OpenAI client, on two files:

- `qwen3moe`: tests/synthetic_moe_gguf.py's Q4_K_M-style qwen3moe (16 experts, 4 used per token), the
  one llama.cpp ran for tests/golden/moe_archs.json: /completion's greedy token and top log-probabilities
  on the golden prompt are llama.cpp's last-position distribution. It has no chat template, so chats use
  the built-in chatml, as llama-server's would.
- `gpt-oss`: tests/synthetic_harmony_gguf.py's MXFP4 gpt-oss with gpt-oss's own tokenizer (o200k_harmony,
  its special ids) and llama.cpp's harmony template (its docstring says how it is built), the file
  llama.cpp loaded for tests/golden/harmony.json (scripts/make_harmony_golden.py). The template renders
  the harmony layout; answers are read as llama-server reads harmony, tools or not: the analysis
  channel is reasoning_content, the final channel content, a message to `functions.NAME` a tool call.

Random weights make the text noise, which is fine: what is checked is what the server makes of it. A
noise model writes no harmony of its own, so the harmony tests make it: a GBNF grammar over the harmony
tokens (by id) and a reasoning budget that closes the analysis block with `<|end|>` (the grammar holds
outside reasoning), or the tool-call grammar of tool_choice required. What the server parses is what
the engine generated; the chat logprobs list those tokens.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from engine.gguf import GGUFFile
from engine.reference_data import ReferenceDataError, reference_file
from engine.text.tokenizer import Tokenizer
from tests.conftest import load_golden, require
from tests.server_process import ServerProcess
from tests.synthetic_harmony_gguf import SPECIAL, TEMPLATE, write_harmony_gguf
from tests.synthetic_moe_gguf import CASES, prompt_tokens, write_gguf
from tests.test_moe import logits_of
from tests.test_tools_server import streamed

CASE = CASES["qwen3moe-q4_k_m"]
MESSAGES = [{"role": "user", "content": "Say something."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8, "description": "City name"}},
            "required": ["city"],
            "additionalProperties": False,  # else the noise runs on in keys of its own
        },
    },
}
CHANNEL, MESSAGE, START, END = (SPECIAL[t] for t in ("<|channel|>", "<|message|>", "<|start|>", "<|end|>"))


def _serve(path: Path) -> ServerProcess:
    # A work bound: the load includes compiling the expert kernels where the JIT cache is cold (every
    # CPU level's subprocess after a kernel change); at load 6 on 2 cores that passed 120 s (2026-12-06).
    return ServerProcess("-m", str(path), "-c", "4096", "-np", "2").wait_healthy(timeout=600)


@pytest.fixture(scope="module")
def qwen3moe_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = _serve(write_gguf(CASE, Path(tmp_path_factory.mktemp("moe")) / "qwen3moe.gguf"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def gpt_oss_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        template = reference_file(TEMPLATE).read_text()
    except ReferenceDataError as e:
        require(f"llama.cpp reference data unavailable: {e}")
        raise
    return write_harmony_gguf(Path(tmp_path_factory.mktemp("harmony")) / "gpt-oss.gguf", template)


@pytest.fixture(scope="module")
def gpt_oss_server(gpt_oss_file: Path) -> Iterator[ServerProcess]:
    proc = _serve(gpt_oss_file)
    yield proc
    proc.stop()


@pytest.fixture(params=["qwen3moe", "gpt_oss"])
def server(request: pytest.FixtureRequest) -> ServerProcess:
    """Each file's server (started once per module)."""
    return request.getfixturevalue(f"{request.param}_server")


def api(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return api(server)


@pytest.fixture(scope="module")
def oss(gpt_oss_server: ServerProcess) -> openai.OpenAI:
    return api(gpt_oss_server)


def test_completion_is_llama_cpp_s_distribution(qwen3moe_server: ServerProcess) -> None:
    golden = load_golden("moe_archs")["cases"][CASE.name]
    body = {"prompt": prompt_tokens(CASE), "n_predict": 1, "temperature": 0, "n_probs": 3}
    reply = httpx.post(qwen3moe_server.base_url + "/completion", json=body, timeout=60).json()
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
    llama.cpp's generic JSON format; gpt-oss's a harmony message to functions.get_weather), the parser
    returns it as a tool call."""
    reply = client.chat.completions.create(
        model="x", messages=MESSAGES, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=400
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


# -- gpt-oss: harmony ---------------------------------------------------------------------------------
def test_gpt_oss_tokenizes_and_predicts_as_llama_cpp(
    gpt_oss_file: Path, gpt_oss_server: ServerProcess
) -> None:
    """The served file is the one llama.cpp loaded (same bytes); its tokens for a harmony prompt are
    llama.cpp's (markers as single special tokens, no BOS) and so is the next-token distribution."""
    golden = load_golden("harmony")
    assert hashlib.sha256(gpt_oss_file.read_bytes()).hexdigest() == golden["sha256"]
    want = golden["llama_cpp"]
    # What llama.cpp's load prints for the real gpt-oss-20b too. (Its EOT, <|endoftext|>, is the first
    # of its EOT texts in std::unordered_map order; the tokenizer takes the first in list order,
    # <|end|>: neither is end-of-generation here, so nothing a request sees tells them apart.)
    tok = Tokenizer.from_gguf(GGUFFile(gpt_oss_file))
    assert (tok.n_vocab, tok.bos_id, tok.eos_id, tok.add_bos) == (
        want["n_vocab"],
        want["bos"],
        want["eos"],
        want["add_bos"],
    )
    assert sorted(tok.eog_ids) == want["eog"]
    url = gpt_oss_server.base_url
    body = {"content": golden["prompt"], "add_special": True}
    assert httpx.post(url + "/tokenize", json=body, timeout=60).json()["tokens"] == want["tokens"]
    body = {"prompt": golden["prompt"], "n_predict": 1, "temperature": 0, "n_probs": 5}
    (step,) = httpx.post(url + "/completion", json=body, timeout=60).json()["completion_probabilities"]
    (best, _), *_ = want["top_logprobs"]
    assert step["id"] == best
    got = {top["id"]: top["logprob"] for top in step["top_logprobs"]}
    for token, logprob in want["top_logprobs"]:
        assert got.get(token) == pytest.approx(logprob, abs=0.05)


def test_harmony_template_renders_the_chat(gpt_oss_server: ServerProcess) -> None:
    """llama.cpp's harmony template through /apply-template: the system block with the request's
    reasoning effort, the system message as the developer's instructions with the tools' namespace, a
    past turn's reasoning as its analysis message (reasoning_content -> `thinking`, as llama.cpp maps
    it, with tools or without), its call and the tool's result; the markers are single tokens."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "reasoning_content": "Need the weather.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    history = (
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
        "<|call|>"
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
        "<|start|>assistant"
    )
    url = gpt_oss_server.base_url

    def render(**more: Any) -> tuple[str, str]:
        body = {"messages": messages, "reasoning_effort": "high", **more}
        prompt = httpx.post(url + "/apply-template", json=body, timeout=60).json()["prompt"]
        system, rest = prompt.split("<|end|>", 1)
        assert system.startswith("<|start|>system<|message|>You are ChatGPT, a large language model")
        assert "\nReasoning: high\n" in system
        return system, rest

    system, rest = render(tools=[WEATHER])
    assert system.endswith("Calls to these tools must go to the commentary channel: 'functions'.")
    assert rest == (
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
        "namespace functions {\n\n// Current weather\ntype get_weather = (_: {\n// City name\n"
        "city: string,\n}) => any;\n\n} // namespace functions<|end|>" + history
    )
    system, rest = render()  # no tools offered any more: the history renders the same
    assert system.endswith("Channel must be included for every message.")
    assert rest == "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>" + history

    pieces = httpx.post(url + "/tokenize", json={"content": rest, "with_pieces": True}, timeout=60).json()
    ids = {p["piece"]: p["id"] for p in pieces["tokens"] if p["piece"].startswith("<|")}
    markers = ("<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|call|>")
    assert ids == {k: v for k, v in SPECIAL.items() if k in markers}


# The answer a real gpt-oss writes: an analysis message, then the final one. The grammar holds outside
# the reasoning block: it opens the analysis, the reasoning budget closes it after the model's own
# tokens, and then it spells the final message.
HARMONY_GRAMMAR = (
    f'root ::= <[{CHANNEL}]> "analysis" <[{MESSAGE}]> '
    f'<[{START}]> "assistant" <[{CHANNEL}]> "final" <[{MESSAGE}]> "Hello!"'
)
HARMONY_ASK: dict[str, Any] = {"grammar": HARMONY_GRAMMAR, "reasoning_budget_tokens": 3}


def _chat(oss: openai.OpenAI, **more: Any) -> Any:
    return oss.chat.completions.create(
        model="x", messages=MESSAGES, temperature=0, logprobs=True, **{"max_tokens": 30, **more}
    )


def test_harmony_answer_parses_into_reasoning_and_content(oss: openai.OpenAI) -> None:
    """No tools (llama-server reads harmony whatever the request): the analysis channel's text is
    reasoning_content, the final channel's the content, whole and streamed alike."""
    whole = _chat(oss, extra_body=HARMONY_ASK)
    choice = whole.choices[0]
    tokens = [t.token for t in choice.logprobs.content]
    opened, closed = tokens.index("<|message|>"), tokens.index("<|end|>")
    assert tokens[:opened] == ["<|channel|>", "analysis"] and closed > opened + 1
    assert "".join(tokens[closed + 1 :]) == "<|start|>assistant<|channel|>final<|message|>Hello!"
    reasoning = choice.message.model_extra["reasoning_content"]
    assert reasoning == "".join(tokens[opened + 1 : closed]).strip() and reasoning
    assert choice.message.content == "Hello!"
    assert choice.finish_reason == "stop"

    chunks = [c for c in _chat(oss, extra_body=HARMONY_ASK, stream=True) if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    thought = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert (thought, content) == (reasoning, "Hello!")
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_harmony_without_reasoning_format_is_text(oss: openai.OpenAI) -> None:
    """reasoning_format none: the analysis message stays in the content as the model wrote it, markers and
    all, and the final message's header is dropped (llama.cpp's test-chat.cpp case for GPT-OSS)."""
    reply = _chat(oss, extra_body={**HARMONY_ASK, "reasoning_format": "none"})
    message = reply.choices[0].message
    assert message.content.startswith("<|channel|>analysis<|message|>")
    assert message.content.endswith("<|end|>Hello!")
    assert "<|channel|>final" not in message.content
    assert not message.model_extra.get("reasoning_content")


def test_harmony_tool_call_parses_whole_and_streamed(oss: openai.OpenAI) -> None:
    """tool_choice required: the engine writes a harmony message to functions.get_weather under the
    format's grammar; whole and streamed, it comes back as the same call and no content."""
    ask = {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 200}
    whole = _chat(oss, **ask)
    choice = whole.choices[0]
    written = "".join(t.token for t in choice.logprobs.content)
    assert "to=functions.get_weather" in written and "<|channel|>" in written
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city"} and written.rstrip().endswith("}")
    assert not choice.message.content
    assert choice.finish_reason == "tool_calls"

    content, calls, finish = streamed(_chat(oss, stream=True, **ask))
    assert content == "" and finish == "tool_calls"
    ((name, streamed_arguments),) = calls
    assert name == "get_weather" and json.loads(streamed_arguments) == arguments
