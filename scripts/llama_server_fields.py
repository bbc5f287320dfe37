"""Every request field llama-server reads, sent alone and in realistic combinations to each route it
reads them on, with what the server answered: the status, and for a 200 the shape of the reply.

`tests/golden/llama_server_fields.json` holds the real llama-server's answers (llama.cpp 0c1e570, the
llama-cpp-python 0.3.36 sdist, SmolLM2-135M-Instruct Q4_1, `-np 4 -c 4096 --metrics`); the test
`tests/test_llama_server_fields.py` sends the same cases to Llamba and compares. Re-record with a
llama-server built from that sdist (`make llama-server`):

    .venv/bin/python scripts/llama_server_fields.py --binary ~/.cache/llamba/reference/llama-server \
        --write tests/golden/llama_server_fields.json

The fields are those of llama-server's parameter readers: `make_llama_cmpl_schema` in
tools/server/server-schema.cpp (each field alone: a usual value, a value outside its limits, a value
of the wrong type) and the OpenAI/Anthropic readers in server-common.cpp (`oaicompat_*_params_parse`).
`--check-sources DIR` fails when that schema has a field no case sends.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The capital of France is"
# SmolLM2's greedy answer to this starts with a clear margin (>= 0.6 nats a token over the first 8) on
# both servers: near ties ("Say hi": 0.03 nats) flip with the last bits of the arithmetic, which differ
# between llama.cpp's own builds too.
MESSAGES = [{"role": "user", "content": "What is 2+2?"}]
# Greedy, short: each case is one short generation on either server.
BASES: dict[str, dict[str, Any]] = {
    "/completion": {"prompt": PROMPT, "n_predict": 4, "temperature": 0},
    "/v1/completions": {"prompt": PROMPT, "max_tokens": 4, "temperature": 0},
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 4, "temperature": 0},
    "/v1/messages": {"model": "m", "messages": MESSAGES, "max_tokens": 4, "temperature": 0},
}
NATIVE = ("/completion",)
OPENAI = ("/v1/completions", "/v1/chat/completions")
LLAMA_ROUTES = NATIVE + OPENAI

# make_llama_cmpl_schema's fields: (usual value, outside its limits or None, wrong type).
SCHEMA: dict[str, tuple[Any, Any, Any]] = {
    "verbose": (True, None, "yes"),
    "stream": (True, None, "yes"),
    "echo": (True, None, "yes"),
    "timings_per_token": (True, None, "yes"),
    "cache_prompt": (False, None, "yes"),
    "return_tokens": (True, None, "yes"),
    "return_progress": (True, None, "yes"),
    "sse_ping_interval": (30, -2, "x"),
    "n_predict": (2, -2, "x"),
    "n_indent": (2, -1, "x"),
    "n_keep": (4, -2, "x"),
    "n_discard": (8, -1, "x"),
    "n_cmpl": (2, 9, "x"),
    "n_cache_reuse": (256, -1, "x"),
    "t_max_predict_ms": (5000, -2, "x"),
    "response_fields": (["content"], None, "content"),
    "top_k": (5, -3, "x"),
    "top_p": (0.9, 1.5, "x"),
    "min_p": (0.1, -0.5, "x"),
    "top_n_sigma": (1.0, None, "x"),
    "xtc_probability": (0.5, 2.0, "x"),
    "xtc_threshold": (0.1, -1.0, "x"),
    "typical_p": (0.9, None, "x"),
    "temperature": (0.7, -1.0, "x"),
    "dynatemp_range": (0.5, None, "x"),
    "dynatemp_exponent": (1.5, None, "x"),
    "repeat_last_n": (32, -2, "x"),
    "repeat_penalty": (1.1, None, "x"),
    "frequency_penalty": (0.5, None, "x"),
    "presence_penalty": (0.5, None, "x"),
    "dry_multiplier": (0.8, None, "x"),
    "dry_base": (1.75, 0.5, "x"),
    "dry_allowed_length": (2, None, "x"),
    "dry_penalty_last_n": (64, -2, "x"),
    "dry_sequence_breakers": (["\n"], [], "x"),
    "mirostat": (2, 3, "x"),
    "mirostat_tau": (5.0, None, "x"),
    "mirostat_eta": (0.1, None, "x"),
    "adaptive_target": (0.5, None, "x"),
    "adaptive_decay": (0.9, None, "x"),
    "seed": (42, None, "x"),
    "n_probs": (3, -1, "x"),
    "min_keep": (1, -1, "x"),
    "post_sampling_probs": (True, None, "yes"),
    "ignore_eos": (True, None, "yes"),
    "stop": (["\n"], None, 5),
    "samplers": (["top_k", "temperature"], None, 5),
    "logit_bias": ([[29, False]], None, "x"),
    "json_schema": ({"type": "object"}, None, 5),
    "grammar": ('root ::= "Paris"', None, 5),
    "grammar_lazy": (False, None, "yes"),
    "grammar_triggers": ([], None, "x"),
    "preserved_tokens": ([], None, "x"),
    "lora": ([], None, "x"),
    "backend_sampling": (False, None, "yes"),
    "chat_format": (0, None, "x"),
    "chat_parser": ("", None, 5),
    "parse_tool_calls": (False, None, "yes"),
    "reasoning_format": ("none", "nonsense", 5),
    "reasoning_control": (False, None, "yes"),
    "reasoning_budget_tokens": (16, None, "x"),
    "reasoning_budget_message": ("stop", None, 5),
    "reasoning_budget_start_tag": ("<think>", None, 5),
    "reasoning_budget_end_tags": (["</think>"], None, "x"),
    "generation_prompt": ("", None, 5),
    "continue_final_message": (False, None, "x"),
    "speculative.n_max": (8, -1, "x"),
    "speculative.n_min": (1, -1, "x"),
    "speculative.p_min": (0.5, 2.0, "x"),
    "speculative.type": ("none", "nonsense", 5),
    "speculative.ngram_size_n": (3, None, "x"),
    "speculative.ngram_size_m": (3, None, "x"),
    "speculative.ngram_min_hits": (1, None, "x"),
    "stream_options": ({"include_usage": True}, None, "x"),
    "id_slot": (0, 99, "x"),
    "t_max_prompt_ms": (1000, None, "x"),
    "llamba_probe_unknown_field": ({"any": 1}, None, 5),
}
SCHEMA_ONLY_SUBFIELDS = {"include_usage"}  # read inside stream_options

# The OpenAI readers' own fields (chat and completions), and the Anthropic reader's.
OPENAI_FIELDS: dict[str, tuple[tuple[str, ...], tuple[Any, ...]]] = {
    "logprobs": (OPENAI, (True, "yes")),
    "top_logprobs": (("/v1/chat/completions",), (2, -1)),
    "n": (OPENAI, (1, 3)),
    "best_of": (("/v1/completions",), (1, 2)),
    "suffix": (("/v1/completions",), ("!",)),
    "user": (OPENAI, ("someone",)),
    "max_completion_tokens": (("/v1/chat/completions",), (3, -5)),
    "response_format": (
        ("/v1/chat/completions",),
        ({"type": "json_object"}, {"type": "text"}, {"type": "nonsense"}, "json"),
    ),
    "tools": (("/v1/chat/completions",), ([], "x")),
    "tool_choice": (("/v1/chat/completions",), ("none", "auto", "nonsense")),
    "parallel_tool_calls": (("/v1/chat/completions",), (True,)),
    "chat_template_kwargs": (("/v1/chat/completions",), ({"enable_thinking": False}, "x")),
    "add_generation_prompt": (("/v1/chat/completions",), (True,)),
    "reasoning_effort": (("/v1/chat/completions",), ("low",)),
    "stop_sequences": (("/v1/messages",), (["\n"], "x")),
    "top_k": (("/v1/messages",), (5, "x")),
    "top_p": (("/v1/messages",), (0.9,)),
    "system": (("/v1/messages",), ("Be brief.", [{"type": "text", "text": "Be brief."}], 5)),
    "metadata": (("/v1/messages",), ({"user_id": "u"},)),
    "thinking": (("/v1/messages",), ({"type": "disabled"},)),
    "n_probs": (("/v1/messages",), (3,)),
    "llamba_probe_unknown_field": (("/v1/messages",), (1,)),
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# Realistic combinations, as clients send them, and values at the edge of a field's limits: (route,
# extra fields).
CHAT, NATIVE_R = "/v1/chat/completions", "/completion"
COMBOS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat-stream-usage": (
        CHAT,
        {"stream": True, "stream_options": {"include_usage": True}},
    ),
    "chat-logprobs": (CHAT, {"logprobs": True, "top_logprobs": 3}),
    "chat-top-logprobs-alone": (CHAT, {"top_logprobs": 3}),
    "chat-n-probs-post": (CHAT, {"n_probs": 2, "post_sampling_probs": True}),
    "chat-json-object": (
        CHAT,
        {"response_format": {"type": "json_object"}, "max_tokens": 8},
    ),
    "chat-json-schema": (
        CHAT,
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}},
    ),
    "chat-tools-auto": (CHAT, {"tools": [WEATHER], "tool_choice": "auto"}),
    "chat-tools-grammar": (CHAT, {"tools": [WEATHER], "grammar": 'root ::= "a"'}),
    "chat-return-progress-stream": (CHAT, {"stream": True, "return_progress": True}),
    "chat-timings-stream": (CHAT, {"stream": True, "timings_per_token": True}),
    "chat-cache-slot": (CHAT, {"cache_prompt": True, "id_slot": 1}),
    "completion-stream-probs": (NATIVE_R, {"stream": True, "n_probs": 2}),
    "completion-tokens-fields": (
        NATIVE_R,
        {"return_tokens": True, "response_fields": ["content", "tokens"]},
    ),
    "completion-nested-fields": (
        NATIVE_R,
        {"response_fields": ["generation_settings/n_predict", "x/y"]},
    ),
    "completion-token-prompt": (NATIVE_R, {"prompt": [504, 3458, 282, 4649, 314]}),
    "completion-mixed-prompt": (NATIVE_R, {"prompt": ["Hello", [504, 3458]]}),
    "completion-grammar-stop": (NATIVE_R, {"grammar": 'root ::= "Paris."', "stop": ["."]}),
    "completion-samplers-chain": (
        NATIVE_R,
        {"samplers": "kt", "top_k": 1, "temperature": 1.0, "seed": 1},
    ),
    "completion-n-predict-0": (NATIVE_R, {"n_predict": 0}),
    "completion-repeat-last-n-minus-1": (NATIVE_R, {"repeat_last_n": -1}),
    "completion-dry-last-n-minus-1": (NATIVE_R, {"dry_penalty_last_n": -1, "dry_multiplier": 0.8}),
    "completion-top-k-negative": (NATIVE_R, {"top_k": -1}),
    "completion-n-probs-negative": (NATIVE_R, {"n_probs": -1}),
    "completion-temperature-negative": (NATIVE_R, {"temperature": -0.5}),
    "completion-seed-minus-1": (NATIVE_R, {"seed": -1}),
    "completion-number-as-string": (NATIVE_R, {"n_predict": "3"}),
    "completion-float-for-int": (NATIVE_R, {"n_predict": 3.0}),
    "completion-null-field": (NATIVE_R, {"top_k": None, "stop": None}),
    "completion-limit-line": (NATIVE_R, {"t_max_predict_ms": 1, "n_predict": 16}),
    "completions-echo-logprobs": ("/v1/completions", {"echo": True, "logprobs": 2}),
    "completions-stream": ("/v1/completions", {"stream": True}),
    "completions-multi-prompt": ("/v1/completions", {"prompt": ["Hello", "Bye"]}),
    "messages-stream": ("/v1/messages", {"stream": True}),
    "messages-system-blocks": (
        "/v1/messages",
        {"system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
    ),
    "messages-tools": (
        "/v1/messages",
        {"tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]},
    ),
}

# Reply keys whose values change from run to run (times, ids, speeds) or by build.
VOLATILE = re.compile(
    r"(^|/)(id|created|system_fingerprint|model|timings|prompt_ms|predicted_ms|.*per_second|"
    r".*_per_token_ms|.*_n|t_|slot_id|id_slot|generation_settings|__verbose)"
)
# Values compared where both servers answer 200: greedy text and counts.
COMPARED_VALUES = (
    "content",
    "choices/0/message/content",
    "choices/0/text",
    "choices/0/finish_reason",
    "stop_type",
    "tokens_predicted",
    "tokens_evaluated",
    "usage/completion_tokens",
    "usage/prompt_tokens",
    "stop_reason",
    "content/0/text",
)


@dataclass(frozen=True)
class Case:
    name: str
    route: str
    body: dict[str, Any]


def cases() -> Iterator[Case]:
    """Each schema field alone on each llama route, then the OpenAI/Anthropic fields, then combos."""
    for field, (usual, outside, wrong) in SCHEMA.items():
        for label, value in (("usual", usual), ("outside", outside), ("wrong-type", wrong)):
            if value is None:
                continue
            for route in LLAMA_ROUTES:
                yield Case(f"{route} {field}={label}", route, {**BASES[route], field: value})
    for field, (routes, values) in OPENAI_FIELDS.items():
        for route in routes:
            for i, value in enumerate(values):
                yield Case(f"{route} {field}#{i}", route, {**BASES[route], field: value})
    for name, (route, extra) in COMBOS.items():
        yield Case(f"combo {name}", route, {**BASES[route], **extra})


def shape(value: Any, prefix: str = "", depth: int = 4) -> set[str]:
    """The key paths of a JSON reply (lists read through their first item as `/0`), to `depth` levels."""
    if depth == 0:
        return set()
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}{key}"
            paths.add(path)
            if not VOLATILE.search(path):
                paths |= shape(item, path + "/", depth - 1)
    elif isinstance(value, list) and value:
        paths |= shape(value[0], prefix + "0/", depth)
    return paths


def pick(value: Any, path: str) -> Any:
    for part in path.split("/"):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return None
    return value


def read_stream(text: str) -> list[Any]:
    events = []
    for line in text.splitlines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            try:
                events.append(json.loads(line[6:]))
            except json.JSONDecodeError:
                events.append({"unparsed": line[6:80]})
    return events


def outcome(reply: httpx.Response) -> dict[str, Any]:
    """What is compared: the status; for a 200, the reply's key paths and greedy values (a stream: the
    key paths of all its events, and its last event's values)."""
    result: dict[str, Any] = {"status": reply.status_code}
    if reply.status_code != 200:
        result["error"] = reply.text[:300]
        return result
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        events = read_stream(reply.text)
        result["stream"] = True
        result["keys"] = sorted(set().union(*(shape(e) for e in events)) if events else set())
        last = events[-1] if events else {}
    else:
        last = reply.json()
        result["keys"] = sorted(shape(last))
    result["values"] = {path: pick(last, path) for path in COMPARED_VALUES if pick(last, path) is not None}
    return result


