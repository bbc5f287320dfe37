"""The web UI in router mode, in real headless Chromium against a real router and real children: the model
picker, the load progress bar, a chat on the picked model, and a reload while that model loads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess, wait_until
from tests.test_router_server import SMOL_PRESET, models, status, write_preset
from tests.test_webui_browser import (
    chat_posts,
    is_chat_post,
    last_message,
    reference,
    send,
    settings,
    wait_status,
)
from tests.webui_browser import DESKTOP, PageErrors, browser  # noqa: F401

LOAD_ERRORS = "Failed to load resource"  # the 503s of a resume during a load are expected


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    preset = write_preset(Path(tmp_path_factory.mktemp("router")), SMOL_PRESET)
    proc = ServerProcess("--models-preset", str(preset), "--models-max", "2").wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture
def page(browser: Any, router: ServerProcess) -> Iterator[Any]:  # noqa: F811
    from playwright.sync_api import expect

    context = browser.new_context(viewport=DESKTOP, base_url=router.base_url)
    tab = context.new_page()
    errors = PageErrors(tab)
    tab.goto("/")
    expect(tab.get_by_role("combobox", name="Model")).to_be_visible(timeout=240_000)
    yield tab
    context.close()
    assert errors.unexpected(LOAD_ERRORS) == []


def test_pick_a_model_see_its_progress_and_chat(page: Any, router: ServerProcess) -> None:
    from playwright.sync_api import expect

    picker = page.get_by_role("combobox", name="Model")
    assert {"smol-a", "smol-b", "smollm2", "gemma3"} <= set(picker.locator("option").all_inner_texts())
    progress = page.locator("#model-progress")
    picker.select_option("smol-b")
    expect(progress).to_be_visible(timeout=30_000)  # loading: the bar and the stage
    expect(page.locator("#model-stage")).to_contain_text("Loading smol-b")
    expect(progress).to_be_hidden(timeout=240_000)
    assert status(router, "smol-b") == "loaded"
    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "24"})
    send(page, "Say hello")
    wait_status(page, "done", timeout=120)
    assert posts[0]["body"]["model"] == "smol-b"
    assert last_message(page)["content"] == reference(router, posts[0]["body"])


def test_reload_during_a_load_gets_the_whole_answer(page: Any, router: ServerProcess) -> None:
    posts = chat_posts(page)
    if status(router, "smol-c") != "unloaded":
        httpx.post(router.base_url + "/models/unload", json={"model": "smol-c"}, timeout=60)
    page.get_by_role("combobox", name="Model").select_option("smol-c")
    settings(page, Temperature="0", **{"Max tokens": "32"})
    # Playwright's sync API hands page events over only inside its own calls: a bare poll of `posts`
    # never saw a request sent after `send` returned (CI failed so once)
    with page.expect_request(is_chat_post, timeout=30_000):
        send(page, "Tell me about dragons.")
    # the picker's load and the chat both wait for the model (one load for both; it may first wait for
    # room: the page's GET /tools went to the default model, which took the second place)
    wait_until(lambda: models(router)["smol-c"]["queued"] == 2, 30, "the chat waits for its model")
    assert status(router, "smol-c") in ("unloaded", "loading")
    page.reload()  # while the model still loads: the resume answers 503 until the child has the chat
    wait_status(page, "done", timeout=240)
    assert posts and posts[0]["body"]["model"] == "smol-c"
    assert last_message(page)["content"] == reference(router, posts[0]["body"])
