"""MCP transport, registry, config and manager against real fixture server processes (no mocks)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from server.mcp import McpManager, McpServerConfig
from server.mcp.config import McpConfigError, load_mcp_servers, parse_mcp_servers
from server.mcp.jsonrpc import LineFramer, RpcError, RpcTimeout, TransportClosed
from server.mcp.manager import RESTART_WINDOW_S
from server.mcp.registry import ToolRegistry, result_text
from server.mcp.transport import SpawnError, StdioTransport
from tests.conftest import not_applicable, require
from tests.server_process import LIVENESS_S

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).resolve().parent / "mcp_servers"


@pytest.fixture(params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    """Each async test on asyncio's own loop (a model server's) and on uvloop's (a router's when it is
    installed, everyone's with LLAMBA_EVENT_LOOP=uvloop; server/http/serving.py): the children's pipes,
    signals and reaping go through the loop."""
    if request.param == "uvloop":
        require(None if importlib.util.find_spec("uvloop") else "uvloop is missing (the test extra)")
    return "asyncio", {"use_uvloop": request.param == "uvloop"}


def fixture(name: str, *args: str, **extra: Any) -> McpServerConfig:
    server = extra.pop("server", name)
    return McpServerConfig(
        name=server, command=sys.executable, args=(str(FIXTURES / f"{name}.py"), *args), **extra
    )


async def started(config: McpServerConfig, **kwargs: Any) -> StdioTransport:
    transport = await StdioTransport.spawn(config, **kwargs)
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}}
    await transport.request("initialize", hello, timeout_s=2 * LIVENESS_S)
    await transport.notify("notifications/initialized")
    return transport


async def call(transport: StdioTransport, tool: str, timeout_s: float = 10, **arguments: Any) -> Any:
    return await transport.request("tools/call", {"name": tool, "arguments": arguments}, timeout_s=timeout_s)


def text_of(result: Any) -> str:
    text, error = result_text(result)
    assert error is None, error
    return text or ""


def process_state(pid: int) -> str | None:
    """The /proc state letter of a process (Z for a zombie), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


async def gone(pid: int, within_s: float = LIVENESS_S) -> bool:
    """Whether the process is gone (reaped, not a zombie) within `within_s`: a liveness bound, generous
    for a killed or exiting child, not a speed check."""
    deadline = time.monotonic() + within_s
    while process_state(pid) is not None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)  # and let the loop hear about it
    return True