def probe(base_url: str, revive: Callable[[], None] | None = None) -> dict[str, dict[str, Any]]:
    """Every case's outcome; a case that brings the server down is `{"status": "crash"}` (then
    `revive()` starts it again; without it the remaining cases crash too)."""
    results: dict[str, dict[str, Any]] = {}
    for case in cases():
        try:
            results[case.name] = outcome(httpx.post(base_url + case.route, json=case.body, timeout=120))
        except httpx.TransportError as exc:
            results[case.name] = {"status": "crash", "error": type(exc).__name__}
            if revive is not None:
                revive()
    return results


# The Anthropic conversion, compared by the prompt's token count: system blocks, tool results, errors.
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
PARTS = [{"type": "text", "text": "sunny"}, {"type": "text", "text": ", 21 degrees"}]
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": PARTS}
ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
HISTORY = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": [{"type": "text", "text": "Let me check."}, {"type": "text", "text": "Now."}, USE],
    },
]
COUNTED: dict[str, dict[str, Any]] = {
    "system-string": {"system": "You are terse.", "messages": MESSAGES},
    "system-blocks": {
        "system": [{"type": "text", "text": "A."}, {"type": "text", "text": "B."}],
        "messages": MESSAGES,
    },
    "tool-result": {"messages": [*HISTORY, {"role": "user", "content": [RESULT]}]},
    "tool-result-string": {
        "messages": [*HISTORY, {"role": "user", "content": [{**RESULT, "content": "sunny"}]}]
    },
    "tool-error": {"messages": [*HISTORY, {"role": "user", "content": [{**RESULT, "is_error": True}]}]},
    "result-then-text": {
        "messages": [*HISTORY, {"role": "user", "content": [RESULT, {"type": "text", "text": "Thanks."}]}]
    },
    "tools-auto": {"messages": MESSAGES, "tools": [ANTHROPIC_TOOL]},
    "tools-none": {"messages": MESSAGES, "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "none"}},
}
# /apply-template on OpenAI chats: the rendered prompt, compared as text.
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
RENDERED: dict[str, dict[str, Any]] = {
    "plain": {"messages": MESSAGES},
    "system": {"messages": [{"role": "system", "content": "You are terse."}, *MESSAGES]},
    "typed-parts": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}
        ]
    },
    "tool-round": {
        "messages": [
            *MESSAGES,
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
    },
    "tools-auto": {"messages": MESSAGES, "tools": [WEATHER]},
    "no-generation-prompt": {"messages": MESSAGES, "add_generation_prompt": False},
}
# A generation long enough for /slots to see it busy.
BUSY = {
    "prompt": " ".join(f"Item {i} is a red box." for i in range(80)),
    "n_predict": 64,
    "ignore_eos": True,
}


