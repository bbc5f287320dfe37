"""The server-side tool loop end to end: a real server with SmolLM2, real MCP server processes
(mcp-server-time and the fixture servers), real clients (httpx, the `openai` SDK, bare sockets).

SmolLM2 under the generic JSON format calls a tool whenever one is offered, so the tests that need one
exact call force it with a named tool_choice and `max_tool_rounds: 1`: round one calls the tool, round
two answers (the loop's last round may only answer).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.server_process import LIVENESS_S, ServerProcess, wait_until
from tests.test_mcp_server import VENV_BIN, fixture, wait_for_tools, write_config
from tests.test_sessions_server import RawChatStream, lookup, replay, sse_payloads

TIME = {"type": "mcp", "server_label": "time", "allowed_tools": ["get_current_time"]}
ASK_TIME = [{"role": "user", "content": "What time is it now in UTC?"}]
MAX_ROUNDS = 4  # the server's --tool-max-rounds


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    assert shutil.which("mcp-server-time", path=VENV_BIN), "pip install mcp-server-time (the test extra)"
    config = write_config(
        tmp_path_factory.mktemp("agents") / "mcp.json",
        {
            "time": {"command": str(Path(VENV_BIN) / "mcp-server-time")},
            "slow": fixture("slow"),
            "crash": fixture("crash", restart_cooldown_ms=500),
            "garbage": fixture("garbage"),
        },
    )
    args = ("-m", "smollm2", "-np", "4", "-c", "8192", "--mcp-servers-config", str(config))
    proc = ServerProcess(*args, "--tool-max-rounds", str(MAX_ROUNDS)).wait_healthy()
    wait_for_tools(proc)
    yield proc
    proc.stop()


@pytest.fixture
def client(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.base_url, timeout=300) as c:
        yield c


def forced(tool: str, server: str, **extra: Any) -> dict[str, Any]:
    """A request that makes the model call `<server>_<tool>` once, then answer."""
    return {
        "messages": [{"role": "user", "content": "Please run the tool, then tell me what it said."}],
        "tools": [{"type": "mcp", "server_label": server, "allowed_tools": [tool]}],
        "tool_choice": {"type": "function", "function": {"name": f"{server}_{tool}"}},
        "max_tool_rounds": 1,
        "temperature": 0,
        "max_tokens": 300,
        **extra,
    }


def time_request(**extra: Any) -> dict[str, Any]:
    return {**forced("get_current_time", "time"), "messages": ASK_TIME, **extra}


def chat(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def busy_slots(client: httpx.Client) -> int:
    return sum(s["is_processing"] for s in client.get("/slots").json())


def cancelled_calls(client: httpx.Client) -> list[Any]:
    reply = client.post("/tools", json={"tool": "slow_cancelled", "params": {}}).json()
    return json.loads(reply["plain_text_response"])


def hanging_calls(client: httpx.Client) -> list[Any]:
    """The request ids of the `hang` calls the slow MCP server has received."""
    reply = client.post("/tools", json={"tool": "slow_hanging", "params": {}}).json()
    return json.loads(reply["plain_text_response"])


def check_real_time(result: str, arguments: dict[str, Any]) -> None:
    """The result is mcp-server-time's own answer for the model's arguments, given just now."""
    got = json.loads(result)
    assert got["timezone"] == arguments["timezone"]
    now = dt.datetime.now(dt.UTC)
    assert abs((dt.datetime.fromisoformat(got["datetime"]) - now).total_seconds()) < 600


# -- one run: call, result, answer -------------------------------------------------------------------
def test_the_time_tool_runs_and_the_next_round_sees_its_real_result(client: httpx.Client) -> None:
    reply = chat(client, time_request(verbose=True))
    choice = reply["choices"][0]
    call_message, result_message = choice["intermediate_messages"]
    [call] = call_message["tool_calls"]
    assert call_message["role"] == "assistant" and call["function"]["name"] == "time_get_current_time"
    assert result_message["role"] == "tool" and result_message["tool_call_id"] == call["id"]
    assert result_message["is_error"] is False
    check_real_time(result_message["content"], json.loads(call["function"]["arguments"]))
    first, second = reply["__verbose"]["rounds"]
    # The second round's prompt holds the result (the generic format shows it as JSON text).
    assert json.dumps(result_message["content"])[1:-1] in second["prompt"]
    assert second["prompt"].startswith(first["prompt"])
    # ... and reused the first round's cached prompt: only the new tail was processed.
    assert second["timings"]["cache_n"] >= first["timings"]["cache_n"] + first["timings"]["prompt_n"]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"].strip()
    assert not second["tool_calls"], "the last round may only answer"
    usage = reply["usage"]
    n_prompts = [r["timings"]["cache_n"] + r["timings"]["prompt_n"] for r in (first, second)]
    assert usage["prompt_tokens"] == sum(n_prompts)
    assert usage["completion_tokens"] == sum(r["timings"]["predicted_n"] for r in (first, second))
    assert reply["__verbose"]["prompt"] == second["prompt"]


def test_the_openai_sdk_streams_a_run_with_the_tool_result_as_its_own_delta(srv: ServerProcess) -> None:
    api = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0, timeout=300)
    body = time_request()
    stream = api.chat.completions.create(
        model="any",
        messages=body["messages"],
        stream=True,
        extra_body={
            k: body[k] for k in ("tools", "tool_choice", "max_tool_rounds", "temperature", "max_tokens")
        },  # fmt: skip
    )
    roles, calls, results, answer, finish = [], {}, [], "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        roles += [delta.role] if delta.role else []
        for step in delta.tool_calls or ():
            name, arguments, call_id = calls.get(step.index, ("", "", step.id))
            calls[step.index] = (
                name + (step.function.name or ""),
                arguments + step.function.arguments,
                call_id,
            )
        if delta.role == "tool":
            results.append((delta.model_extra["tool_call_id"], delta.content, delta.model_extra["is_error"]))
        elif delta.content:
            answer += delta.content
        finish = chunk.choices[0].finish_reason or finish
    assert roles == ["assistant", "tool", "assistant"]
    [(name, arguments, call_id)] = calls.values()
    [(result_id, result, is_error)] = results
    assert name == "time_get_current_time" and result_id == call_id and is_error is False
    check_real_time(result, json.loads(arguments))
    assert answer.strip() and finish == "stop"


def test_a_client_function_tool_goes_back_to_the_client(client: httpx.Client) -> None:
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 40}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    body = time_request(
        messages=[{"role": "user", "content": "What is the weather like in Paris?"}],
        tools=[TIME, weather],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = chat(client, body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["intermediate_messages"] == []
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]


def test_the_loop_stops_after_max_tool_rounds(client: httpx.Client) -> None:
    body = time_request(tool_choice="required", max_tool_rounds=2, verbose=True, max_tokens=600)
    reply = chat(client, body)
    rounds = reply["__verbose"]["rounds"]
    assert 2 <= len(rounds) <= 3 and not rounds[-1]["tool_calls"]
    executed = [m for m in reply["choices"][0]["intermediate_messages"] if m["role"] == "tool"]
    assert len(executed) == len(rounds) - 1 <= 2
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")


def test_max_tokens_bounds_the_whole_run(client: httpx.Client) -> None:
    reply = chat(client, time_request(max_tokens=80, verbose=True))
    assert reply["usage"]["completion_tokens"] <= 80
    assert len(reply["__verbose"]["rounds"]) == 2, "the call took part of the budget, the answer the rest"
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")


# -- faults ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("server", "tool", "extra", "error"),
    [
        ("crash", "die", {}, "exited with code 3"),  # the server crashes mid-call
        ("slow", "hang", {"tool_timeout": 1}, "timed out after 1000 ms"),
        ("garbage", "junk", {}, "malformed tools/call result"),
    ],
)
def test_a_failing_tool_is_an_error_result_the_model_reads(
    client: httpx.Client, server: str, tool: str, extra: dict[str, Any], error: str
) -> None:
    reply = chat(client, forced(tool, server, verbose=True, max_tokens=120, **extra))
    choice = reply["choices"][0]
    [result] = [m for m in choice["intermediate_messages"] if m["role"] == "tool"]
    assert (
        result["is_error"] is True and result["content"].startswith("Error: ") and error in result["content"]
    )
    assert json.dumps(result["content"])[1:-1] in reply["__verbose"]["rounds"][1]["prompt"]
    assert choice["finish_reason"] in ("stop", "length")


def test_eight_concurrent_runs_all_finish(client: httpx.Client) -> None:
    def run(i: int) -> dict[str, Any]:
        with httpx.Client(base_url=str(client.base_url), timeout=600) as own:
            return chat(own, time_request(max_tokens=300, seed=i, temperature=0.7))

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(run, range(8)))
    called = 0
    for reply in replies:
        choice = reply["choices"][0]
        assert choice["finish_reason"] in ("stop", "length")
        results = [m for m in choice["intermediate_messages"] if m["role"] == "tool"]
        assert all(m["name"] == "time_get_current_time" for m in results)
        # A sampled forced call can still be cut by max_tokens (its arguments run on): no call then.
        assert results or choice["finish_reason"] == "length", choice
        called += bool(results)
    assert called >= 6, f"only {called} of 8 runs called the tool"
    # The engine publishes /slots after the step that ends a run; a reply can reach the client first.
    wait_until(lambda: busy_slots(client) == 0, LIVENESS_S, "every slot released after the runs")


# -- stop and resume ---------------------------------------------------------------------------------
def hanging_call(srv: ServerProcess, headers: dict[str, str]) -> RawChatStream:
    """A streamed run whose MCP call is in flight (it never answers) when this returns."""
    with httpx.Client(base_url=srv.base_url) as c:
        before = len(hanging_calls(c))
        raw = RawChatStream(srv.port, {**forced("hang", "slow"), "stream": True}, headers)
        raw.read_until(lambda body: b'"tool_calls"' in body)
        wait_until(lambda: busy_slots(c) == 0, 60, "the calling round ended")
        wait_until(lambda: len(hanging_calls(c)) > before, LIVENESS_S, "the call received by the MCP server")
    return raw


def runs_ended(srv: ServerProcess) -> list[str]:
    """The server's `agents.run_ended` log lines: after its line, no round of that run starts."""
    return [
        line for line in srv.log_path.read_text(errors="replace").splitlines() if "agents.run_ended" in line
    ]


