"""/tools end to end: a real llamba-server process, real MCP fixture servers and mcp-server-time."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.app import create_app
from server.config.settings import Settings
from server.mcp import McpServerConfig
from tests.conftest import require
from tests.server_process import LIVENESS_S, ServerProcess, wait_until

FIXTURES = Path(__file__).resolve().parent / "mcp_servers"
VENV_BIN = str(Path(sys.executable).parent)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def fixture(script: str, *args: str, **extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(FIXTURES / f"{script}.py"), *args], **extra}


def write_config(path: Path, servers: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def children_of(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with open(task / "children") as f:
            kids += [int(k) for k in f.read().split()]
    return kids


def process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def wait_for_tools(server: ServerProcess, timeout: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{server.log()}")
        try:
            reply = httpx.get(server.base_url + "/tools", timeout=30)
            if reply.status_code == 200:
                return reply.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(server.log())


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    assert shutil.which("mcp-server-time", path=VENV_BIN), "pip install mcp-server-time (the test extra)"
    config = write_config(
        tmp_path_factory.mktemp("mcp") / "mcp.json",
        {
            "echo": fixture("echo"),
            "x": fixture("echo", "--rename", "add=y_add"),
            "x_y": fixture("echo"),  # x_y_add collides with x's y_add
            "slow": fixture("slow", timeout_ms=1000),
            "crash": fixture("crash", restart_cooldown_ms=2000),
            "framing": fixture("framing"),
            "garbage": fixture("garbage"),
            "grandchild": fixture("grandchild"),
            "empty": fixture("empty"),
            "time": {"command": "mcp-server-time", "env": {"PATH": f"{VENV_BIN}:{os.environ['PATH']}"}},
            "broken": {"command": "no-such-mcp-server-binary"},
            "dies": fixture("crash", "--die-at-start"),
        },
    )
    proc = ServerProcess("-m", "smollm2", "-c", "512", "--mcp-servers-config", str(config))
    wait_for_tools(proc)
    yield proc
    proc.stop()


def post_tool(server: ServerProcess, tool: str, params: Any = None, **kwargs: Any) -> httpx.Response:
    body = {"tool": tool} if params is None else {"tool": tool, "params": params}
    return httpx.post(server.base_url + "/tools", json=body, timeout=30, **kwargs)


# -- listing and invoking --------------------------------------------------------------------------
def test_get_tools_lists_working_servers_and_skips_broken_ones(mcp_server: ServerProcess) -> None:
    tools = wait_for_tools(mcp_server)
    names = [t["tool"] for t in tools]
    assert len(names) == len(set(names))
    for expected in (
        "echo_echo",
        "echo_add",
        "x_y_add",
        "slow_sleep",
        "crash_crash",
        "time_get_current_time",
    ):
        assert expected in names
    assert not [n for n in names if n.startswith(("broken_", "dies_", "empty_"))]
    time_tool = next(t for t in tools if t["tool"] == "time_get_current_time")
    assert time_tool["type"] == "mcp" and time_tool["display_name"]
    assert time_tool["permissions"] == {"write": False}  # it declares readOnlyHint
    function = time_tool["definition"]["function"]
    assert time_tool["definition"]["type"] == "function" and function["name"] == "time_get_current_time"
    assert "timezone" in function["parameters"]["properties"] and function["description"]


def test_post_tools_answers_like_llama_server(mcp_server: ServerProcess) -> None:
    assert post_tool(mcp_server, "echo_echo", {"text": "hi"}).json() == {"plain_text_response": "hi"}
    assert post_tool(mcp_server, "echo_add", {"a": 2, "b": 3}).json() == {"plain_text_response": "5"}
    failed = post_tool(mcp_server, "echo_fail", {})
    assert failed.status_code == 200 and failed.json() == {"error": "it went wrong"}
    missing_param = post_tool(mcp_server, "echo_add", {"a": 1})  # the tool raises KeyError -> no reply
    assert missing_param.status_code == 200 and "error" in missing_param.json()
    unknown = post_tool(mcp_server, "nope_nothing", {})
    assert unknown.status_code == 404 and "nope_nothing" in unknown.json()["error"]["message"]
    no_tool = httpx.post(mcp_server.base_url + "/tools", json={"params": {}})
    assert no_tool.status_code == 400 and no_tool.json()["error"]["type"] == "invalid_request_error"
    not_json = httpx.post(mcp_server.base_url + "/tools", content=b"{nope")
    assert not_json.status_code == 400
    bad_params = post_tool(mcp_server, "echo_echo", ["not", "an", "object"])
    assert bad_params.status_code == 400


def test_mcp_server_time_is_a_real_peer(mcp_server: ServerProcess) -> None:
    reply = post_tool(mcp_server, "time_get_current_time", {"timezone": "Etc/UTC"})
    assert reply.status_code == 200
    result = json.loads(reply.json()["plain_text_response"])
    assert result["timezone"] == "Etc/UTC" and result["datetime"].endswith("+00:00")
    bad = post_tool(mcp_server, "time_get_current_time", {"timezone": "Not/AZone"}).json()
    assert "error" in bad and "Not/AZone" in bad["error"]


def test_framing_and_garbage_servers_work_over_http(mcp_server: ServerProcess) -> None:
    got = post_tool(mcp_server, "framing_notify_then_reply", {"text": "one write"}).json()
    assert got == {"plain_text_response": "one write"}
    got = post_tool(mcp_server, "framing_split_reply", {"text": "in pieces"}).json()
    assert got == {"plain_text_response": "in pieces"}
    assert post_tool(mcp_server, "garbage_add", {"a": 20, "b": 22}).json() == {"plain_text_response": "42"}


def test_ten_concurrent_calls_are_matched(mcp_server: ServerProcess) -> None:
    delays = [0.5, 0.05, 0.3, 0.0, 0.45, 0.1, 0.25, 0.15, 0.4, 0.2]
    with ThreadPoolExecutor(10) as pool:
        replies = list(
            pool.map(
                lambda i: post_tool(mcp_server, "echo_echo", {"text": f"n{i}", "delay": delays[i]}), range(10)
            )
        )
    assert [r.json() for r in replies] == [{"plain_text_response": f"n{i}"} for i in range(10)]


# -- faults ----------------------------------------------------------------------------------------
def test_timeout_answers_and_the_next_call_succeeds(mcp_server: ServerProcess) -> None:
    pid = post_tool(mcp_server, "slow_pid", {}).json()["plain_text_response"]
    begin = time.monotonic()
    slow = post_tool(mcp_server, "slow_sleep", {"seconds": 2 * LIVENESS_S}).json()
    # The call waited for its 1000 ms timeout, and answered when it fired (within the liveness bound),
    # not when the tool was done (twice the bound).
    assert 0.9 < time.monotonic() - begin < LIVENESS_S
    assert "timed out after 1000 ms" in slow["error"]
    assert post_tool(mcp_server, "slow_echo", {"text": "next"}).json() == {"plain_text_response": "next"}
    assert post_tool(mcp_server, "slow_pid", {}).json()["plain_text_response"] == pid  # not torn down


def wait_respawned(server: ServerProcess, within: float = LIVENESS_S) -> tuple[str, float]:
    """Call crash_pid until the server is back; (its pid, when it came back)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        reply = post_tool(server, "crash_pid", {}).json()
        if "plain_text_response" in reply:
            return reply["plain_text_response"], time.monotonic()
        assert "may be restarted in" in reply["error"]
        time.sleep(0.1)
    raise TimeoutError(server.log())