def typed_shape(value: Any, prefix: str = "") -> dict[str, str]:
    """Every key path with its JSON type (lists read through their first item)."""
    kinds: dict[str, str] = {prefix.rstrip("/") or "/": type(value).__name__}
    if isinstance(value, dict):
        for key, item in value.items():
            kinds |= typed_shape(item, f"{prefix}{key}/")
    elif isinstance(value, list) and value:
        kinds |= typed_shape(value[0], prefix + "0/")
    return kinds


def busy_slot(client: httpx.Client) -> dict[str, Any]:
    """A slot's /slots entry while it processes a prompt and generates."""
    done = threading.Event()
    worker = threading.Thread(target=lambda: (client.post("/completion", json=BUSY), done.set()))
    worker.start()
    seen: dict[str, Any] = {}
    while not done.is_set():
        busy = [slot for slot in client.get("/slots").json() if slot.get("is_processing")]
        if busy and busy[0].get("next_token", [{}])[0].get("n_decoded", 0) > 0:
            seen = busy[0]
    worker.join()
    return seen


def surfaces(base_url: str) -> dict[str, Any]:
    """/props, /slots idle and busy, /metrics' names, and the Anthropic conversion and template renders."""
    with httpx.Client(base_url=base_url, timeout=120) as client:
        idle = client.get("/slots").json()
        metrics = client.get("/metrics").text
        result: dict[str, Any] = {
            "props": typed_shape(client.get("/props").json()),
            "slots idle": typed_shape(idle[0]),
            "slots busy": typed_shape(busy_slot(client)),
            "slots after": typed_shape(next(s for s in client.get("/slots").json() if "params" in s)),
            "metrics": sorted(
                {line.split()[2] for line in metrics.splitlines() if line.startswith("# TYPE")}
            ),
        }
        models = client.get("/v1/models").json()
        result["models entry"] = typed_shape(models["models"][0])  # Ollama's shape, as llama-server fills it
        result["models data"] = typed_shape(models["data"][0])
        # Ollama's own routes (provenance: llama-server 0c1e570 answers 404 to each; Llamba serves them)
        result["ollama routes"] = {
            "GET /api/tags": client.get("/api/tags").status_code,
            "POST /api/show": client.post("/api/show", json={"model": "m"}).status_code,
        }
        for name, body in COUNTED.items():
            reply = client.post("/v1/messages/count_tokens", json={"model": "m", **body})
            result[f"count_tokens {name}"] = [reply.status_code, reply.json().get("input_tokens")]
        for name, body in RENDERED.items():
            reply = client.post("/apply-template", json=body)
            result[f"apply-template {name}"] = [reply.status_code, reply.json().get("prompt")]
    return result


