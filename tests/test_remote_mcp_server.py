"""Remote MCP servers end to end: a real llamba-server (SmolLM2) whose MCP servers are real remote ones,
the `mcp` SDK's FastMCP over Streamable HTTP and over HTTP+SSE on 127.0.0.1 (tests/mcp_servers/remote.py,
each checking a bearer token), reached from /tools and from the server-side tool loop of
/v1/chat/completions, /v1/messages (the `anthropic` SDK's MCP connector) and /v1/responses (the `openai`
SDK), configured and named per request by `server_url` (--mcp-allow-hosts 127.0.0.1); a tool added at
run time; a server killed mid-call; and the URLs that must be refused with no connection made.

SmolLM2 calls a tool whenever one is offered, so each run is forced: a named tool_choice and
`max_tool_rounds: 1` (round one calls the tool, round two may only answer).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.mcp_servers.launch import TOKEN, Listener, RemoteServer
from tests.server_process import ServerProcess, wait_until
from tests.test_mcp_server import wait_for_tools, write_config

BEARER = {"Authorization": f"Bearer {TOKEN}"}
SAY = "Please run the tool, then tell me what it said."


@pytest.fixture(scope="module")
def remotes() -> Iterator[dict[str, RemoteServer]]:
    """The configured servers: `web` (Streamable HTTP), `old` (HTTP+SSE), `fragile` (killed by a test)."""
    started = {"web": RemoteServer("streamable-http"), "old": RemoteServer("sse"),
               "fragile": RemoteServer("streamable-http")}  # fmt: skip
    yield started
    for server in started.values():
        server.kill()


@pytest.fixture(scope="module")
def srv(
    remotes: dict[str, RemoteServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    servers = {name: {"url": r.url, "headers": BEARER, "timeout_ms": 20_000} for name, r in remotes.items()}
    servers["old"]["type"] = "sse"
    config = write_config(tmp_path_factory.mktemp("remote-mcp") / "mcp.json", servers)
    args = ("-m", "smollm2", "-np", "2", "-c", "4096", "--mcp-servers-config", str(config))
    proc = ServerProcess(*args, "--mcp-allow-hosts", "127.0.0.1").wait_healthy()
    wait_for_tools(proc)
    yield proc
    proc.stop()


@pytest.fixture
def client(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.base_url, timeout=300) as c:
        yield c


def mcp_tool(label: str, tool: str, remote: RemoteServer | None = None) -> dict[str, Any]:
    """An `mcp` tool: a configured server by its label, or (with `remote`) one named by server_url."""
    spec = {"type": "mcp", "server_label": label, "allowed_tools": [tool], "require_approval": "never"}
    return spec | ({"server_url": remote.url, "headers": BEARER} if remote else {})


def chat_forced(label: str, tool: str, remote: RemoteServer | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": SAY}],
        "tools": [mcp_tool(label, tool, remote)],
        "tool_choice": {"type": "function", "function": {"name": f"{label}_{tool}"}},
        "max_tool_rounds": 1,
        "temperature": 0,
        "max_tokens": 200,
        **extra,
    }


def tool_message(reply: dict[str, Any]) -> dict[str, Any]:
    """The run's one MCP result (chat's intermediate messages)."""
    (result,) = [m for m in reply["choices"][0]["intermediate_messages"] if m["role"] == "tool"]
    return result


def echoed(reply: dict[str, Any]) -> str:
    """What the echo tool answered: the text the model sent it (its call's arguments)."""
    (call,) = [c for m in reply["choices"][0]["intermediate_messages"] for c in m.get("tool_calls") or ()]
    return str(json.loads(call["function"]["arguments"]).get("text", ""))


# -- /tools ------------------------------------------------------------------------------------------
def test_tools_lists_and_calls_the_remote_servers_with_their_token(
    client: httpx.Client, remotes: dict[str, RemoteServer]
) -> None:
    tools = {t["tool"]: t for t in client.get("/tools").json()}
    for server in ("web", "old", "fragile"):
        assert {f"{server}_echo", f"{server}_add"} <= tools.keys() and tools[f"{server}_add"][
            "server"
        ] == server
    for server in ("web", "old"):
        before = remotes[server].stats()
        reply = client.post("/tools", json={"tool": f"{server}_add", "params": {"a": 2, "b": 40}})
        assert reply.json() == {"plain_text_response": "42.0"}
        after = remotes[server].stats()
        assert after["authorized"] > before["authorized"] and after["refused"] == before["refused"]


def test_a_tool_added_at_run_time_appears_after_list_changed(client: httpx.Client) -> None:
    names = lambda: {t["tool"] for t in client.get("/tools").json()}  # noqa: E731
    assert "old_late_tool" not in names()
    grown = client.post("/tools", json={"tool": "old_grow", "params": {}}).json()
    assert grown == {"plain_text_response": "grown"}
    wait_until(lambda: "old_late_tool" in names(), 15, "late_tool listed after tools/list_changed")
    reply = client.post("/tools", json={"tool": "old_late_tool", "params": {}}).json()
    assert reply == {"plain_text_response": "late and here"}


# -- the tool loop, configured servers ---------------------------------------------------------------------
@pytest.mark.parametrize("server", ["web", "old"])
def test_chat_completions_runs_a_remote_tool(client: httpx.Client, server: str) -> None:
    reply = client.post("/v1/chat/completions", json=chat_forced(server, "echo"))
    assert reply.status_code == 200, reply.text
    result = tool_message(reply.json())
    assert result["name"] == f"{server}_echo" and not result["is_error"]
    assert result["content"] == echoed(reply.json())  # the remote server's own answer
    assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_messages_runs_a_remote_tool_through_the_mcp_connector(srv: ServerProcess, stream: bool) -> None:
    asked: dict[str, Any] = {
        "model": "any", "max_tokens": 200, "betas": ["mcp-client-2025-04-04"],
        "messages": [{"role": "user", "content": SAY}],
        "mcp_servers": [{"type": "url", "url": "mcp://web", "name": "web",
                         "tool_configuration": {"allowed_tools": ["add"]}}],
        "tool_choice": {"type": "tool", "name": "web_add"},
        "extra_body": {"max_tool_rounds": 1, "temperature": 0},
    }  # fmt: skip
    with anthropic.Anthropic(base_url=srv.base_url, api_key="none", max_retries=0, timeout=300) as api:
        if stream:  # the SDK rebuilds the message from the stream's events
            with api.beta.messages.stream(**asked) as events:
                message = events.get_final_message()
        else:
            message = api.beta.messages.create(**asked)
    kinds = [block.type for block in message.content]
    assert kinds[:2] == ["mcp_tool_use", "mcp_tool_result"], kinds
    use, result = message.content[:2]
    assert (use.name, use.server_name) == ("add", "web") and result.tool_use_id == use.id
    total = float(use.input["a"]) + float(use.input["b"])
    assert not result.is_error and float(result.content[0].text) == total
    assert message.stop_reason in ("end_turn", "max_tokens")
    # The message sent back as the assistant's turn: its MCP call and result are part of the conversation.
    again = {"model": "any", "max_tokens": 20, "messages": [
        {"role": "user", "content": SAY},
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]},
        {"role": "user", "content": "Thanks. And what is 2 + 2?"},
    ]}  # fmt: skip
    reply = httpx.post(srv.base_url + "/v1/messages", json=again, timeout=300)
    assert reply.status_code == 200, reply.text
    bad = [{"type": "mcp_tool_result", "tool_use_id": "nope", "content": [{"type": "text", "text": "x"}]}]
    again["messages"][1] = {"role": "assistant", "content": bad}
    reply = httpx.post(srv.base_url + "/v1/messages", json=again, timeout=300)
    assert reply.status_code == 400 and "messages.1.content.0.tool_use_id" in reply.text