# -- framing ---------------------------------------------------------------------------------------
def test_framer_splits_joins_and_resyncs_after_an_oversized_line() -> None:
    framer = LineFramer(max_line=32)
    assert framer.feed(b'{"a":1}\n{"b":2}\r\n\n  \n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert framer.feed(b":3") == []
    assert framer.feed(b"}\n") == [b'{"c":3}']
    assert framer.feed(b"x" * 40) == [] and framer.dropped == 1
    assert framer.feed(b"still the long line\n{}\n") == [b"{}"]


# -- config ----------------------------------------------------------------------------------------
def test_config_reads_cursor_style_servers(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {"a": {"command": "x", "args": ["-v"], "env": {"K": "V"}, "cwd": "/tmp",'
                    ' "timeout_ms": 1500, "type": "stdio"}}}')  # fmt: skip
    (a, b) = load_mcp_servers(path, '{"mcpServers": {"b": {"command": "y"}}}')
    assert (a.name, a.command, a.args, a.env, a.cwd, a.timeout_s) == (
        "a",
        "x",
        ("-v",),
        {"K": "V"},
        "/tmp",
        1.5,
    )
    assert (b.name, b.timeout_ms, b.args, b.env, b.cwd) == ("b", 30_000, (), {}, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[]", "mcpServers"),
        ('{"servers": {}}', "mcpServers"),
        ('{"mcpServers": {"a": "python"}}', "mcpServers.a must be an object"),
        ('{"mcpServers": {"a": {"args": []}}}', "mcpServers.a: give a 'command'"),
        ('{"mcpServers": {"a": {"command": ""}}}', "mcpServers.a.command"),
        ('{"mcpServers": {"a": {"command": "x", "args": "-v"}}}', "mcpServers.a.args"),
        ('{"mcpServers": {"a": {"command": "x", "args": [1]}}}', "mcpServers.a.args"),
        ('{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}', "mcpServers.a.env"),
        ('{"mcpServers": {"a": {"command": "x", "timeout_ms": 0}}}', "mcpServers.a.timeout_ms"),
        ('{"mcpServers": {"a": {"url": "ftp://h/mcp"}}}', "mcpServers.a: 'url' must be an http"),
        ('{"mcpServers": {"a": {"url": "http://h/mcp", "type": "grpc"}}}', "mcpServers.a.type: 'grpc'"),
        ('{"mcpServers": {"a": {"url": "http://h/mcp", "command": "x"}}}', "are for stdio servers"),
        ('{"mcpServers": {"a": {"command": "x", "headers": {"A": "b"}}}}', "are for remote servers"),
        ('{"mcpServers": {"a": {"type": "sse"}}}', "mcpServers.a: a sse server needs a 'url'"),
        ('{"mcpServers": {"a": {"url": "http://h/mcp", "headers": {"A": 1}}}}', "mcpServers.a.headers.A"),
        (
            '{"mcpServers": {"a": {"url": "http://h/mcp", "headers": {"A": "${NO_SUCH_VAR_42}"}}}}',
            "mcpServers.a.headers.A: the environment variable NO_SUCH_VAR_42 is not set",
        ),
        ('{"mcpServers": {"a": {"url": "http://h/", "connect_timeout_ms": 0}}}', "a.connect_timeout_ms"),
    ],
)
def test_config_defects_are_named(text: str, message: str) -> None:
    with pytest.raises(McpConfigError, match=message):
        parse_mcp_servers(text)


def test_config_reads_remote_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMBA_TEST_TOKEN", "s3cret")
    text = json.dumps({"mcpServers": {
        "web": {"url": "https://mcp.example.com/mcp", "timeout_ms": 2000, "connect_timeout_ms": 500,
                "headers": {"Authorization": "Bearer ${LLAMBA_TEST_TOKEN}"}},
        "old": {"url": "http://127.0.0.1:9/sse"},
        "typed": {"url": "http://127.0.0.1:9/events", "type": "sse"},
        "http": {"url": "http://127.0.0.1:9/sse", "type": "http"},
    }})  # fmt: skip
    web, old, typed, http = parse_mcp_servers(text)
    assert (web.transport, web.url, web.timeout_s, web.connect_timeout_s) == (
        "streamable-http",
        "https://mcp.example.com/mcp",
        2.0,
        0.5,
    )
    assert web.headers == {"Authorization": "Bearer s3cret"} and "s3cret" not in repr(web)
    assert (web.remote, web.restart_cooldown_s) == (True, 0.0)  # a remote server is reconnected at once
    assert [s.transport for s in (old, typed, http)] == ["sse", "sse", "streamable-http"]
    (stdio,) = parse_mcp_servers('{"mcpServers": {"p": {"command": "x"}}}')
    assert (stdio.remote, stdio.restart_cooldown_s) == (False, 5.0)


def test_config_missing_file_and_duplicate_names(tmp_path: Path) -> None:
    with pytest.raises(McpConfigError, match="cannot read"):
        load_mcp_servers(tmp_path / "nope.json", None)
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {"a": {"command": "x"}}}')
    with pytest.raises(McpConfigError, match="'a' is defined twice"):
        load_mcp_servers(path, '{"mcpServers": {"a": {"command": "y"}}}')


# -- registry --------------------------------------------------------------------------------------
def test_registry_names_tools_and_never_overwrites_on_collision() -> None:
    registry = ToolRegistry()
    first = {"name": "y_add", "description": "from x", "annotations": {"readOnlyHint": True, "title": "Add"}}
    assert registry.add_server("x", [first, {"name": "has space"}, {"description": "no name"}]) == 1
    assert registry.add_server("x_y", [{"name": "add", "description": "from x_y"}, {"name": "sub"}]) == 1
    assert [t.name for t in registry.all()] == ["x_y_add", "x_y_sub"]
    assert registry.get("x_y_add").server == "x"  # type: ignore[union-attr]
    entry = registry.get("x_y_add").to_json()  # type: ignore[union-attr]
    assert entry == {
        "tool": "x_y_add",
        "server": "x",
        "display_name": "Add",
        "type": "mcp",
        "permissions": {"write": False},
        "uses_cwd": False,  # x-tool-cwd is the built-in tools' (llama-server's listing)
        "definition": {
            "type": "function",
            "function": {
                "name": "x_y_add",
                "description": "from x",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    }
    assert registry.get("x_y_sub").to_json()["permissions"] == {"write": True}  # type: ignore[union-attr]


def test_result_text_joins_text_content_and_reports_tool_errors() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "image", "data": "..."}, {"type": "text", "text": "b"}]
    assert result_text({"content": content}) == ("a\n[image content not shown]\nb", None)
    assert result_text({"content": [{"type": "text", "text": "bad"}], "isError": True}) == (None, "bad")
    assert result_text({"content": [], "structuredContent": {"x": 1}}) == ('{"x": 1}', None)
    assert result_text("nonsense")[1] is not None


# -- transport -------------------------------------------------------------------------------------
async def test_each_run_is_on_the_loop_it_names(anyio_backend: tuple[str, dict[str, bool]]) -> None:
    uvloop_asked = anyio_backend[1]["use_uvloop"]
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop") is uvloop_asked


async def test_notification_and_reply_in_one_write_split_replies_and_id_zero() -> None:
    transport = await started(fixture("framing"))  # its initialize reply (id 0) shares a write with a note
    try:
        assert text_of(await call(transport, "notify_then_reply", text="one write")) == "one write"
        assert text_of(await call(transport, "split_reply", text="x" * 300)) == "x" * 300
        assert text_of(await call(transport, "ping_first", text="after ping")) == "after ping"
        methods = [m["method"] for m in transport.unsolicited]
        assert methods == ["notifications/message", "notifications/message"]
    finally:
        await transport.close()


async def test_garbage_lines_are_skipped_and_the_notification_queue_is_bounded() -> None:
    transport = await started(fixture("garbage"), max_unsolicited=50)
    try:
        # Junk, a stale id, the id "0" and `true` all come before each real reply: none may be taken for it.
        assert text_of(await call(transport, "add", a=2, b=3)) == "5"
        assert text_of(await call(transport, "echo", text="still fine")) == "still fine"
        assert len(transport.unsolicited) == 50 and transport.unsolicited_dropped > 5000
        assert any("about to answer" in line for line in transport.stderr_tail)
    finally:
        await transport.close()


async def test_ten_concurrent_calls_are_matched_to_their_replies() -> None:
    transport = await started(fixture("echo"))
    try:
        delays = [0.45, 0.05, 0.3, 0.0, 0.4, 0.1, 0.25, 0.15, 0.35, 0.2]  # replies come back out of order
        calls = [call(transport, "echo", text=f"call-{i}", delay=d) for i, d in enumerate(delays)]
        results = await asyncio.gather(*calls)
        assert [text_of(r) for r in results] == [f"call-{i}" for i in range(10)]
    finally:
        await transport.close()


async def test_timeout_answers_the_caller_and_keeps_the_server() -> None:
    transport = await started(fixture("slow"))
    try:
        pid = transport.pid
        with pytest.raises(RpcTimeout):
            await call(transport, "sleep", timeout_s=0.3, seconds=0.8)
        assert transport.alive and text_of(await call(transport, "echo", text="next")) == "next"
        await asyncio.sleep(0.8)  # the late reply to the timed-out call arrives now and is dropped
        assert text_of(await call(transport, "pid")) == str(pid) and transport.alive
    finally:
        await transport.close()


async def test_a_tool_level_jsonrpc_error_is_raised_as_rpc_error() -> None:
    transport = await started(fixture("echo"))
    try:
        with pytest.raises(RpcError, match="no tool"):
            await call(transport, "does_not_exist")
    finally:
        await transport.close()


async def test_crash_after_reply_delivers_the_reply_and_reaps_the_child() -> None:
    transport = await started(fixture("crash"))
    pid = transport.pid
    assert pid is not None
    assert text_of(await call(transport, "crash")) == "goodbye"
    assert await gone(pid), f"child {pid} left as {process_state(pid)}"
    assert not transport.alive and transport.returncode == 3
    with pytest.raises(TransportClosed, match="exited with code 3"):
        await call(transport, "echo", text="anyone?")
    await transport.close()


async def test_a_child_that_closes_its_stdin_is_stopped_and_reaped(
    anyio_backend: tuple[str, dict[str, bool]], request: pytest.FixtureRequest
) -> None:
    if anyio_backend[1]["use_uvloop"]:
        # Why a model server, the only process that runs MCP children, stays on asyncio's loop
        # (server/http/serving.py): uvloop's pipe transports do not see a child close its stdin.
        not_applicable("MCP children run only under asyncio's loop, never uvloop's")
    transport = await started(fixture("echo"))
    pid = transport.pid
    assert pid is not None
    assert text_of(await call(transport, "close_stdin")) == "stdin closed"  # still read after stdin broke
    with pytest.raises(TransportClosed):
        await call(transport, "echo", text="hello?", timeout_s=2)
    assert not transport.alive
    assert await gone(pid), "a deaf child is stopped and reaped"
    await transport.close()


async def test_a_child_dying_mid_write_fails_the_call_not_llamba() -> None:
    transport = await started(fixture("crash"))
    try:
        assert text_of(await call(transport, "deafen_then_die")) == "deaf"
        begin = time.monotonic()
        # 4 MiB cannot fit in the pipe: the write is still pending when the child exits (EPIPE).
        with pytest.raises(TransportClosed):
            await call(transport, "echo", timeout_s=2 * LIVENESS_S, text="x" * (4 << 20))
        # Liveness bound: the exit fails the call at once, not at its timeout (twice the bound).
        assert time.monotonic() - begin < LIVENESS_S
        assert not transport.alive and transport.pid is not None and await gone(transport.pid)
    finally:
        await transport.close()


async def test_a_chatty_stderr_never_blocks_the_server() -> None:
    transport = await started(fixture("echo"))
    try:
        assert (
            text_of(await call(transport, "stderr_flood", kib=4096)) == "flooded"
        )  # 4 MiB, pipe holds 64 KiB
        assert text_of(await call(transport, "echo", text="after")) == "after"
    finally:
        await transport.close()


async def test_missing_command_and_bad_cwd_fail_to_spawn() -> None:
    with pytest.raises(SpawnError, match="not found on PATH"):
        await StdioTransport.spawn(McpServerConfig(name="x", command="no-such-mcp-server-binary"))
    with pytest.raises(SpawnError, match="cannot start"):
        await StdioTransport.spawn(fixture("echo", cwd="/no/such/dir"))


async def test_grandchild_holding_the_pipes_blocks_neither_start_nor_close() -> None:
    # The server exits at once but its grandchild keeps stdout open: no EOF will ever come.
    begin = time.monotonic()
    with pytest.raises(TransportClosed, match="exited with code 0"):
        await started(fixture("grandchild", "--exit-at-start"))
    # Liveness bound: the exit was noticed, the start did not wait for its initialize timeout (twice this).
    assert time.monotonic() - begin < LIVENESS_S

    transport = await started(fixture("grandchild"))
    grandchild = int(text_of(await call(transport, "grandchild_pid")))
    begin = time.monotonic()
    await transport.close()
    assert time.monotonic() - begin < LIVENESS_S  # close does not wait for an EOF that never comes
    assert await gone(grandchild), "the grandchild in the server's process group is killed too"


async def test_a_grandchild_that_left_the_process_group_cannot_block_close() -> None:
    transport = await started(fixture("grandchild", "--escape"))
    grandchild = int(text_of(await call(transport, "grandchild_pid")))
    try:
        begin = time.monotonic()
        await transport.close()
        # Liveness bound: close does not wait for the pipes' EOF (the grandchild's 31 s sleep).
        assert time.monotonic() - begin < LIVENESS_S
        assert process_state(grandchild) not in (None, "Z")  # out of reach, and yet we returned
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)