def wait_for_run_end(srv: ServerProcess, before: int) -> str:
    wait_until(lambda: len(runs_ended(srv)) > before, LIVENESS_S, "the run's end")
    return runs_ended(srv)[-1]


def test_delete_during_a_tool_call_cancels_it_and_ends_the_run(
    srv: ServerProcess, client: httpx.Client
) -> None:
    conv = "agent stop: during a call"
    before, ended = len(cancelled_calls(client)), len(runs_ended(srv))
    raw = hanging_call(srv, {"X-Conversation-Id": conv})
    assert client.delete("/v1/stream", params={"conv_id": conv}).status_code == 204
    wait_until(lambda: len(cancelled_calls(client)) > before, LIVENESS_S, "the MCP call cancelled")
    assert lookup(client, conv) == [] and busy_slots(client) == 0
    raw.drop()
    assert "rounds=1 " in wait_for_run_end(srv, ended), "no next round started"
    assert busy_slots(client) == 0


def test_a_client_gone_during_a_tool_call_cancels_it(srv: ServerProcess, client: httpx.Client) -> None:
    before, ended = len(cancelled_calls(client)), len(runs_ended(srv))
    raw = hanging_call(srv, {})
    raw.drop()
    wait_until(lambda: len(cancelled_calls(client)) > before, LIVENESS_S, "the MCP call cancelled")
    assert "rounds=1 " in wait_for_run_end(srv, ended), "no next round started"
    assert busy_slots(client) == 0