def test_responses_runs_a_remote_tool(srv: ServerProcess) -> None:
    with openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0, timeout=300) as api:
        response = api.responses.create(
            model="any", input=SAY, tools=[mcp_tool("old", "echo")], temperature=0, max_output_tokens=200,
            tool_choice={"type": "mcp", "server_label": "old", "name": "echo"},
            extra_body={"max_tool_rounds": 1},
        )  # fmt: skip
    assert [item.type for item in response.output][:2] == ["mcp_list_tools", "mcp_call"]
    call = response.output[1]
    assert call.server_label == "old" and call.status == "completed"
    assert call.output == json.loads(call.arguments).get("text", "")


# -- the tool loop, servers named by the request -------------------------------------------------------
def test_chat_runs_a_tool_of_a_server_named_by_url(
    client: httpx.Client, remotes: dict[str, RemoteServer]
) -> None:
    for server in ("web", "old"):
        remote = remotes[server]
        before = remote.stats()["authorized"]
        reply = client.post("/v1/chat/completions", json=chat_forced("mine", "echo", remote))
        assert reply.status_code == 200, reply.text
        result = tool_message(reply.json())
        assert result["name"] == "mine_echo" and result["content"] == echoed(reply.json())
        assert remote.stats()["authorized"] > before  # the request's own Authorization header reached it