# -- manager ---------------------------------------------------------------------------------------
class FakeClock:
    """A clock the test moves by hand: a stand-in on purpose, so the cooldown test checks the refusal and
    the respawn at exact instants instead of sleeping through 5 s cooldowns on a loaded machine."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_warm_up_skips_every_kind_of_broken_server_and_keeps_the_rest(tmp_path: Path) -> None:
    configs = [
        fixture(
            "echo", "--rename", "add=y_add", server="x", env={"FIXTURE_ENV": "from config"}, cwd=str(tmp_path)
        ),
        fixture("echo", server="x_y"),  # its x_y_add collides with x's y_add: skipped, not overwritten
        McpServerConfig(name="missing", command="no-such-mcp-server-binary"),
        fixture("crash", "--die-at-start", server="dies"),
        fixture("slow", "--hang-init", server="hangs"),
        fixture("grandchild", "--exit-at-start", server="orphan"),
        fixture("empty"),
    ]
    manager = McpManager(configs, warmup_timeout_s=1.5)
    begin = time.monotonic()
    manager.start()
    await manager.wait_ready()
    try:
        # Liveness bound: broken servers are given up on (1.5 s warm-up timeout), none holds the rest back
        # until its own 30 s call timeout.
        assert time.monotonic() - begin < LIVENESS_S
        names = {t.name for t in manager.tools()}
        assert {"x_echo", "x_y_add", "x_y_echo", "x_y_pid"} <= names
        assert not any(n.split("_")[0] in ("missing", "dies", "hangs", "orphan", "empty") for n in names)
        assert manager.tool("x_y_add").server == "x"  # type: ignore[union-attr]
        env = await manager.call(manager.tool("x_env"), {"name": "FIXTURE_ENV"})  # type: ignore[arg-type]
        assert env.to_json() == {"plain_text_response": "from config"}
        path = await manager.call(manager.tool("x_env"), {"name": "PATH"})  # type: ignore[arg-type]
        assert path.text == os.environ["PATH"]  # merged over the parent's environment
        cwd = await manager.call(manager.tool("x_cwd"), {})  # type: ignore[arg-type]
        assert cwd.text == str(tmp_path)
        failed = await manager.call(manager.tool("x_fail"), {})  # type: ignore[arg-type]
        assert failed.to_json() == {"error": "it went wrong"}
    finally:
        await manager.stop()


async def test_a_stdio_tool_added_at_run_time_appears_after_list_changed() -> None:
    manager = McpManager([fixture("echo")])
    manager.start()
    await manager.wait_ready()
    try:
        assert manager.tool("echo_late") is None
        assert (await manager.call(manager.tool("echo_grow"), {})).text == "grown"  # type: ignore[arg-type]
        deadline = time.monotonic() + 5  # liveness bound: the listing follows the notification
        while manager.tool("echo_late") is None:
            assert time.monotonic() < deadline, "echo_late was not listed"
            await asyncio.sleep(0.02)
        late = await manager.call(manager.tool("echo_late"), {})  # type: ignore[arg-type]
        assert late.text == "late and here" and manager.tool("echo_echo") is not None
    finally:
        await manager.stop()


async def test_manager_timeout_then_next_call_succeeds() -> None:
    manager = McpManager([fixture("slow", timeout_ms=300)])
    manager.start()
    await manager.wait_ready()
    try:
        slow, echo = manager.tool("slow_sleep"), manager.tool("slow_echo")
        assert slow is not None and echo is not None
        timed_out = await manager.call(slow, {"seconds": 2})
        assert timed_out.error is not None and "timed out after 300 ms" in timed_out.error
        assert (await manager.call(echo, {"text": "ok"})).to_json() == {"plain_text_response": "ok"}
    finally:
        await manager.stop()


async def test_crash_restarts_at_once_then_backs_off_and_no_zombies() -> None:
    """A crash is restarted at the next call (llama-server's rule); a server that crashes again within
    RESTART_WINDOW_S of its start waits its cooldown, doubled at each such crash; one that ran longer
    than the window starts at once again."""
    clock = FakeClock()
    manager = McpManager([fixture("crash", restart_cooldown_ms=5000)], clock=clock)
    manager.start()
    await manager.wait_ready()
    crash, pid_tool = manager.tool("crash_crash"), manager.tool("crash_pid")
    assert crash is not None and pid_tool is not None
    pids = [int((await manager.call(pid_tool, {})).text or 0)]
    try:
        # 0: restarted at the next call (the first crash, or one after running past the window)
        for backoff in (0.0, 5.0, 10.0, 20.0, None):
            if backoff is None:
                clock.now += RESTART_WINDOW_S  # it ran a while: its crash is a first one again
            assert (await manager.call(crash, {})).text == "goodbye"
            assert await gone(pids[-1]), "the crashed server was reaped"
            if backoff:  # within the back-off since the last start: refused, no restart
                refused = await manager.call(pid_tool, {})
                assert refused.error is not None and f"may be restarted in {backoff:.1f} s" in refused.error
                clock.now += backoff
            pids.append(int((await manager.call(pid_tool, {})).text or 0))
        assert len(set(pids)) == 6, "each call after a crash ran in a fresh process"
        for pid in pids[:-1]:
            assert process_state(pid) is None, f"pid {pid} is {process_state(pid)} (zombie?)"
    finally:
        await manager.stop()
    assert await gone(pids[-1]), "stop() ends the live server"


async def test_concurrent_calls_to_a_crashed_server_respawn_it_once() -> None:
    manager = McpManager([fixture("crash", restart_cooldown_ms=0)])
    manager.start()
    await manager.wait_ready()
    try:
        crash, pid_tool = manager.tool("crash_crash"), manager.tool("crash_pid")
        assert crash is not None and pid_tool is not None
        await manager.call(crash, {})
        await asyncio.sleep(0.3)
        results = await asyncio.gather(*(manager.call(pid_tool, {}) for _ in range(5)))
        assert len({r.text for r in results}) == 1 and results[0].error is None
    finally:
        await manager.stop()


async def test_stop_during_a_slow_call_is_prompt() -> None:
    manager = McpManager([fixture("slow"), fixture("grandchild")])
    manager.start()
    await manager.wait_ready()
    slow = manager.tool("slow_sleep")
    assert slow is not None
    pending = asyncio.create_task(manager.call(slow, {"seconds": 60}))
    await asyncio.sleep(0.3)
    begin = time.monotonic()
    await manager.stop()
    result = await asyncio.wait_for(pending, LIVENESS_S)
    assert time.monotonic() - begin < LIVENESS_S  # stop answers the pending call, not at its 60 s
    assert result.error is not None and "shutting down" in result.error
    after = await manager.call(slow, {"seconds": 0})
    assert after.error is not None and "shutting down" in after.error