def test_a_resume_mid_call_replays_the_same_bytes(srv: ServerProcess, client: httpx.Client) -> None:
    conv = "agent resume/mid call"
    body = time_request(stream=True, stream_options={"include_usage": True})
    raw = RawChatStream(srv.port, body, {"X-Conversation-Id": conv})
    seen = raw.read_until(lambda b: b'"tool_calls"' in b)
    raw.drop()  # a socket reset while the model calls (or the tool runs)
    assert b'"role":"tool"' not in seen
    wait_until(lambda: all(i["is_done"] for i in lookup(client, conv)), 300, "the run finished")
    full = replay(client, conv, 0).content
    assert full[: len(seen)] == seen and replay(client, conv, len(seen)).content == full[len(seen) :]
    payloads = [json.loads(p) for p in sse_payloads(full)[:-1]]
    deltas = [p["choices"][0]["delta"] for p in payloads if p["choices"]]
    [result] = [d for d in deltas if d.get("role") == "tool"]
    assert result["name"] == "time_get_current_time" and not result["is_error"]
    assert payloads[-1]["usage"]["completion_tokens"] > 0
    assert sse_payloads(full)[-1] == "[DONE]"


# -- what the server shows, and bad input ------------------------------------------------------------
def test_props_and_tools_show_the_servers(client: httpx.Client) -> None:
    loop = client.get("/props").json()["tool_loop"]
    assert loop["ready"] and loop["max_rounds"] == MAX_ROUNDS and loop["tool_timeout"] == 30
    servers = {s["server_label"]: s for s in loop["mcp_servers"]}
    assert set(servers) == {"time", "slow", "crash", "garbage"}
    assert servers["time"]["available"] and "get_current_time" in servers["time"]["tools"]
    tools = client.get("/tools").json()
    assert {t["server"] for t in tools} == set(servers)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tools": [{"type": "mcp", "server_label": "nope"}]}, "no MCP server 'nope'"),
        ({"tools": [{**TIME, "server_url": "https://example.com/mcp"}]}, "'server_url'"),
        ({"tools": [{**TIME, "allowed_tools": ["no_such_tool"]}]}, "no tool 'no_such_tool'"),
        ({"tools": [{**TIME, "require_approval": "always"}]}, "require_approval"),
        ({"tools": [{**TIME, "headers": {"Authorization": "x"}}]}, "headers"),
        ({"max_tool_rounds": MAX_ROUNDS + 1}, f"at most {MAX_ROUNDS}"),
        ({"max_tool_rounds": 0}, "max_tool_rounds"),
        ({"tool_timeout": 31}, "--tool-timeout"),
        ({"tool_timeout": -1}, "tool_timeout"),
        ({"tool_choice": {"type": "function", "function": {"name": "time_nope"}}}, "time_nope"),
        ({"tools": [TIME, {"type": "function", "function": {"name": "time_get_current_time"}}]}, "MCP tool"),
        ({"tools": None, "tool_choice": None}, "mcp tools only"),
    ],
)
def test_bad_agent_requests_are_400_naming_the_field(
    client: httpx.Client, change: dict[str, Any], message: str
) -> None:
    reply = client.post("/v1/chat/completions", json={**time_request(), **change})
    assert reply.status_code == 400, reply.text
    assert (
        reply.json()["error"]["type"] == "invalid_request_error"
        and message in reply.json()["error"]["message"]
    )


