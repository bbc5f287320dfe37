"""Structured output and forced tool calls as a client sees them: are sampled answers valid and complete?

    python scripts/bench_structured.py                       # this checkout's server, SmolLM2 and Gemma 3
    python scripts/bench_structured.py --checkout /tmp/base  # a server started from another checkout
    python scripts/bench_structured.py --models smollm2 --answers 10
    python scripts/bench_structured.py --llama-server /path/to/llama-server   # llama.cpp's own server
    python scripts/bench_structured.py --compare a.json b.json                # two --out files, by seed

For each model a real llamba-server is started (from `--checkout`, default this one), or with
`--llama-server` a llama.cpp llama-server binary on the same model file, slots and context, and asked
through the real OpenAI and Anthropic clients, at temperature 1.0 with seeds 0..N-1 (issue #40's acceptance):

- `schema`: `response_format` json_schema with nested objects and an array of objects, none of which
  declares `additionalProperties` (max_tokens 200): how many answers are complete (finish_reason
  stop), valid JSON, valid against the schema, free of keys the schema does not declare;
- `schema_bounded`: the same with `maxItems: 4` on the array, so that an answer cut by max_tokens is
  not a model writing more and more array items (which any grammar for the schema allows);
- `required`: `tool_choice: "required"` with two tools whose parameters do not declare it
  (max_tokens 200): how many answers are a call with finish_reason tool_calls and valid arguments;
- `anthropic_any`: /v1/messages with `tool_choice: {"type": "any"}` and an input schema
  `{"city": string}` (max_tokens 120): how many answers stop with stop_reason tool_use.

and the mean completion tokens per answer. Run it before and after a change on the same machine and
compare the counts (a benchmark, not a test: the machine is shared, nothing here is timed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai

from engine import model_files

ROOT = Path(__file__).resolve().parents[1]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
            "required": ["street", "city"],
        },
        "skills": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"skill": {"type": "string"}, "years": {"type": "integer"}},
                "required": ["skill", "years"],
            },
        },
    },
    "required": ["name", "age", "address", "skills"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
BOUNDED = {
    **PERSON,
    "properties": {**PERSON["properties"], "skills": {**PERSON["properties"]["skills"], "maxItems": 4}},
}


def undeclared_keys(value: Any, schema: dict[str, Any]) -> bool:
    """Whether a document holds a key its (closed-by-intent) schema does not declare, at any depth."""
    if isinstance(value, dict):
        declared = schema.get("properties", {})
        return any(k not in declared or undeclared_keys(v, declared[k]) for k, v in value.items())
    if isinstance(value, list):
        return any(undeclared_keys(v, schema.get("items", {})) for v in value)
    return False


async def schema_answer(
    client: openai.AsyncOpenAI, seed: int, schema: dict[str, Any] = PERSON
) -> dict[str, Any]:
    reply = await client.chat.completions.create(
        model="any",
        messages=[
            {
                "role": "user",
                "content": "Describe a fictional software engineer: name, age, address and skills.",
            }
        ],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
        temperature=1.0,
        max_tokens=200,
        seed=seed,
    )
    choice = reply.choices[0]
    row = {"complete": choice.finish_reason == "stop", "tokens": reply.usage.completion_tokens}
    try:
        doc = json.loads(choice.message.content or "")
        row["json"] = True
        jsonschema.validate(doc, schema)
        row["valid"] = True
        row["no_extra_keys"] = not undeclared_keys(doc, schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        pass
    row["ok"] = bool(row["complete"] and row.get("valid"))
    return row | {"text": choice.message.content}


async def bounded_answer(client: openai.AsyncOpenAI, seed: int) -> dict[str, Any]:
    return await schema_answer(client, seed, BOUNDED)


async def required_answer(client: openai.AsyncOpenAI, seed: int) -> dict[str, Any]:
    reply = await client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "What is the weather like in Paris right now?"}],
        tools=[WEATHER, TIME],
        tool_choice="required",
        temperature=1.0,
        max_tokens=200,
        seed=seed,
    )
    choice = reply.choices[0]
    calls = choice.message.tool_calls or []
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    valid = bool(calls)
    for call in calls:
        try:
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        except (json.JSONDecodeError, jsonschema.ValidationError, KeyError):
            valid = False
    row = {"finish_tool_calls": choice.finish_reason == "tool_calls", "call": bool(calls), "valid": valid}
    row["ok"] = row["finish_tool_calls"] and valid
    text = json.dumps([c.model_dump() for c in calls]) if calls else choice.message.content
    return row | {"tokens": reply.usage.completion_tokens, "text": text}


async def anthropic_answer(client: anthropic.AsyncAnthropic, seed: int) -> dict[str, Any]:
    reply = await client.messages.create(
        model="any",
        max_tokens=120,
        messages=[{"role": "user", "content": "What is the weather like in Paris right now?"}],
        tools=[{"name": "get_weather", "description": "The current weather in a city", "input_schema": CITY}],
        tool_choice={"type": "any"},
        extra_body={"temperature": 1.0, "seed": seed},
    )
    uses = [b for b in reply.content if b.type == "tool_use"]
    valid = bool(uses)
    for use in uses:
        try:
            jsonschema.validate(use.input, CITY)
        except jsonschema.ValidationError:
            valid = False
    row = {"tool_use": reply.stop_reason == "tool_use", "valid": valid}
    text = json.dumps([b.model_dump() for b in reply.content])
    return row | {"ok": row["tool_use"] and valid, "tokens": reply.usage.output_tokens, "text": text}


async def run_scenario(answer: Any, client: Any, answers: int, concurrency: int) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)

    async def one(seed: int) -> dict[str, Any]:
        async with gate:
            return await answer(client, seed)

    return await asyncio.gather(*(one(seed) for seed in range(answers)))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = dict.fromkeys(key for row in rows for key in row if key not in ("tokens", "text"))
    counts = {key: sum(bool(r.get(key)) for r in rows) for key in keys}
    return {
        "answers": len(rows),
        **counts,
        "mean_tokens": round(statistics.mean(r["tokens"] for r in rows), 1),
    }


class Server:
    """llamba-server from a checkout (or llama.cpp's llama-server binary), on a free port of 127.0.0.1."""

    def __init__(
        self, checkout: Path, model: str, parallel: int, llama_server: Path | None, extra: list[str]
    ) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-structured-{model}-{self.port}.log"
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        if llama_server is None:
            cmd = [sys.executable, "-m", "server", "-m", model]
        else:  # the same file Llamba loads for the name; llama-server's defaults otherwise (jinja on)
            cmd = [str(llama_server), "-m", str(model_files.resolve(model))]
        cmd += ["--port", str(self.port), "-np", str(parallel), "-c", str(2048 * parallel), *extra]
        self.proc = subprocess.Popen(
            cmd, cwd=checkout, env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError("server not healthy")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def bench_model(
    server: Server, answers: int, concurrency: int, show: int, scenarios: list[str]
) -> dict[str, Any]:
    oai = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", timeout=1200, max_retries=0)
    claude = anthropic.AsyncAnthropic(base_url=server.url, api_key="none", timeout=1200, max_retries=0)
    results = {}
    for name, answer, client in (
        ("schema", schema_answer, oai),
        ("schema_bounded", bounded_answer, oai),
        ("required", required_answer, oai),
        ("anthropic_any", anthropic_answer, claude),
    ):
        if name not in scenarios:
            continue
        started = time.monotonic()
        rows = await run_scenario(answer, client, answers, concurrency)
        results[name] = summary(rows) | {"wall_s": round(time.monotonic() - started)}
        print(f"  {name}: {json.dumps(results[name])}", flush=True)
        for seed, row in [(seed, row) for seed, row in enumerate(rows) if not row["ok"]][:show]:
            print(f"    not ok, seed {seed} ({row['tokens']} tokens): {row['text']!r}", flush=True)
        results[name]["by_seed"] = rows  # in --out only: to compare two servers answer by answer
    return results


def compare(paths: list[Path]) -> None:
    """Two --out files answer by answer: how many each completed, how many texts are the same, and
    the seeds one side completed and the other did not."""
    a, b = (json.loads(p.read_text()) for p in paths)
    for model in a["models"].keys() & b["models"].keys():
        for name in a["models"][model].keys() & b["models"][model].keys():
            rows_a, rows_b = a["models"][model][name]["by_seed"], b["models"][model][name]["by_seed"]
            same = sum(x["text"] == y["text"] for x, y in zip(rows_a, rows_b, strict=True))
            only_a = [i for i, (x, y) in enumerate(zip(rows_a, rows_b, strict=True)) if x["ok"] > y["ok"]]
            only_b = [i for i, (x, y) in enumerate(zip(rows_a, rows_b, strict=True)) if y["ok"] > x["ok"]]
            ok_a, ok_b = sum(r["ok"] for r in rows_a), sum(r["ok"] for r in rows_b)
            print(
                f"{model} {name}: ok {ok_a} / {ok_b}, same text {same} of {len(rows_a)};"
                f" ok only in the first: seeds {only_a}; only in the second: seeds {only_b}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose server runs")
    parser.add_argument(
        "--llama-server", type=Path, help="run this llama.cpp llama-server binary instead of Llamba"
    )
    parser.add_argument(
        "--server-args",
        default="",
        help="more flags for the server, one string (e.g. '-t 1': llama.cpp's threads spin-wait for each"
        " other, which on a loaded machine costs more than the second thread gives)",
    )
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma3"])
    parser.add_argument("--answers", type=int, default=50)
    parser.add_argument("--parallel", type=int, default=4, help="server slots, and requests in flight")
    parser.add_argument("--out", type=Path, help="write the results as JSON here too")
    parser.add_argument("--show", type=int, default=0, help="print this many answers that are not ok")
    parser.add_argument(
        "--scenarios", nargs="+", default=["schema", "schema_bounded", "required", "anthropic_any"]
    )
    parser.add_argument("--compare", nargs=2, type=Path, help="compare two --out files and exit")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare)
        return
    commit = subprocess.run(
        ["git", "-C", str(args.checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    report: dict[str, Any] = {"checkout": str(args.checkout), "commit": commit.stdout.strip(), "models": {}}
    if args.llama_server is not None:
        version = subprocess.run([args.llama_server, "--version"], capture_output=True, text=True)
        report["llama_server"] = (version.stdout + version.stderr).strip()
        print(f"llama-server {args.llama_server}: {report['llama_server']}", flush=True)
    else:
        print(f"checkout {args.checkout} at {report['commit']}", flush=True)
    print(f"load average {os.getloadavg()}", flush=True)
    for model in args.models:
        server = Server(args.checkout, model, args.parallel, args.llama_server, args.server_args.split())
        try:
            server.wait()
            print(f"{model}:", flush=True)
            run = bench_model(server, args.answers, args.parallel, args.show, args.scenarios)
            report["models"][model] = asyncio.run(run)
        finally:
            server.stop()
    print(f"load average after: {os.getloadavg()}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