def test_messages_and_responses_run_a_tool_of_a_server_named_by_url(
    srv: ServerProcess, remotes: dict[str, RemoteServer]
) -> None:
    remote = remotes["web"]
    with anthropic.Anthropic(base_url=srv.base_url, api_key="none", max_retries=0, timeout=300) as api:
        message = api.beta.messages.create(
            model="any", max_tokens=200, betas=["mcp-client-2025-04-04"],
            messages=[{"role": "user", "content": SAY}],
            mcp_servers=[{"type": "url", "url": remote.url, "name": "mine", "authorization_token": TOKEN,
                          "tool_configuration": {"allowed_tools": ["echo"]}}],
            tool_choice={"type": "tool", "name": "mine_echo"},
            extra_body={"max_tool_rounds": 1, "temperature": 0},
        )  # fmt: skip
    use, result = message.content[:2]
    assert (use.type, use.server_name, result.type) == ("mcp_tool_use", "mine", "mcp_tool_result")
    assert not result.is_error and result.content[0].text == use.input.get("text", "")
    with openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0, timeout=300) as oa:
        response = oa.responses.create(
            model="any", input=SAY, tools=[mcp_tool("mine", "add", remote)], temperature=0,
            max_output_tokens=200, tool_choice={"type": "mcp", "server_label": "mine", "name": "add"},
            parallel_tool_calls=False,  # one call: greedy SmolLM2 may repeat parallel calls to the limit
            extra_body={"max_tool_rounds": 1},
        )  # fmt: skip
        call = response.output[1]
        assert (call.type, call.server_label, call.status) == ("mcp_call", "mine", "completed")
        arguments = json.loads(call.arguments)
        assert float(call.output or "nan") == float(arguments["a"]) + float(arguments["b"])
        assert "headers" not in response.tools[0].model_dump(exclude_none=True)  # never echoed
        stored = oa.responses.retrieve(response.id)
        assert TOKEN not in stored.model_dump_json()


