"""The web UI's settings, presets, server-side UI defaults and tools with permissions, end to end: real
headless Chromium against a real server with SmolLM2 started with --ui-config-file and a built-in tool
that writes (--tools read_file,write_file).

Deterministic: Temperature 0 and a few tokens; what is checked is the request bodies the page sends
(every field the settings, a preset or custom JSON put there) and what the server did with them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server_process import ServerProcess
from tests.test_webui_browser import (
    LOAD_ERRORS,
    chat_posts,
    import_json,
    last_message,
    open_app,
    send,
    settings,
    wait_status,
)
from tests.webui_browser import DESKTOP, PageErrors, browser  # noqa: F401

UI_CONFIG = {"top_k": 7, "systemMessage": "Be brief.", "typ_p": 0.9}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = tmp_path_factory.mktemp("ui-config") / "ui.json"
    config.write_text(json.dumps(UI_CONFIG))
    proc = ServerProcess(
        "-m", "smollm2", "-c", "2048", "-np", "2",
        "--ui-config-file", str(config), "--tools", "read_file,write_file",
    ).wait_healthy()  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture
def page(browser: Any, srv: ServerProcess, tmp_path: Path) -> Iterator[Any]:  # noqa: F811
    context = browser.new_context(viewport=DESKTOP, base_url=srv.base_url)
    tab = context.new_page()
    # The built-in tools work in the test's own folder (x-tool-cwd), never in the repository.
    tab.route(
        "**/v1/chat/completions",
        lambda route: route.continue_(headers={**route.request.headers, "x-tool-cwd": str(tmp_path)}),
    )
    errors = PageErrors(tab)
    open_app(tab)
    yield tab
    context.close()
    assert errors.unexpected(LOAD_ERRORS) == []


def dialog(page: Any) -> Any:
    return page.get_by_role("dialog", name="Settings")


def test_ui_config_reaches_props(srv: ServerProcess, page: Any) -> None:
    props = page.evaluate("() => fetch('/props').then((r) => r.json())")
    assert props["ui_settings"] == UI_CONFIG


def test_fields_show_the_server_defaults_under_the_ui_config(page: Any) -> None:
    params = page.evaluate("() => fetch('/props').then((r) => r.json())")["default_generation_settings"][
        "params"
    ]
    page.get_by_role("button", name="Settings", exact=True).click()
    form = dialog(page)
    for label, key in [
        ("Temperature", "temperature"),
        ("Top-p", "top_p"),
        ("Min-p", "min_p"),
        ("XTC probability", "xtc_probability"),
        ("XTC threshold", "xtc_threshold"),
        ("Dynatemp range", "dynatemp_range"),
        ("Dynatemp exponent", "dynatemp_exponent"),
        ("Repeat last N", "repeat_last_n"),
        ("Repeat penalty", "repeat_penalty"),
        ("Presence penalty", "presence_penalty"),
        ("Frequency penalty", "frequency_penalty"),
        ("DRY multiplier", "dry_multiplier"),
        ("DRY base", "dry_base"),
        ("DRY allowed length", "dry_allowed_length"),
        ("DRY penalty last N", "dry_penalty_last_n"),
        ("Max tokens", "n_predict"),
    ]:
        assert float(form.get_by_label(label, exact=True).input_value()) == pytest.approx(params[key]), label
    assert form.get_by_label("Samplers", exact=True).input_value() == ";".join(params["samplers"])
    assert form.get_by_label("Seed", exact=True).input_value() == "-1"  # /props' 4294967295
    # the server's UI config over the server's sampling defaults (llama.cpp's UI names: systemMessage, typ_p)
    assert form.get_by_label("Top-k", exact=True).input_value() == "7"
    assert form.get_by_label("Typical-p", exact=True).input_value() == "0.9"
    assert form.get_by_label("System prompt", exact=True).input_value() == "Be brief."
    page.keyboard.press("Escape")
    # left alone, only what the UI config changed is sent; the server's own defaults are not
    assert page.evaluate("() => window.llamba.settings.sampling()") == {"top_k": 7, "typical_p": 0.9}


def test_a_changed_field_and_custom_json_reach_the_request(page: Any) -> None:
    from playwright.sync_api import expect

    page.get_by_role("button", name="Settings", exact=True).click()
    custom = dialog(page).get_by_label("Custom JSON", exact=True)
    custom.fill("{not json")
    dialog(page).get_by_role("button", name="Save").click()
    expect(dialog(page)).to_be_visible()  # refused in the form
    assert custom.evaluate("(el) => el.validity.valid") is False
    custom.fill("[1, 2]")
    assert custom.evaluate("(el) => el.validity.valid") is False  # an object only
    custom.fill('{"mirostat": 0, "n_probs": 1}')
    dialog(page).get_by_label("Repeat penalty", exact=True).fill("1.3")
    dialog(page).get_by_role("button", name="Save").click()
    expect(dialog(page)).to_be_hidden()

    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "8", "Top-k": "7"})
    send(page, "Name a colour.")
    wait_status(page, "done")
    body = posts[0]["body"]
    assert body["temperature"] == 0 and body["max_tokens"] == 8 and body["repeat_penalty"] == 1.3
    assert body["mirostat"] == 0 and body["n_probs"] == 1
    assert body["top_k"] == 7 and body["typical_p"] == 0.9  # the UI config's
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert "top_p" not in body and "dry_base" not in body  # untouched: the server's default applies
    assert body["stream"] is True


def test_a_preset_is_picked_per_conversation_and_survives_reload_and_export(page: Any) -> None:
    from playwright.sync_api import expect

    settings(page, Temperature="0", **{"Max tokens": "6"})
    page.get_by_role("button", name="Settings", exact=True).click()
    form = dialog(page)
    form.get_by_label("Top-p", exact=True).fill("0.5")
    form.get_by_label("Max tokens", exact=True).fill("4")
    form.get_by_label("System prompt", exact=True).fill("You answer in French.")
    form.get_by_label("Preset name").fill("Tight")
    form.get_by_role("button", name="Add preset").click()
    form.get_by_role("button", name="Cancel").click()  # the settings themselves stay as they were

    picker = page.get_by_role("combobox", name="Preset for this conversation")
    picker.select_option("Tight")
    posts = chat_posts(page)
    send(page, "Name a fruit.")
    wait_status(page, "done")
    body = posts[0]["body"]
    assert body["top_p"] == 0.5 and body["max_tokens"] == 4 and body["temperature"] == 0
    assert body["messages"][0] == {"role": "system", "content": "You answer in French."}
    conversation_id = page.evaluate("() => window.llamba.current.id")

    page.get_by_role("button", name="New chat").click()
    expect(picker).to_have_value("")  # a new chat: the default settings
    send(page, "Name a fruit.")
    wait_status(page, "done")
    assert "top_p" not in posts[1]["body"] and posts[1]["body"]["max_tokens"] == 6

    page.goto(f"/#/c/{conversation_id}")
    page.reload()
    expect(picker).to_have_value("Tight")  # stored with the conversation
    with page.expect_download() as download:
        page.get_by_role("button", name="Export").click()
    exported = json.loads(download.value.path().read_text())
    [saved] = [c for c in exported["conversations"] if c["id"] == conversation_id]
    assert saved["preset"]["name"] == "Tight" and saved["preset"]["values"]["top_p"] == 0.5

    page.on("dialog", lambda d: d.accept())
    nav = page.get_by_role("navigation", name="Conversation list")
    for _ in range(2):
        nav.get_by_role("button", name="Delete “Name a fruit.”").first.click()
    expect(nav.get_by_role("listitem")).to_have_count(0)
    page.evaluate("() => localStorage.removeItem('llamba.presets')")  # a browser that never saw it
    page.reload()
    import_json(page, exported)
    page.goto(f"/#/c/{conversation_id}")
    expect(picker).to_have_value("Tight")
    posts.clear()
    send(page, "Name a colour.")
    wait_status(page, "done")
    assert posts[0]["body"]["top_p"] == 0.5 and posts[0]["body"]["max_tokens"] == 4


def test_tools_switches_and_the_permission_prompt_before_a_write(page: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    forced = {"tool_choice": {"type": "function", "function": {"name": "write_file"}}}
    settings(
        page,
        Temperature="0",
        **{"Max tokens": "120", "Max tool rounds": "1", "Custom JSON": json.dumps(forced)},
    )
    page.get_by_role("button", name="Tools", exact=True).click()
    panel = page.get_by_role("group", name="MCP servers for this conversation")
    panel.get_by_role("checkbox", name="builtin", exact=True).check()
    read = panel.get_by_role("checkbox", name="read_file", exact=True)
    expect(read).to_be_checked()
    read.uncheck()
    expect(panel.get_by_text("writes", exact=True)).to_have_count(1)  # write_file asks before it runs

    posts = chat_posts(page)
    send(page, "Write the word hello to the file notes.txt.")
    wait_status(page, "done", timeout=180)
    body = posts[0]["body"]
    assert body["tools"] == [{"type": "mcp", "server_label": "builtin", "allowed_tools": ["write_file"]}]
    assert body["approved_tools"] == []
    [call] = last_message(page)["tools"]
    assert call["name"] == "write_file" and call["isError"] is True
    assert "not approved" in call["result"]
    assert list(tmp_path.iterdir()) == []  # the tool did not run

    prompt = page.get_by_role("dialog", name="Allow write_file?")
    expect(prompt).to_be_visible()
    expect(prompt).to_contain_text("It was not run")
    prompt.get_by_role("button", name="Allow for this conversation").click()
    expect(prompt).to_be_hidden()
    page.wait_for_function(
        "() => window.llamba.chat.runs.size === 0 && window.llamba.current.messages.length === 3"
    )
    wait_status(page, "done", timeout=180)
    assert posts[1]["body"]["approved_tools"] == ["write_file"]
    [again] = last_message(page)["tools"]
    assert again["name"] == "write_file" and "not approved" not in again["result"]
    stored = page.evaluate("() => window.llamba.current.approvedTools")
    assert stored == ["write_file"]
    expect(page.get_by_role("dialog", name="Allow write_file?")).to_be_hidden()