def test_mcp_tools_without_mcp_servers_are_a_400(server: ServerProcess) -> None:
    reply = httpx.post(server.base_url + "/v1/chat/completions", json=time_request())
    assert reply.status_code == 400 and "--mcp-servers-config" in reply.json()["error"]["message"]


# -- limits, without a server ------------------------------------------------------------------------
def test_the_tool_loop_flags_and_their_bad_values() -> None:
    from server.config.parse import parse_settings

    settings, _ = parse_settings([])
    assert (settings.tool_max_rounds, settings.tool_timeout, settings.tool_max_tokens) == (8, 30.0, -1)
    settings, _ = parse_settings(
        ["--tool-max-rounds", "2", "--tool-timeout", "1.5", "--tool-max-tokens", "99"]
    )
    assert (settings.tool_max_rounds, settings.tool_timeout, settings.tool_max_tokens) == (2, 1.5, 99)
    for bad in (
        ["--tool-max-rounds", "0"],
        ["--tool-timeout", "0"],
        ["--tool-timeout", "nan"],
        ["--tool-max-tokens", "-2"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            parse_settings(bad)
        assert exit_info.value.code == 2


def test_a_runs_token_budget_stays_under_the_servers_cap() -> None:
    from server.agents.loop import AgentLimits, agent_limits
    from server.chat.schemas import ChatCompletionRequest
    from server.config.settings import Settings
    from server.http.errors import APIError

    def limits(settings: Settings, **body: Any) -> Any:
        asked = {"max_tokens": None, **body}
        return agent_limits(settings, ChatCompletionRequest.model_validate(time_request(**asked)))

    capped = Settings(tool_max_tokens=100, tool_max_rounds=3, tool_timeout=5)
    assert limits(capped, max_tokens=50).max_tokens == 50
    assert limits(capped, max_tokens=None).max_tokens == 100  # no ask: the cap
    assert limits(Settings(), max_tokens=None).max_tokens == -1  # no ask, no cap: unlimited
    assert limits(capped, max_tool_rounds=2, tool_timeout=0.5) == AgentLimits(2, 0.5, 100)
    for ask, field in (
        ({"max_tokens": 101}, "max_tokens"),
        ({"max_tool_rounds": 4}, "max_tool_rounds"),
        ({"tool_timeout": 6}, "tool_timeout"),
    ):
        with pytest.raises(APIError) as error:
            limits(capped, **ask)
        assert error.value.status == 400 and f"'{field}'" in error.value.message