def test_a_server_named_by_url_asks_for_approval_by_default(
    srv: ServerProcess, remotes: dict[str, RemoteServer]
) -> None:
    spec = {k: v for k, v in mcp_tool("mine", "echo", remotes["web"]).items() if k != "require_approval"}
    with openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0, timeout=300) as api:
        asked = api.responses.create(
            model="any", input=SAY, tools=[spec], temperature=0, max_output_tokens=200,
            tool_choice={"type": "mcp", "server_label": "mine", "name": "echo"},
            extra_body={"max_tool_rounds": 1},
        )  # fmt: skip
        request = asked.output[-1]
        assert request.type == "mcp_approval_request" and (request.server_label, request.name) == (
            "mine",
            "echo",
        )
        approved = api.responses.create(
            model="any", previous_response_id=asked.id, tools=[spec], temperature=0, max_output_tokens=200,
            input=[{"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}],
            tool_choice="none",
        )  # fmt: skip
    call = approved.output[1]
    assert (call.type, call.approval_request_id, call.status) == ("mcp_call", request.id, "completed")
    assert call.output == json.loads(request.arguments).get("text", "")


# -- faults --------------------------------------------------------------------------------------------
def test_a_server_killed_mid_call_is_a_tool_error_and_the_next_call_reconnects(
    client: httpx.Client, remotes: dict[str, RemoteServer]
) -> None:
    fragile = remotes["fragile"]
    replies: list[httpx.Response] = []
    run = threading.Thread(target=lambda: replies.append(
        client.post("/v1/chat/completions", json=chat_forced("fragile", "hang"))))  # fmt: skip
    run.start()
    wait_until(lambda: fragile.stats()["hanging"] > 0, 120, "the call reached the server")
    fragile.kill()
    run.join(60)  # liveness bound: the run goes on as soon as the connection is lost
    assert replies and replies[0].status_code == 200, replies
    result = tool_message(replies[0].json())
    assert result["is_error"] and "MCP server 'fragile' failed during tools/call" in result["content"], result
    remotes["fragile"] = fragile.restart()
    reply = client.post("/tools", json={"tool": "fragile_add", "params": {"a": 1, "b": 2}})
    assert reply.json() == {"plain_text_response": "3.0"}  # connected again


# -- refused URLs: a 400 naming the field, and no connection --------------------------------------------
def refused(reply: httpx.Response, field: str) -> None:
    assert reply.status_code == 400, reply.text
    body = reply.json()
    message = body["error"]["message"]
    assert f"'{field}'" in message, message


@pytest.mark.parametrize("route", ["chat", "messages", "responses"])
def test_a_host_that_is_not_allowed_is_refused_before_any_connection(
    client: httpx.Client, route: str
) -> None:
    listener = Listener("127.0.0.2")  # loopback too, but only 127.0.0.1 is listed
    url = f"http://127.0.0.2:{listener.port}/mcp"
    if route == "chat":
        spec = mcp_tool("x", "echo") | {"server_url": url}
        reply = client.post("/v1/chat/completions", json=chat_forced("x", "echo") | {"tools": [spec]})
        refused(reply, "server_url")
    elif route == "messages":
        body = {"model": "any", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
                "mcp_servers": [{"type": "url", "url": url, "name": "x"}]}  # fmt: skip
        refused(client.post("/v1/messages", json=body), "mcp_servers.0.url")
    else:
        spec = mcp_tool("x", "echo") | {"server_url": url}
        refused(client.post("/v1/responses", json={"input": "hi", "tools": [spec]}), "server_url")
    assert listener.close() == 0


def test_a_redirect_to_a_host_not_allowed_is_refused(
    client: httpx.Client, remotes: dict[str, RemoteServer]
) -> None:
    listener = Listener("127.0.0.2")
    hop = f"{remotes['web'].base}/hop?to=http://127.0.0.2:{listener.port}/mcp"
    spec = mcp_tool("x", "echo") | {"server_url": hop}
    reply = client.post("/v1/responses", json={"input": "hi", "tools": [spec]})
    refused(reply, "server_url")
    assert "redirected to http://127.0.0.2" in reply.json()["error"]["message"]
    assert listener.close() == 0


def test_loopback_is_refused_unless_listed(tmp_path: Path) -> None:
    """A server that allows any public host (`*`) but does not list 127.0.0.1."""
    listener = Listener()
    proc = ServerProcess("-m", "smollm2", "-c", "2048", "--mcp-allow-hosts", "*").wait_healthy()
    try:
        spec = mcp_tool("x", "echo") | {"server_url": f"http://127.0.0.1:{listener.port}/mcp"}
        body = chat_forced("x", "echo") | {"tools": [spec]}
        reply = httpx.post(proc.base_url + "/v1/chat/completions", json=body, timeout=60)
        refused(reply, "server_url")
        assert "loopback, private, link-local or reserved" in reply.json()["error"]["message"]
    finally:
        proc.stop()
    assert listener.close() == 0


def test_header_values_never_reach_the_log(srv: ServerProcess) -> None:
    time.sleep(0.5)  # the log file is written as the server runs
    log = srv.log_path.read_text(errors="replace")
    assert "mcp.remote_connected" in log and TOKEN not in log
