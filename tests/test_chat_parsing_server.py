"""A chat answer on the wire as llama-server 0c1e570 reports it (tools/server/server-task.cpp, and its own
test_chat_completion.py::test_chat_template_assistant_prefill), on real SmolLM2 servers:

- an assistant prefill: the prompt ends with the prefilled text; a whole reply's message is the prefill
  joined with the continuation; a stream sends the prefill first unless the client named
  continue_final_message (then only with `echo`); `-v` puts `__verbose` in every reply;
- the template's format parser reads every chat answer, with or without tools: a GPT-OSS template's
  channel markup is not left in the content of an answer to a request without tools.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.reference_data import ReferenceDataError, reference_file
from tests.conftest import require
from tests.server_process import ServerProcess

BOOK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
# What llama.cpp's own test asserts the prompt ends with (its Llama 3.1 template, prefill "Whill").
PROMPT_END = "<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>"
PROMPT_END += "<|start_header_id|>assistant<|end_header_id|>\n\n"


def template_file(name: str) -> Path:
    try:
        return reference_file(f"models/templates/{name}.jinja")
    except ReferenceDataError as e:
        require(f"llama.cpp reference data unavailable: {e}")
        raise


@pytest.fixture(scope="module")
def llama31_server() -> Iterator[ServerProcess]:
    """SmolLM2 under llama.cpp's Llama 3.1 template, with -v (llama-server's `__verbose` in replies)."""
    template = template_file("meta-llama-Llama-3.1-8B-Instruct")
    proc = ServerProcess(
        "-m", "smollm2", "-np", "1", "-c", "1024", "-v", "--chat-template-file", str(template)
    )
    yield proc.wait_healthy()
    proc.stop()


@pytest.fixture(scope="module")
def gpt_oss_server() -> Iterator[ServerProcess]:
    """SmolLM2 under llama.cpp's GPT-OSS template: a grammar makes it write harmony's markup."""
    template = template_file("openai-gpt-oss-120b")
    proc = ServerProcess("-m", "smollm2", "-np", "1", "-c", "2048", "--chat-template-file", str(template))
    yield proc.wait_healthy()
    proc.stop()


def stream_parts(api: httpx.Client, body: dict[str, Any]) -> list[tuple[str, str]]:
    """A chat stream's (kind, text) deltas in order: kind "content" or "reasoning_content"."""
    parts = []
    with api.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice["delta"]
                parts += [(k, delta[k]) for k in ("reasoning_content", "content") if delta.get(k)]
    return parts


def test_an_assistant_prefill_on_the_wire_as_llama_server_sends_it(llama31_server: ServerProcess) -> None:
    """llama.cpp's test_chat_template_assistant_prefill, and what the reply carries: the whole message
    is the prefill joined with the continuation (the continuation alone is `__verbose.content`); a
    stream sends the prefill first (llama-server parses the prefill and the answer as one text), unless
    the client named continue_final_message, which sends only the continuation unless `echo`."""
    with httpx.Client(base_url=llama31_server.base_url, timeout=120) as api:
        parts_prefill = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
        for prefill, rendered in (("Whill", "Whill"), (parts_prefill, "Wh\n\nill")):
            body = {
                "max_tokens": 8,
                "temperature": 0,
                "messages": [*BOOK, {"role": "assistant", "content": prefill}],
            }
            reply = api.post("/chat/completions", json=body).json()
            verbose = reply["__verbose"]  # the server's -v, as llama-server's --verbose
            assert verbose["prompt"].endswith(PROMPT_END + rendered)
            assert verbose["content"] and not verbose["content"].startswith(rendered)
            whole = reply["choices"][0]["message"]["content"]
            assert whole == rendered + verbose["content"]
            parts = stream_parts(api, body)
            assert parts[0] == ("content", rendered)
            assert "".join(text for _, text in parts) == whole
            named = {**body, "continue_final_message": True, "add_generation_prompt": False}
            assert (
                api.post("/chat/completions", json=named).json()["choices"][0]["message"]["content"] == whole
            )
            assert "".join(text for _, text in stream_parts(api, named)) == verbose["content"]
            assert "".join(text for _, text in stream_parts(api, {**named, "echo": True})) == whole
        quiet = api.post("/chat/completions", json={**body, "verbose": False}).json()
        assert "__verbose" not in quiet and quiet["choices"][0]["message"]["content"] == whole


def test_a_prefilled_reasoning_is_continued_as_reasoning(llama31_server: ServerProcess) -> None:
    """continue_final_message "reasoning_content" on a template without thinking tags: nothing of the
    reasoning reaches the prompt (llama.cpp's rule), and "content" continues the content."""
    message = {"role": "assistant", "content": "It is", "reasoning_content": "The user wants a book."}
    body = {"max_tokens": 4, "temperature": 0, "verbose": True, "messages": [*BOOK, message]}
    with httpx.Client(base_url=llama31_server.base_url, timeout=120) as api:
        reply = api.post("/chat/completions", json={**body, "continue_final_message": "content"}).json()
        assert reply["__verbose"]["prompt"].endswith(PROMPT_END + "It is")
        assert reply["choices"][0]["message"]["content"].startswith("It is")
        bad = api.post("/chat/completions", json={**body, "continue_final_message": "tools"})
        assert bad.status_code == 400 and "continue_final_message" in bad.text


HARMONY = "<|channel|>analysis<|message|>Hmm<|end|><|start|>assistant<|channel|>final<|message|>Hi there"


def test_the_format_parser_reads_an_answer_without_tools(gpt_oss_server: ServerProcess) -> None:
    """A GPT-OSS template's answer to a request without tools: its channels are read as llama-server
    reads them, whole and streamed. reasoning_format none keeps the analysis message raw (llama.cpp's
    test-chat.cpp case) and drops the final message's header; before, the whole markup was content."""
    gbnf = "root ::= " + json.dumps(HARMONY)
    body = {"messages": [{"role": "user", "content": "Hi"}], "grammar": gbnf, "max_tokens": 64}
    with httpx.Client(base_url=gpt_oss_server.base_url, timeout=120) as api:
        raw = {**body, "reasoning_format": "none"}
        message = api.post("/v1/chat/completions", json=raw).json()["choices"][0]["message"]
        expected = "<|channel|>analysis<|message|>Hmm<|end|>Hi there"
        assert message["content"] == expected and "reasoning_content" not in message
        assert "".join(text for _, text in stream_parts(api, raw)) == expected
