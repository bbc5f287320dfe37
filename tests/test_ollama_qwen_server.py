"""Ollama's API where it needs a tool-capable, FIM-capable model: Qwen2.5-Coder's tool calls (arguments
as objects, whole and streamed) and the tool result's round trip, /api/generate's `suffix` against
/infill, VS Code Copilot Chat's discovery of an Ollama server, and LangChain's ChatOllama with tools.

Under Ollama's automatic tool choice the 1.5B coder model writes its call in a ```json fence, which is
content (llama-server's parser for Qwen 2.5 takes calls only inside `<tool_call>`, and so does Ollama's);
`tool_choice` (Llamba's extension of /api/chat) holds it to its call syntax.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_ollama import ChatOllama

from tests.server_process import ServerProcess

NAME = "qwen"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = json.dumps({"sky": "sunny", "celsius": 21})


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", NAME, "-np", "2", "-c", "4096").wait_healthy(timeout=600)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=300) as c:
        yield c


def calling(http: httpx.Client, stream: bool) -> Any:
    body = {"model": NAME, "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "stream": stream}
    reply = http.post("/api/chat", json=body | {"options": {"temperature": 0, "num_predict": 40}})
    assert reply.status_code == 200, reply.text
    return [json.loads(line) for line in reply.text.splitlines()] if stream else reply.json()


def test_a_tool_call_and_its_result(server: ServerProcess, http: httpx.Client) -> None:
    whole = calling(http, stream=False)
    (call,) = whole["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["function"]["arguments"] == {"city": "Paris"}
    assert whole["done"] and whole["message"]["content"] == ""
    parts = calling(http, stream=True)
    with_calls = [p for p in parts if p["message"].get("tool_calls")]
    assert len(with_calls) == 1 and not with_calls[0]["done"] and parts[-1]["done"]
    assert with_calls[0]["message"]["tool_calls"][0]["function"] == call["function"]
    client = ollama.Client(host=server.base_url, timeout=300)
    history = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [{"function": call["function"]}]},
        {"role": "tool", "content": RESULT, "tool_name": "get_weather"},
    ]
    answer = client.chat(model=NAME, messages=history, options={"temperature": 0, "num_predict": 48})
    assert "sunny" in answer.message.content and "21" in answer.message.content
    assert not answer.message.tool_calls


def test_generate_with_a_suffix_is_the_infill_route(server: ServerProcess, http: httpx.Client) -> None:
    prefix, suffix = "def fib(n):\n    ", "\n    return fib(n - 1) + fib(n - 2)\n"
    client = ollama.Client(host=server.base_url, timeout=300)
    middle = client.generate(
        model=NAME, prompt=prefix, suffix=suffix, options={"temperature": 0, "num_predict": 16}
    )
    assert "if n" in middle.response and middle.done
    infill = {"input_prefix": prefix, "input_suffix": suffix, "temperature": 0, "n_predict": 16}
    assert http.post("/infill", json=infill).json()["content"] == middle.response
    assert "insert" in client.show(NAME).capabilities


def test_vs_code_copilot_chats_discovery(server: ServerProcess, http: httpx.Client) -> None:
    """Copilot Chat's Ollama provider: the version (at least 0.6.4), the models, each model's
    capabilities (it offers tool-capable ones to agent mode) and context length (model_info's
    `<architecture>.context_length`), then chat through the OpenAI route."""
    version = http.get("/api/version").json()["version"]
    assert tuple(int(p) for p in version.split(".")) >= (0, 6, 4)
    names = [m["model"] for m in http.get("/api/tags").json()["models"]]
    assert names == ["qwen:latest"]
    shown = http.post("/api/show", json={"model": names[0]}).json()
    assert "tools" in shown["capabilities"] and "completion" in shown["capabilities"]
    arch = shown["model_info"]["general.architecture"]
    assert arch == "qwen2" and shown["model_info"][f"{arch}.context_length"] == 32768
    body = {"model": names[0], "messages": ASK, "stream": True, "max_tokens": 8, "temperature": 0}
    with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        events = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 3


def test_langchain_bind_tools(server: ServerProcess) -> None:
    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return RESULT

    chat = ChatOllama(model=NAME, base_url=server.base_url, temperature=0, num_predict=48)
    first = chat.bind_tools([get_weather]).invoke([HumanMessage(ASK[0]["content"])])
    assert isinstance(first, AIMessage) and (first.content or first.tool_calls)
    call = {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}
    history = [
        HumanMessage(ASK[0]["content"]),
        AIMessage("", tool_calls=[call]),
        ToolMessage(RESULT, tool_call_id="call_1"),
    ]
    answer = chat.invoke(history)
    assert "sunny" in str(answer.content) and "21" in str(answer.content)