def test_crash_restarts_at_once_then_backs_off_and_no_defunct_children(mcp_server: ServerProcess) -> None:
    """As llama-server: the call after a crash runs in a restarted server; a server that crashes again
    at once waits its cooldown (2 s since that restart), then twice as long after the next crash."""
    pids = [post_tool(mcp_server, "crash_pid", {}).json()["plain_text_response"]]
    assert post_tool(mcp_server, "crash_crash", {}).json() == {"plain_text_response": "goodbye"}
    time.sleep(0.3)
    reply = post_tool(mcp_server, "crash_pid", {}).json()
    assert "plain_text_response" in reply, reply  # restarted at once, no cooldown
    pids.append(reply["plain_text_response"])
    back = time.monotonic()
    # It crashes again at once: the next restart waits for the cooldown (2 s since that restart).
    assert post_tool(mcp_server, "crash_crash", {}).json() == {"plain_text_response": "goodbye"}
    time.sleep(0.3)
    refused = post_tool(mcp_server, "crash_pid", {}).json()
    assert "may be restarted in" in refused["error"]
    pid, again = wait_respawned(mcp_server)
    pids.append(pid)
    assert again - back >= 1.0, "respawned before the cooldown was over"
    assert post_tool(mcp_server, "crash_crash", {}).json() == {"plain_text_response": "goodbye"}
    time.sleep(0.3)
    refused = post_tool(mcp_server, "crash_pid", {}).json()["error"]
    assert float(refused.rsplit(" in ", 1)[1].split()[0]) > 2.0, refused  # the back-off doubled (4 s)
    pids.append(wait_respawned(mcp_server)[0])
    assert len(set(pids)) == len(pids), "every respawn is a new process"
    zombies = lambda: [k for k in children_of(mcp_server.proc.pid) if process_state(k) == "Z"]  # noqa: E731
    wait_until(lambda: not zombies(), LIVENESS_S, "every crashed child reaped")
    assert all(process_state(int(p)) is None for p in pids[:-1])


