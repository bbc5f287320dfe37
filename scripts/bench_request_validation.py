"""Times what a chat-shaped request costs before the engine sees it: validating the body, and for
Anthropic's Messages and the Responses API their translation into the chat request.

    .venv/bin/python scripts/bench_request_validation.py [--turns 10] [--tools 20] [--repeat 5]

The bodies are an agent's: `--turns` rounds of question, answer with a tool call, and tool result,
with `--tools` tools (distinct schemas), as a coding agent resends them every turn. Each figure is the
best of --repeat runs of 100 calls; the tools' JSON-schema checks are timed with the schema cache cold
(cleared before every call) and warm, in the same run, so their ratio holds whatever the machine's load
(printed before and after).
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server.apis.anthropic.schemas import MessagesRequest  # noqa: E402
from server.apis.responses.schemas import ResponsesRequest  # noqa: E402
from server.chat.schemas import ChatCompletionRequest  # noqa: E402
from server.config.json_schema import schema_problem  # noqa: E402


def tool_schema(i: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {f"path_{i}": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
        "required": [f"path_{i}"],
        "additionalProperties": False,
    }


def anthropic_body(turns: int, tools: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "tool_0", "input": {"path_0": "a.py"}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "contents"}
        messages += [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}, use]},
            {"role": "user", "content": [result]},
        ]
    specs = [
        {"name": f"tool_{i}", "description": "a tool", "input_schema": tool_schema(i)} for i in range(tools)
    ]
    return {"model": "any", "max_tokens": 100, "system": "Be brief.", "messages": messages, "tools": specs}


def responses_body(turns: int, tools: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "question"}]
    for i in range(turns):
        items += [
            {
                "type": "function_call",
                "call_id": f"call_{i}",
                "name": "tool_0",
                "arguments": '{"path_0": "a.py"}',
            },
            {"type": "function_call_output", "call_id": f"call_{i}", "output": "contents"},
            {"role": "user", "content": f"question {i}"},
        ]
    specs = [{"type": "function", "name": f"tool_{i}", "parameters": tool_schema(i)} for i in range(tools)]
    return {"model": "any", "input": items, "tools": specs}


def best_us(fn: Callable[[], object], repeat: int) -> float:
    return min(timeit.repeat(fn, number=100, repeat=repeat)) / 100 * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--tools", type=int, default=20)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    anthropic = anthropic_body(args.turns, args.tools)
    responses = responses_body(args.turns, args.tools)
    chat = (
        MessagesRequest.model_validate(anthropic).to_chat().model_dump(exclude_none=True, exclude_unset=True)
    )

    def translate_responses() -> None:
        body = ResponsesRequest.model_validate(responses)
        body.to_chat(body.input_messages([]), stream=False)

    cases: dict[str, Callable[[], object]] = {
        "chat completions": lambda: ChatCompletionRequest.model_validate(chat),
        "anthropic messages": lambda: MessagesRequest.model_validate(anthropic).to_chat(),
        "responses": translate_responses,
    }
    print(f"load average before: {os.getloadavg()}")
    print(f"{args.turns} turns, {args.tools} tools; microseconds per request (best of {args.repeat} x 100)")
    print(f"{'body':<22}{'schema cache cold':>20}{'warm':>10}{'ratio':>8}")
    for name, fn in cases.items():

        def cold(fn: Callable[[], object] = fn) -> None:
            schema_problem.cache_clear()
            fn()

        cold_us, warm_us = best_us(cold, args.repeat), best_us(fn, args.repeat)
        print(f"{name:<22}{cold_us:>20.0f}{warm_us:>10.0f}{cold_us / warm_us:>8.1f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
