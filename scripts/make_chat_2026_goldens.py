"""llama-server's prompts for the Qwen3.5 and Gemma 4 chat templates: tests/golden/chat_2026.json.

Each template of llama.cpp's models/templates (Qwen3.5-4B, google-gemma-4-31B-it and its -interleaved
variant) is loaded into the real llama-server (llama.cpp 0c1e570, the llama-cpp-python 0.3.36 sdist's,
`make llama-server`) over SmolLM2-135M-Instruct Q4_1 (`--chat-template-file`; the model only lends its
vocabulary's BOS/EOS texts), and every body of CASES is posted to /apply-template: system and user,
multi-turn with past reasoning, tools declared, past calls and their results, parallel calls, a turn that
ends on a tool result, thinking on and off (chat_template_kwargs), no generation prompt, an assistant
prefill; and llama.cpp's own generation-prompt checks of tests/test-chat.cpp (test_template_generation_prompt:
thinking, a continued message, a continuation after a tool result), which the script checks on the server
too. tests/test_chat_qwen35_gemma4.py posts the same bodies to Llamba and compares the prompts.

    .venv/bin/python scripts/make_chat_2026_goldens.py --binary LLAMA_SERVER -o tests/golden/chat_2026.json

The server runs with `LLAMA_ARG_REPACK=0 OMP_WAIT_POLICY=PASSIVE` (this VM lists AMX but its tiles
crash), `-np 1 -c 1024 -t 2`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.model_files import resolve  # noqa: E402
from engine.reference_data import SDIST_REQUIREMENT, reference_file  # noqa: E402

TEMPLATES = ("Qwen3.5-4B", "google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved")
SYSTEM = {"role": "system", "content": "You are a helpful assistant.\n"}
USER = {"role": "user", "content": "What is the weather in Paris?"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "Forecast days"},
            },
            "required": ["city"],
        },
    },
}
TODO = {
    "type": "function",
    "function": {
        "name": "set_todos",
        "description": "Replace the todo list",
        "parameters": {
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "description": "The items",
                    "items": {
                        "type": "object",
                        "properties": {"text": {"type": "string"}, "done": {"type": "boolean"}},
                        "required": ["text"],
                    },
                },
                "options": {
                    "type": "object",
                    "properties": {"notify": {"type": "boolean"}, "priority": {"type": "number"}},
                },
                "note": {"type": "string", "nullable": True},
            },
            "required": ["todos"],
        },
    },
}
NO_ARGS = {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {}}}


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


PARIS_CALL = call("c1", "get_weather", {"city": "Paris", "days": 2})
TODO_CALL = call(
    "c2", "set_todos", {"todos": [{"text": "buy milk", "done": False}], "options": {"notify": True}}
)
CALL_TURN = {"role": "assistant", "content": "", "tool_calls": [PARIS_CALL]}
THOUGHTFUL_CALL = {
    "role": "assistant",
    "content": "Let me check.",
    "reasoning_content": "The user wants the weather.",
    "tool_calls": [PARIS_CALL],
}
PARTS = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
PAST = [
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": "A greeting."},
]

CASES: dict[str, dict[str, Any]] = {
    "system_user": {"messages": [SYSTEM, USER]},
    "user_only": {"messages": [USER]},
    "thinking_off": {"messages": [SYSTEM, USER], "chat_template_kwargs": {"enable_thinking": False}},
    "thinking_on": {"messages": [USER], "chat_template_kwargs": {"enable_thinking": True}},
    "multi_turn_reasoning": {"messages": [SYSTEM, *PAST, USER]},
    "multi_turn_thinking_off": {
        "messages": [*PAST, USER],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "content_parts": {"messages": [{"role": "user", "content": PARTS}]},
    "no_generation_prompt": {"messages": [SYSTEM, USER], "add_generation_prompt": False},
    "tools": {"messages": [SYSTEM, USER], "tools": [WEATHER, TODO, NO_ARGS]},
    "tools_thinking_off": {
        "messages": [USER],
        "tools": [WEATHER],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "tool_call_and_result": {
        "messages": [SYSTEM, USER, CALL_TURN, result("c1", '{"temperature": 21, "sky": "clear"}'),
                     {"role": "assistant", "content": "It is 21 degrees and clear."},
                     {"role": "user", "content": "Thanks! And tomorrow?"}],
        "tools": [WEATHER],
    },
    "ends_on_tool_result": {
        "messages": [USER, THOUGHTFUL_CALL, result("c1", "sunny")],
        "tools": [WEATHER],
    },
    "parallel_calls": {
        "messages": [USER, {"role": "assistant", "content": None, "tool_calls": [PARIS_CALL, TODO_CALL]},
                     result("c1", "sunny"), result("c2", "ok")],
        "tools": [WEATHER, TODO],
    },
    "history_calls_without_tools": {
        "messages": [USER, CALL_TURN, result("c1", "sunny"), {"role": "assistant", "content": "Sunny."},
                     {"role": "user", "content": "Thanks"}],
    },
    "prefill_content": {
        "messages": [USER, {"role": "assistant", "content": "It is", "reasoning_content": "Easy."}],
    },
    "prefill_reasoning": {
        "messages": [USER, {"role": "assistant", "content": "", "reasoning_content": "The user"}],
    },
}  # fmt: skip


# llama.cpp's own expectations (tests/test-chat.cpp, test_template_generation_prompt, 0c1e570): the prompt
# ends with each generation prompt (a continuation's included). The messages are that test's.
TC_SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TC_USER = {"role": "user", "content": "Hey there!"}
TC_CONTENT = {"role": "assistant", "content": "Hello, ", "reasoning_content": "I'm thinking"}
TC_REASONING = {"role": "assistant", "content": "", "reasoning_content": "I'm"}
TC_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"type": "function", "function": {"name": "special_function", "arguments": '{"arg1": 1}'}}
    ],
}
TC_RESULT = {"role": "tool", "content": "Sunny", "tool_call_id": "call0", "name": "special_function"}
BASIC = {"messages": [TC_SYSTEM, TC_USER]}
CONTENT = {
    "messages": [TC_SYSTEM, TC_USER, TC_CONTENT],
    "add_generation_prompt": False,
    "continue_final_message": "content",
}
REASONING = {
    "messages": [TC_SYSTEM, TC_USER, TC_REASONING],
    "add_generation_prompt": False,
    "continue_final_message": "reasoning_content",
}
AFTER_CALL = {**REASONING, "messages": [TC_SYSTEM, TC_USER, TC_CALL, TC_RESULT, TC_REASONING]}
GENERATION_PROMPTS = {
    "Qwen3.5-4B": [
        (BASIC, "<|im_start|>assistant\n<think>\n"),
        (CONTENT, "<|im_start|>assistant\n<think>\nI'm thinking\n</think>\n\nHello, "),
        (REASONING, "<|im_start|>assistant\n<think>\nI'm"),
    ],
    "google-gemma-4-31B-it": [
        (BASIC, "<|turn>model\n"),
        (CONTENT, "<|turn>model\n<|channel>thought\nI'm thinking<channel|>Hello, "),
        (REASONING, "<|turn>model\n<|channel>thought\nI'm"),
        (AFTER_CALL, "<|channel>thought\nI'm"),
    ],
}  # fmt: skip


def start(binary: str, model: Path, template: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LLAMA_ARG_REPACK": "0", "OMP_WAIT_POLICY": "PASSIVE"}
    args = [binary, "-m", str(model), "--chat-template-file", str(template), "-np", "1", "-c", "1024"]
    proc = subprocess.Popen(
        [*args, "-t", "2", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("llama-server did not come up")


def prompts(binary: str, model: Path, template: str, port: int) -> dict[str, Any]:
    proc = start(binary, model, reference_file(f"models/templates/{template}.jinja"), port)
    try:
        out: dict[str, Any] = {}
        for name, body in CASES.items():
            reply = httpx.post(f"http://127.0.0.1:{port}/apply-template", json=body, timeout=30)
            out[name] = {"status": reply.status_code, "prompt": reply.json().get("prompt")}
        for i, (body, ending) in enumerate(GENERATION_PROMPTS.get(template, [])):
            prompt = httpx.post(f"http://127.0.0.1:{port}/apply-template", json=body, timeout=30).json()[
                "prompt"
            ]
            if not prompt.endswith(ending):  # test-chat.cpp's check, on the server
                raise RuntimeError(
                    f"{template} generation prompt {i}: {prompt!r} does not end with {ending!r}"
                )
            out[f"test_chat_generation_prompt_{i}"] = {"status": 200, "prompt": prompt, "ends_with": ending}
        return out
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", required=True, help="llama-server of llama.cpp 0c1e570")
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--port", type=int, default=18431)
    args = parser.parse_args()
    model = resolve("smollm2")
    golden = {
        "source": f"llama-server of llama.cpp 0c1e570 ({SDIST_REQUIREMENT}'s sdist), /apply-template, "
        "SmolLM2-135M-Instruct Q4_1 with --chat-template-file; scripts/make_chat_2026_goldens.py",
        "cases": CASES,
        "test_chat_generation_prompts": {
            "source": "tests/test-chat.cpp test_template_generation_prompt (llama.cpp 0c1e570): the prompt "
            "ends with `ends_with`; `prompt` is llama-server's",
            "bodies": {t: [body for body, _ in checks] for t, checks in GENERATION_PROMPTS.items()},
        },
        "prompts": {t: prompts(args.binary, model, t, args.port) for t in TEMPLATES},
    }
    args.out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
