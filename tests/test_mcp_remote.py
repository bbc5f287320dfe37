"""Remote MCP servers against real ones (the `mcp` SDK's FastMCP over Streamable HTTP and HTTP+SSE on
127.0.0.1, tests/mcp_servers/remote.py, checking a bearer token), and the egress policy of
client-named servers (`--mcp-allow-hosts`), with no model: the manager and its sessions directly."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Iterator
from typing import Any

import pytest

from server.mcp import HostPolicy, HostRefused, McpManager, McpServerConfig, McpTool
from tests.mcp_servers.launch import TOKEN, Listener, RemoteServer

pytestmark = pytest.mark.anyio
TRANSPORTS = ["streamable-http", "sse"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def remote(
    server: RemoteServer, name: str = "web", token: str | None = TOKEN, **extra: Any
) -> McpServerConfig:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return McpServerConfig(name=name, transport=server.transport, url=server.url, headers=headers, **extra)


async def started(*configs: McpServerConfig, **kwargs: Any) -> McpManager:
    manager = McpManager(configs, **kwargs)
    manager.start()
    await manager.wait_ready()
    return manager


def tool(manager: McpManager, name: str) -> McpTool:
    found = manager.tool(name)
    assert found is not None, f"{name} not in {[t.name for t in manager.tools()]}"
    return found


async def until(condition: Any, within_s: float, what: str) -> None:
    """A liveness bound, not a speed check."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {within_s} s"
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module", params=TRANSPORTS)
def shared(request: pytest.FixtureRequest) -> Iterator[RemoteServer]:
    """One server per transport for the module's tests that leave it running."""
    with RemoteServer(request.param) as started_server:
        yield started_server


@pytest.fixture(params=TRANSPORTS)
def server(request: pytest.FixtureRequest) -> Iterator[RemoteServer]:
    """A server of the test's own (it is killed)."""
    with RemoteServer(request.param) as started_server:
        yield started_server


# -- the egress policy ---------------------------------------------------------------------------------
def test_policy_patterns_are_parsed_and_bad_ones_named() -> None:
    policy = HostPolicy.parse(["mcp.example.com", "*.corp.example", "10.0.0.0/8", "[::1]", "127.0.0.1"])
    assert policy.names == {"mcp.example.com"} and policy.suffixes == (".corp.example",)
    assert ipaddress.ip_network("10.0.0.0/8") in policy.networks and not policy.any_host
    for bad in ("http://x.example", "host:8080", "a..b", "*.", "under_score.example"):
        with pytest.raises(ValueError, match="is not a host name"):
            HostPolicy.parse([bad])
    assert not HostPolicy.parse([]).enabled and HostPolicy.parse(["*"]).any_host


@pytest.mark.parametrize(
    ("patterns", "url", "message"),
    [
        ([], "https://mcp.example.com/mcp", "--mcp-allow-hosts is not set"),
        (["*"], "ftp://mcp.example.com/mcp", "not an http:// or https:// URL"),
        (["*"], "https://user:pw@mcp.example.com/mcp", "credentials"),
        (["mcp.example.com"], "https://other.example.com/mcp", "'other.example.com' is not among"),
        (["*.example.com"], "https://example.com.evil.test/mcp", "is not among"),
        (["10.0.0.0/8"], "http://11.0.0.1/mcp", "'11.0.0.1' is not among"),
    ],
)
def test_urls_a_policy_refuses_by_name(patterns: list[str], url: str, message: str) -> None:
    with pytest.raises(HostRefused, match=message):
        HostPolicy.parse(patterns).check_url(url)


@pytest.mark.parametrize(
    ("patterns", "host", "allowed"),
    [
        (["*"], "127.0.0.1", False),  # a wildcard never reaches loopback, private or link-local ranges
        (["*"], "localhost", False),
        (["*"], "169.254.169.254", False),  # a cloud's metadata address
        (["*"], "10.1.2.3", False),
        (["*"], "::ffff:127.0.0.1", False),  # IPv4 mapped into IPv6 is the IPv4 address
        (["*"], "8.8.8.8", True),
        (["127.0.0.1"], "127.0.0.1", True),  # listed: allowed
        (["127.0.0.0/8"], "127.0.0.2", True),
        (["10.0.0.0/8"], "10.1.2.3", True),
        (["localhost"], "localhost", True),  # a name listed exactly may resolve anywhere
    ],
)
async def test_every_address_of_a_host_is_checked(patterns: list[str], host: str, allowed: bool) -> None:
    policy = HostPolicy.parse(patterns)
    scheme_host = f"[{host}]" if ":" in host else host
    try:
        await policy.resolve(*policy.check_url(f"http://{scheme_host}/mcp"))
    except HostRefused as exc:
        assert not allowed, str(exc)
        assert "not among" in str(exc) or "loopback, private, link-local or reserved" in str(exc)
    else:
        assert allowed


def test_the_flag_takes_patterns_and_refuses_bad_ones(capsys: pytest.CaptureFixture[str]) -> None:
    from server.config.parse import parse_settings

    assert parse_settings([])[0].mcp_allow_hosts == ()  # off by default
    settings, _ = parse_settings(["--mcp-allow-hosts", "mcp.example.com, *.corp.example,10.0.0.0/8"])
    assert settings.mcp_allow_hosts == ("mcp.example.com", "*.corp.example", "10.0.0.0/8")
    with pytest.raises(SystemExit) as exit_info:
        parse_settings(["--mcp-allow-hosts", "http://x.example"])
    assert exit_info.value.code == 2 and "--mcp-allow-hosts: 'http://x.example'" in capsys.readouterr().err


