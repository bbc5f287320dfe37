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
    send,
    settings,
    wait_status,
)
from tests.webui_browser import app_page, browser  # noqa: F401

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
    with app_page(browser, srv.base_url, LOAD_ERRORS, tool_cwd=tmp_path) as tab:  # the test's own folder
        yield tab


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


def test_a_preset_is_deleted_in_settings(page: Any) -> None:
    from playwright.sync_api import expect

    page.get_by_role("button", name="Settings", exact=True).click()
    form = dialog(page)
    saved = form.get_by_role("list", name="Saved presets")
    expect(saved).to_be_hidden()  # none yet
    for name, top_p in (("Gone", "0.4"), ("Kept", "0.6")):
        form.get_by_label("Top-p", exact=True).fill(top_p)
        form.get_by_label("Preset name").fill(name)
        form.get_by_role("button", name="Add preset").click()
    expect(saved.get_by_role("listitem")).to_have_count(2)
    picker = page.get_by_role("combobox", name="Preset for this conversation")
    expect(picker.locator("option")).to_have_text(["Default settings", "Gone", "Kept"])

    form.get_by_role("button", name="Delete preset “Gone”").click()
    expect(saved.get_by_role("listitem")).to_have_count(1)
    expect(saved.get_by_role("button", name="Delete preset “Kept”")).to_be_visible()
    expect(picker.locator("option")).to_have_text(["Default settings", "Kept"])
    form.get_by_role("button", name="Cancel").click()
    stored = page.evaluate("() => JSON.parse(localStorage.getItem('llamba.presets'))")
    assert [p["name"] for p in stored] == ["Kept"] and stored[0]["values"]["top_p"] == 0.6

    page.reload()
    expect(picker.locator("option")).to_have_text(["Default settings", "Kept"])
    page.get_by_role("button", name="Settings", exact=True).click()
    dialog(page).get_by_role("button", name="Delete preset “Kept”").click()
    expect(dialog(page).get_by_role("list", name="Saved presets")).to_be_hidden()
    expect(page.locator("#preset-pick")).to_be_hidden()  # no preset left to pick


def ask_for_a_write(page: Any) -> list[dict[str, Any]]:
    """Switch on the built-in write_file alone, force its call (Custom JSON's tool_choice; one round),
    and send; returns the chat requests the page sends from then on."""
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
    return posts


def paused_prompt(page: Any, posts: list[dict[str, Any]], tmp_path: Path) -> Any:
    """The answer paused before the write: the prompt shows the call's arguments; nothing is written."""
    from playwright.sync_api import expect

    prompt = page.get_by_role("dialog", name="Allow write_file?")
    expect(prompt).to_be_visible(timeout=180_000)
    body = posts[0]["body"]
    assert body["tools"] == [{"type": "mcp", "server_label": "builtin", "allowed_tools": ["write_file"]}]
    assert body["approved_tools"] == []
    message = last_message(page)
    assert message["pendingApproval"] == ["write_file"] and message["finishReason"] == "tool_calls"
    [call] = message["tools"]
    assert call["name"] == "write_file" and call["waiting"] is True and "result" not in call
    expect(prompt).to_contain_text("It has not run")
    assert json.loads(prompt.locator("pre").inner_text()) == json.loads(call["arguments"])  # the call's
    expect(page.get_by_text("Waits for your approval")).to_be_visible()
    assert list(tmp_path.iterdir()) == []  # the prompt is up before the write
    return prompt


# The paused answer went on and ended: not waiting any more, done, with its own finish reason.
RESUMED = """() => {
    const m = window.llamba.current.messages.at(-1);
    return window.llamba.chat.runs.size === 0 && !m.pendingApproval && m.status === "done" &&
        Boolean(m.finishReason) && m.finishReason !== "tool_calls";
}"""


def wait_resumed(page: Any) -> None:
    page.wait_for_function(RESUMED, timeout=180_000)
    wait_status(page, "done")


def test_the_permission_prompt_comes_before_a_write_and_allow_runs_it(page: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    posts = ask_for_a_write(page)
    prompt = paused_prompt(page, posts, tmp_path)
    prompt.get_by_role("button", name="Allow for this conversation").click()
    expect(prompt).to_be_hidden()
    wait_resumed(page)
    assert len(posts) == 2
    resumed = posts[1]["body"]
    assert resumed["approved_tools"] == ["write_file"]
    assert resumed["messages"][-1]["role"] == "assistant"  # the paused call, which the server now runs
    assert resumed["messages"][-1]["tool_calls"][0]["function"]["name"] == "write_file"
    written = list(tmp_path.rglob("*"))
    assert [f for f in written if f.is_file()], "the allowed write did not run"
    message = last_message(page)
    assert page.evaluate("() => window.llamba.current.messages.length") == 2  # the same answer went on
    assert message["tools"][0]["isError"] is False and "pendingApproval" not in message
    assert page.evaluate("() => window.llamba.current.approvedTools") == ["write_file"]
    expect(page.get_by_role("dialog", name="Allow write_file?")).to_be_hidden()


def test_deny_answers_the_call_and_the_model_goes_on_without_writing(page: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    posts = ask_for_a_write(page)
    prompt = paused_prompt(page, posts, tmp_path)
    prompt.get_by_role("button", name="Deny").click()
    expect(prompt).to_be_hidden()
    wait_resumed(page)
    resumed = posts[1]["body"]
    assert resumed["approved_tools"] == []
    assert resumed["messages"][-1]["role"] == "tool"
    assert resumed["messages"][-1]["content"] == "The user denied running write_file."
    message = last_message(page)
    assert message["tools"][0]["isError"] is True and message["content"]  # the answer went on
    assert message["finishReason"] in ("stop", "length") and "pendingApproval" not in message
    assert list(tmp_path.iterdir()) == []
    assert page.evaluate("() => window.llamba.current.approvedTools || []") == []