# -- chat ------------------------------------------------------------------------------------------
def test_chat_accepts_tools_from_get_tools(mcp_server: ServerProcess) -> None:
    mcp_server.wait_healthy()
    tools = [t["definition"] for t in wait_for_tools(mcp_server)][:4]
    messages = [{"role": "user", "content": "What time is it in Paris?"}]
    body = {"messages": messages, "tools": tools, "max_tokens": 4, "temperature": 0}
    reply = httpx.post(mcp_server.base_url + "/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["role"] == "assistant"
    rendered = httpx.post(
        mcp_server.base_url + "/apply-template", json={"messages": messages, "tools": tools}
    )
    assert rendered.status_code == 200


# -- CORS ------------------------------------------------------------------------------------------
def test_cors_is_localhost_only_when_mcp_is_enabled(mcp_server: ServerProcess) -> None:
    evil = post_tool(mcp_server, "echo_echo", {"text": "x"}, headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and "access-control-allow-origin" not in evil.headers
    local = post_tool(mcp_server, "echo_echo", {"text": "x"}, headers={"Origin": "http://localhost:5173"})
    assert (
        local.status_code == 200 and local.headers["access-control-allow-origin"] == "http://localhost:5173"
    )
    preflight = httpx.options(
        mcp_server.base_url + "/tools",
        headers={"Origin": "http://127.0.0.1:3000", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    own = post_tool(mcp_server, "echo_echo", {"text": "x"}, headers={"Origin": mcp_server.base_url})
    assert own.status_code == 200  # the web UI served by this server is same-origin


ECHO = McpServerConfig(name="echo", command=sys.executable, args=(str(FIXTURES / "echo.py"),))


@pytest.mark.parametrize(
    ("mcp_servers", "cors_origins", "origin", "allowed"),
    [
        ((), None, "http://evil.example", True),  # no MCP: llama-server's default, any origin
        ((ECHO,), None, "http://evil.example", False),
        ((ECHO,), None, "http://[::1]:8080", True),
        ((ECHO,), ("http://evil.example",), "http://evil.example", True),  # explicit --cors-origins wins
        ((ECHO,), ("http://evil.example",), "http://localhost:3000", False),
        ((ECHO,), ("*",), "http://anything.example", True),
    ],
)
@pytest.mark.anyio
async def test_cors_policy(
    mcp_servers: tuple, cors_origins: tuple | None, origin: str, allowed: bool
) -> None:
    # Quart's in-process client, on purpose: the policy is fixed from the settings when the app is made,
    # before any route or model; six real servers would load the model six times for a header check.
    # test_cors_is_localhost_only_when_mcp_is_enabled checks the same policy over HTTP on a real server.
    app = create_app(Settings(mcp_servers=mcp_servers, cors_origins=cors_origins))
    reply = await app.test_client().get("/health", headers={"Origin": origin})  # lifespan not started
    assert (reply.status_code != 403) is allowed
    assert (reply.headers.get("Access-Control-Allow-Origin") == origin) is allowed


def test_tools_is_absent_without_mcp_servers(server: ServerProcess) -> None:
    """The session's shared server runs without --mcp-servers-*: /tools is not there."""
    assert httpx.get(server.base_url + "/tools").status_code == 404
    assert httpx.post(server.base_url + "/tools", json={"tool": "x"}).status_code == 404


@pytest.mark.anyio
async def test_tools_works_without_a_model(tmp_path: Path) -> None:
    # Quart's in-process app, on purpose: a real server exits when its model file is missing, so only
    # here can the app serve with no model (as it does while a model loads) for as long as a test needs.
    app = create_app(Settings(model=str(tmp_path / "missing.gguf"), mcp_servers=(ECHO,)))
    async with app.test_app() as test_app:
        client = test_app.test_client()
        tools = await (await client.get("/tools")).get_json()
        assert "echo_echo" in [t["tool"] for t in tools]
        reply = await client.post("/tools", json={"tool": "echo_echo", "params": {"text": "no model"}})
        assert await reply.get_json() == {"plain_text_response": "no model"}
        assert (await client.get("/health")).status_code in (500, 503)


# -- start-up and shutdown -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mcp-servers-json", "{nope"], "invalid JSON"),
        (
            ["--mcp-servers-json", '{"mcpServers": {"a": {"command": "x", "args": "-v"}}}'],
            "mcpServers.a.args",
        ),
        (["--mcp-servers-json", '{"servers": {}}'], "mcpServers"),
        (["--mcp-servers-config", "/no/such/mcp.json"], "cannot read --mcp-servers-config"),
    ],
)
def test_bad_config_exits_non_zero_before_healthy(args: list[str], message: str) -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "512", *args)
    try:
        code = proc.proc.wait(timeout=60)
    finally:
        proc.stop()
    log = proc.log()
    assert code != 0 and message in log, log
    assert "server.listening" not in log and "Running on" not in log


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_sigterm_is_fast_during_a_slow_call_and_with_a_grandchild(tmp_path: Path, loop: str) -> None:
    """On either event loop (LLAMBA_EVENT_LOOP; uvloop is the default when installed): the MCP children's
    pipes, the signals and the reaping all go through it."""
    if loop == "uvloop":
        require(None if importlib.util.find_spec("uvloop") else "uvloop is missing (the test extra)")
    config = write_config(
        tmp_path / "mcp.json", {"slow": fixture("slow"), "grandchild": fixture("grandchild")}
    )
    args = ("-m", "smollm2", "-c", "512", "--mcp-servers-config", str(config))
    server = ServerProcess(*args, env={"LLAMBA_EVENT_LOOP": loop}).wait_healthy()
    assert f"loop={loop}" in server.log_path.read_text(), server.log()  # the loop it runs on
    try:
        wait_for_tools(server)
        grandchild = int(post_tool(server, "grandchild_grandchild_pid", {}).json()["plain_text_response"])
        family = [*children_of(server.proc.pid), grandchild]
        outcome: dict[str, Any] = {}

        def slow_call() -> None:
            try:
                outcome["reply"] = post_tool(server, "slow_sleep", {"seconds": 60}).json()
            except httpx.HTTPError as exc:
                outcome["reply"] = exc

        caller = threading.Thread(target=slow_call)
        caller.start()
        time.sleep(0.5)
    finally:
        # Liveness bound: the server stops its MCP children, drains and exits by itself (code 0), not
        # after the 60 s call, well before stop()'s SIGKILL fallback.
        server.stop(timeout=LIVENESS_S)
    caller.join(LIVENESS_S)
    assert server.exited_cleanly(), f"SIGTERM: no clean exit within {LIVENESS_S} s\n{server.log()}"
    reply = outcome["reply"]
    assert not isinstance(reply, dict) or "shutting down" in reply["error"], reply
    # (the grandchild sleeps 30 s: longer than the bound)
    outlived = lambda: [p for p in family if process_state(p) not in (None, "Z")]  # noqa: E731
    wait_until(lambda: not outlived(), LIVENESS_S, "MCP processes gone with the server")