# -- configured remote servers -------------------------------------------------------------------------
async def test_a_remote_server_is_listed_and_called_with_its_header(shared: RemoteServer) -> None:
    server, before = shared, shared.stats()
    manager = await started(remote(server))
    try:
        add = tool(manager, "web_add")
        assert add.description == "Add two numbers." and add.remote is None
        assert (await manager.call(add, {"a": 2, "b": 3})).text == "5.0"
        session = manager._servers["web"].session
        assert session is not None and session.protocol_version == "2026-07-28"  # negotiated by the SDK
        after = server.stats()  # every request carried the token
        assert after["authorized"] - before["authorized"] >= 2 and after["refused"] == before["refused"]
    finally:
        await manager.stop()


async def test_a_wrong_token_is_refused_and_the_server_skipped(shared: RemoteServer) -> None:
    before = shared.stats()["refused"]
    manager = await started(remote(shared, token="wrong"), warmup_timeout_s=5)
    try:
        assert manager.server_tools("web") == [] and shared.stats()["refused"] > before
    finally:
        await manager.stop()


async def test_a_tool_added_at_run_time_appears_after_list_changed(shared: RemoteServer) -> None:
    server = shared
    manager = await started(remote(server))
    try:
        assert manager.tool("web_late_tool") is None
        assert (await manager.call(tool(manager, "web_grow"), {})).text == "grown"
        await until(lambda: manager.tool("web_late_tool") is not None, 10, "late_tool listed")
        assert (await manager.call(tool(manager, "web_late_tool"), {})).text == "late and here"
    finally:
        await manager.stop()


async def test_a_server_killed_mid_call_fails_the_call_and_the_next_call_reconnects(
    server: RemoteServer,
) -> None:
    manager = await started(remote(server))
    try:
        pending = asyncio.create_task(manager.call(tool(manager, "web_sleep"), {"seconds": 30}))
        await asyncio.sleep(0.5)
        server.kill()
        result = await asyncio.wait_for(pending, 10)  # liveness bound: not the call's 30 s
        assert result.error is not None and "MCP server 'web'" in result.error, result
        down = await manager.call(tool(manager, "web_add"), {"a": 1, "b": 1})
        assert down.error is not None and "cannot connect" in down.error  # nothing listens: said so
        restarted = server.restart()
        try:
            assert (await manager.call(tool(manager, "web_add"), {"a": 1, "b": 1})).text == "2.0"
        finally:
            restarted.kill()
    finally:
        await manager.stop()


async def test_garbage_on_the_wire_is_a_tool_error_and_the_next_call_works(shared: RemoteServer) -> None:
    server = shared
    manager = await started(remote(server, timeout_ms=10_000))
    try:
        junk = await manager.call(tool(manager, "web_junk"), {})  # fails at once, not at its timeout
        assert junk.error is not None and "MCP server 'web'" in junk.error, junk
        assert (await manager.call(tool(manager, "web_echo"), {"text": "still here"})).text == "still here"
    finally:
        await manager.stop()


async def test_a_slow_remote_call_times_out_and_the_session_stays(shared: RemoteServer) -> None:
    server = shared
    manager = await started(remote(server, timeout_ms=400))
    try:
        slow = await manager.call(tool(manager, "web_sleep"), {"seconds": 5})
        assert slow.error == "tool 'web_sleep' timed out after 400 ms"
        assert (await manager.call(tool(manager, "web_add"), {"a": 1, "b": 2})).text == "3.0"
    finally:
        await manager.stop()


# -- client-named servers ------------------------------------------------------------------------------
def named(server: RemoteServer, url: str | None = None, **extra: Any) -> McpServerConfig:
    fields = {"transport": server.transport, **extra}
    return McpServerConfig(name="named", url=url or server.url,
                           headers={"Authorization": f"Bearer {TOKEN}"}, **fields)  # fmt: skip


async def test_a_client_named_server_is_listed_and_called_when_its_host_is_allowed(
    shared: RemoteServer,
) -> None:
    server = shared
    manager = await started(policy=HostPolicy.parse(["127.0.0.1"]))
    try:
        tools = {t.tool: t for t in await manager.list_named(named(server))}
        assert {"echo", "add", "grow"} <= tools.keys() and tools["add"].name == "named_add"
        assert (await manager.call(tools["add"], {"a": 4, "b": 4})).text == "8.0"
        assert "s3cret" not in repr(tools["add"])  # the headers are never shown
    finally:
        await manager.stop()


@pytest.mark.parametrize("patterns", [[], ["*"], ["mcp.example.com"], ["127.0.0.2"]])
async def test_a_refused_host_gets_no_connection(patterns: list[str]) -> None:
    listener = Listener()
    manager = await started(policy=HostPolicy.parse(patterns))
    try:
        config = McpServerConfig(
            name="x", transport="streamable-http", url=f"http://127.0.0.1:{listener.port}/mcp"
        )
        with pytest.raises(HostRefused):
            await manager.list_named(config)
    finally:
        await manager.stop()
    assert listener.close() == 0


async def test_a_redirect_to_a_refused_host_is_refused_and_not_followed(shared: RemoteServer) -> None:
    server = shared
    listener = Listener("127.0.0.2")  # loopback too, but not listed
    manager = await started(policy=HostPolicy.parse(["127.0.0.1"]))
    try:
        hop = f"{server.base}/hop?to=http://127.0.0.2:{listener.port}/mcp"
        with pytest.raises(HostRefused, match="redirected to http://127.0.0.2"):
            await manager.list_named(named(server, hop, transport="streamable-http"))
    finally:
        await manager.stop()
    assert listener.close() == 0