def schema_fields(sources: Path) -> set[str]:
    text = (sources / "tools/server/server-schema.cpp").read_text()
    return set(re.findall(r'new field_[a-z]+\("([A-Za-z_.]+)"', text)) - SCHEMA_ONLY_SUBFIELDS


def start(binary: str, model: Path, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    args = [binary, "-m", str(model), "-np", "4", "-c", "4096", "--metrics", "--port", str(port), *extra]
    proc = subprocess.Popen(
        [*args, "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{binary} did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server")
    parser.add_argument("--binary", help="start this llama-server-compatible binary on SmolLM2")
    parser.add_argument("--port", type=int, default=8391)
    # On a CPU that lists AMX where the VM does not enable its tiles, llama.cpp's AMX buffers crash at
    # the warm-up: `--binary-args=-nr` (no repacking) leaves them out.
    parser.add_argument("--binary-args", default="", help="more flags for the binary (space-separated)")
    parser.add_argument("--write", type=Path, help="write the outcomes here (a golden)")
    parser.add_argument("--check-sources", type=Path, help="a llama.cpp source tree: every field covered?")
    parser.add_argument("--surfaces-only", action="store_true", help="re-record only the golden's surfaces")
    args = parser.parse_args()
    if args.check_sources:
        missing = schema_fields(args.check_sources) - SCHEMA.keys()
        if missing:
            raise SystemExit(f"fields with no case: {sorted(missing)}")
    if not (args.url or args.binary):
        return
    sys.path.insert(0, str(ROOT))
    from engine.model_files import resolve

    procs: list[subprocess.Popen[bytes]] = []

    def revive() -> None:
        if procs:
            procs[-1].kill()
            procs[-1].wait(30)
        procs.append(start(args.binary, resolve("smollm2"), args.port, args.binary_args.split()))

    if args.binary:
        revive()
    try:
        url = args.url or f"http://127.0.0.1:{args.port}"
        if args.surfaces_only:
            results = {"cases": json.loads(args.write.read_text())["cases"]}
        else:
            results = {"cases": probe(url, revive if args.binary else None)}
            if args.binary:  # a fresh server for the surfaces: its slots have the same history as Llamba's
                revive()
        results["surfaces"] = surfaces(url)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
    text = json.dumps(results, indent=1, sort_keys=True)
    if args.write:
        args.write.write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
