"""The web UI's tools, edit and regenerate end to end: real headless Chromium against a real server with
SmolLM2 and real MCP servers (mcp-server-time, and a fixture whose one tool answers after 3 s).

Everything is done through the page by accessible names; the page's own state (`window.llamba`) is read
to compare texts byte for byte with what the server streamed.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess
from tests.test_mcp_server import VENV_BIN, fixture, wait_for_tools, write_config
from tests.test_webui_browser import (
    LOAD_ERRORS,
    SCRIPTED_FETCH,
    answer,
    chat_posts,
    last_message,
    open_app,
    push,
    send,
    settings,
    shoot,
    wait_status,
)
from tests.webui_browser import DESKTOP, PageErrors, app_page, browser  # noqa: F401


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    assert shutil.which("mcp-server-time", path=VENV_BIN), "pip install mcp-server-time (the test extra)"
    config = write_config(
        tmp_path_factory.mktemp("webui-agents") / "mcp.json",
        {
            "time": {"command": str(Path(VENV_BIN) / "mcp-server-time")},
            "clock": fixture("slow", "--only", "wait"),
        },
    )
    proc = ServerProcess("-m", "smollm2", "-c", "4096", "-np", "2", "--mcp-servers-config", str(config))
    proc.wait_healthy()
    wait_for_tools(proc)
    yield proc
    proc.stop()


@pytest.fixture
def page(browser: Any, srv: ServerProcess) -> Iterator[Any]:  # noqa: F811
    with app_page(browser, srv.base_url, LOAD_ERRORS) as tab:
        yield tab


def switch_server(page: Any, label: str, on: bool = True) -> None:
    """Open the composer's Tools and set the MCP server's switch."""
    from playwright.sync_api import expect

    toggle = page.get_by_role("button", name="Tools", exact=True)
    if toggle.get_attribute("aria-expanded") != "true":
        toggle.click()
    box = page.get_by_role("group", name="MCP servers for this conversation").get_by_role(
        "checkbox", name=label, exact=True
    )
    box.set_checked(on)
    expect(box).to_be_checked(checked=on)


def tool_block(page: Any, name: str) -> Any:
    return answer(page).get_by_role("group", name=f"Tool call {name}")


def session_replay(srv: ServerProcess, page: Any) -> dict[str, Any]:
    """The whole run as the server streamed it (its session, replayed from byte 0): tool results, text."""
    key = page.evaluate("() => `${window.llamba.current.id}::${window.llamba.model}`")
    data = httpx.get(srv.base_url + "/v1/stream", params={"conv_id": key, "from": 0}, timeout=60).content
    results, content = [], ""
    for event in data.decode().split("\n\n"):
        if not event.startswith("data: {"):
            continue
        for choice in json.loads(event[6:])["choices"]:
            delta = choice["delta"]
            if delta.get("role") == "tool":
                results.append(delta["content"])
            elif delta.get("content"):
                content += delta["content"]
    return {"results": results, "content": content}


# -- the time tool -----------------------------------------------------------------------------------
def test_switch_the_time_server_on_and_see_the_call_and_the_answer(page: Any, srv: ServerProcess) -> None:
    from playwright.sync_api import expect

    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "200", "Max tool rounds": "1"})
    switch_server(page, "time")
    send(page, "What time is it now in UTC?")
    wait_status(page, "done", timeout=180)
    block = tool_block(page, "time_get_current_time")
    expect(block).to_be_visible()
    expect(block.locator(".tool-state")).to_have_text("Done")
    block.locator("summary").click()
    message = last_message(page)
    [call] = message["tools"]
    result = json.loads(call["result"])
    assert result["timezone"] == json.loads(call["arguments"])["timezone"] and call["isError"] is False
    when = dt.datetime.fromisoformat(result["datetime"])
    assert abs((when - dt.datetime.now(dt.UTC)).total_seconds()) < 600, "the real tool's answer"
    expect(block.locator(".tool-result")).to_have_text(call["result"])  # as text, exactly
    assert message["content"].strip(), "the answer comes after the call"
    expect(answer(page).locator(".content")).not_to_be_empty()
    assert posts[0]["body"]["tools"] == [{"type": "mcp", "server_label": "time"}]
    assert posts[0]["body"]["max_tool_rounds"] == 1
    shoot(page, "webui-tool-call.png")

    switch_server(page, "time", on=False)  # the next question goes without tools ...
    settings(page, **{"Max tokens": "8"})
    send(page, "Thanks!")
    wait_status(page, "done")
    follow_up = posts[1]["body"]
    assert "tools" not in follow_up and "max_tool_rounds" not in follow_up
    # ... but its history holds the run as the server added it: the call, then its result.
    roles = [m["role"] for m in follow_up["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "user"]
    assert follow_up["messages"][1]["tool_calls"][0]["id"] == call["id"]
    assert follow_up["messages"][2]["content"] == call["result"]


def test_reload_during_a_tool_call_gets_the_whole_run(page: Any, srv: ServerProcess) -> None:
    from playwright.sync_api import expect

    settings(page, Temperature="0", **{"Max tokens": "120", "Max tool rounds": "1"})
    switch_server(page, "clock")
    send(page, "Please wait a moment for me.")
    # The call is running (the tool answers after 3 s) when the page goes away.
    page.wait_for_function(
        "() => window.llamba.current?.messages.at(-1)?.tools?.[0]?.name === 'clock_wait'", timeout=120_000
    )
    expect(tool_block(page, "clock_wait").locator(".tool-state")).to_have_text("Running…")
    page.reload()
    wait_status(page, "done", timeout=180)
    message = last_message(page)
    assert [c["result"] for c in message["tools"]] == ["done waiting"]
    streamed = session_replay(srv, page)
    assert streamed["results"] == ["done waiting"] and streamed["content"] == message["content"]
    expect(tool_block(page, "clock_wait").locator(".tool-state")).to_have_text("Done")


# -- edit and regenerate -----------------------------------------------------------------------------
def test_edit_a_question_and_regenerate_the_answer(page: Any) -> None:
    from playwright.sync_api import expect

    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "12"})
    send(page, "Name a colour.")
    wait_status(page, "done")
    question = page.locator("article.msg.user")
    question.hover()
    question.get_by_role("button", name="Edit message").click()
    box = page.get_by_role("textbox", name="Edit message text")
    expect(box).to_have_value("Name a colour.")
    box.fill("Name a fruit.")
    page.get_by_role("button", name="Submit edit").click()
    wait_status(page, "done")
    expect(page.locator("article.msg")).to_have_count(2)  # the edit's branch is shown (the old one: < 1/2)
    expect(question.locator(".bubble")).to_have_text("Name a fruit.")
    edited = last_message(page)["content"]
    assert [m["content"] for m in posts[1]["body"]["messages"]] == ["Name a fruit."]
    answer(page).get_by_role("button", name="Regenerate").click()
    wait_status(page, "done")
    expect(page.locator("article.msg")).to_have_count(2)
    assert posts[2]["body"]["messages"] == posts[1]["body"]["messages"]
    assert last_message(page)["content"] == edited, "temperature 0: the same answer again"
    page.reload()  # what is stored is the edited branch, shown
    expect(page.locator("article.msg.user .bubble")).to_have_text("Name a fruit.")
    expect(page.locator("article.msg")).to_have_count(2)


# -- a scripted run: how the page shows tool calls, whatever the model -------------------------------
def test_tool_blocks_show_arguments_and_results_as_text(browser: Any, srv: ServerProcess) -> None:  # noqa: F811
    """A scripted stream (SCRIPTED_FETCH: only the chat POST is replaced) whose tool result and arguments
    carry markup: SmolLM2 would never write these on purpose, and the page must show them as text."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport=DESKTOP, base_url=srv.base_url)
    context.add_init_script(SCRIPTED_FETCH)
    page = context.new_page()
    errors = PageErrors(page)
    open_app(page)
    send(page, "Look it up.")
    push(page, {"role": "assistant", "content": None})
    call = {
        "index": 0,
        "id": "call_a",
        "type": "function",
        "function": {"name": "web_fetch", "arguments": ""},
    }
    push(page, {"tool_calls": [call]})
    push(page, {"tool_calls": [{"index": 0, "function": {"arguments": '{"url": "<b>x</b>"}'}}]})
    expect(tool_block(page, "web_fetch").locator(".tool-state")).to_have_text("Running…")
    html = "<img src=x onerror=window.pwned=1><script>window.pwned=2</script>"
    push(
        page,
        {"role": "tool", "tool_call_id": "call_a", "name": "web_fetch", "content": html, "is_error": False},
    )
    push(page, {"role": "assistant", "content": None})
    push(
        page,
        {
            "tool_calls": [
                {**call, "index": 1, "id": "call_b", "function": {"name": "web_fetch", "arguments": "{}"}}
            ]
        },
    )
    push(
        page,
        {
            "role": "tool",
            "tool_call_id": "call_b",
            "name": "web_fetch",
            "content": "Error: no",
            "is_error": True,
        },
    )
    push(page, {"role": "assistant", "content": None})
    push(page, {"content": "Found it."})
    push(page, {}, finish_reason="stop")
    push(page)
    wait_status(page, "done")
    blocks = answer(page).get_by_role("group", name="Tool call web_fetch")
    expect(blocks).to_have_count(2)
    blocks.first.locator("summary").click()
    expect(blocks.first.locator(".tool-result")).to_have_text(html)
    expect(blocks.first.locator(".tool-text").first).to_have_text('{\n  "url": "<b>x</b>"\n}')
    expect(blocks.nth(1).locator(".tool-state")).to_have_text("Error")
    assert page.locator("#thread img, #thread script, #thread b").count() == 0
    assert page.evaluate("() => window.pwned") is None
    tools = last_message(page)["tools"]
    assert [(c["round"], c["result"]) for c in tools] == [(0, html), (1, "Error: no")]
    context.close()
    assert errors.unexpected(LOAD_ERRORS) == []
