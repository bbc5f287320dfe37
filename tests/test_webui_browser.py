"""The web UI end to end: real headless Chromium against a real server with SmolLM2.

Everything is done through the page as a person would (the accessible names the issue lists); the page's
own state (`window.llamba`) is read only to compare texts byte for byte.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server_process import LIVENESS_S, REPO, ServerProcess, wait_until
from tests.webui_browser import (  # noqa: F401
    DESKTOP,
    LOAD_ERRORS,
    PHONE,
    PageErrors,
    app_page,
    artifact,
    browser,
    open_app,
)

LONG_STORY = "Tell me a very long story about dragons."


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", "smollm2", "-c", "2048", "-np", "2").wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture
def page(browser: Any, srv: ServerProcess) -> Iterator[Any]:  # noqa: F811
    with app_page(browser, srv.base_url, LOAD_ERRORS) as tab:
        yield tab


def settings(page: Any, **fields: str) -> None:
    """Fill the Settings dialog by label ("Temperature", "Max tokens", "System prompt", "Theme", ...)."""
    page.get_by_role("button", name="Settings", exact=True).click()
    dialog = page.get_by_role("dialog", name="Settings")
    for label, value in fields.items():
        field = dialog.get_by_label(label.replace("_", " "), exact=True)
        if label == "Theme":
            field.select_option(value)
        else:
            field.fill(value)
    dialog.get_by_role("button", name="Save").click()


def shoot(page: Any, name: str) -> None:
    """A screenshot for people to look at: no toasts in the way, transitions settled."""
    page.evaluate("() => document.querySelectorAll('.toast').forEach((t) => t.remove())")
    page.wait_for_timeout(350)
    page.screenshot(path=artifact(name))


def send(page: Any, text: str) -> None:
    page.get_by_role("textbox", name="Message").fill(text)
    page.get_by_role("button", name="Send").click()


def answer(page: Any) -> Any:
    return page.locator("article.msg.assistant").last


def wait_status(page: Any, status: str, timeout: float = 90) -> None:
    from playwright.sync_api import expect

    try:
        expect(answer(page)).to_have_attribute("data-status", status, timeout=timeout * 1000)
    except AssertionError as exc:
        state = page.evaluate("() => JSON.stringify(window.llamba.current?.messages.at(-1))")
        raise AssertionError(f"{exc}\nthe message in the page: {state}") from None


def last_message(page: Any) -> dict[str, Any]:
    return page.evaluate("() => JSON.parse(JSON.stringify(window.llamba.current.messages.at(-1)))")


def wait_content(page: Any, n_chars: int, timeout: float = 60) -> str:
    page.wait_for_function(
        "n => (window.llamba.current?.messages.at(-1)?.content || '').length >= n",
        arg=n_chars,
        timeout=timeout * 1000,
    )
    return last_message(page)["content"]


STORED_ANSWER = """async () => {
    const db = await new Promise((ok, fail) => {
        const req = indexedDB.open("llamba");
        req.onsuccess = () => ok(req.result);
        req.onerror = () => fail(req.error);
    });
    const get = db.transaction("conversations").objectStore("conversations").get(window.llamba.current.id);
    const saved = await new Promise((ok) => (get.onsuccess = () => ok(get.result)));
    db.close();
    return saved ? saved.messages.at(-1) : null;
}"""


def wait_saved(page: Any, n_chars: int, timeout: float = 60) -> dict[str, Any]:
    """Until IndexedDB itself (not the page's memory) holds the answer's first `n_chars` and its offset."""
    deadline = time.monotonic() + timeout
    while True:
        stored = page.evaluate(STORED_ANSWER)
        if stored and stored.get("stream", {}).get("offset", 0) > 0 and len(stored["content"]) >= n_chars:
            return stored
        assert time.monotonic() < deadline, f"not saved in {timeout} s: {stored}"
        time.sleep(0.1)


def is_chat_post(request: Any) -> bool:
    return request.method == "POST" and request.url.endswith("/v1/chat/completions")


def chat_posts(page: Any) -> list[dict[str, Any]]:
    """Bodies and headers of the chat requests the page sends, as they are sent."""
    posts: list[dict[str, Any]] = []

    def seen(request: Any) -> None:
        if is_chat_post(request):
            posts.append({"body": request.post_data_json, "headers": request.headers})

    page.on("request", seen)
    return posts


def reference(srv: ServerProcess, body: dict[str, Any]) -> str:
    """What the server answers to the same request, not streamed (temperature 0: the same text)."""
    solo = {**body, "stream": False, "cache_prompt": False}
    reply = httpx.post(srv.base_url + "/v1/chat/completions", json=solo, timeout=120)
    return reply.json()["choices"][0]["message"]["content"]


def busy_slots(srv: ServerProcess) -> int:
    return sum(s["is_processing"] for s in httpx.get(srv.base_url + "/slots").json())


# -- tests ------------------------------------------------------------------------------------------
def test_send_streams_the_answer_with_stats_and_screenshots(page: Any, srv: ServerProcess) -> None:
    from playwright.sync_api import expect

    posts = chat_posts(page)
    shoot(page, "webui-welcome-light.png")
    settings(page, Temperature="0", **{"Max tokens": "120"})
    box = page.get_by_role("textbox", name="Message")
    box.fill("Write a Python function that adds two numbers, in a code block, then explain it briefly.")
    box.press("Enter")  # the keyboard path: Enter sends
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    first = wait_content(page, 1)
    wait_status(page, "done")
    final = last_message(page)
    assert len(final["content"]) > len(first), "the answer arrived in several pieces"
    assert "stream" not in final and final["timings"]["predicted_n"] > 0
    expect(answer(page).locator(".stats")).to_contain_text(f"{final['timings']['predicted_n']} tokens")
    expect(answer(page).locator(".stats")).to_contain_text("tok/s")
    expect(page.get_by_role("button", name="Send")).to_be_visible()
    [post] = posts
    assert post["body"]["stream"] is True and post["body"]["reasoning_control"] is True
    assert post["body"]["temperature"] == 0 and post["body"]["max_tokens"] == 120
    conversation = page.evaluate("() => window.llamba.current.id")
    assert post["headers"]["x-conversation-id"] == f"{conversation}::smollm2"
    assert final["content"] == reference(srv, post["body"])
    code = answer(page).locator(".code-block").first
    if code.count():  # temperature 0 gives one; the copy button puts the code on the clipboard
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=srv.base_url)
        code.get_by_role("button", name="Copy code").click()
        expect(code.locator("button.copy-code")).to_have_attribute("aria-label", "Copied")
        assert page.evaluate("() => navigator.clipboard.readText()") == code.locator("code").text_content()
    shoot(page, "webui-main-light.png")
    settings(page, Theme="dark")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    shoot(page, "webui-main-dark.png")


def test_reload_mid_answer_completes_without_duplicated_text(page: Any, srv: ServerProcess) -> None:
    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "300"})
    send(page, LONG_STORY)
    saved = wait_saved(page, 80)
    assert busy_slots(srv) == 1, "the answer is still being written when the page reloads"
    probes: list[str] = []
    page.on("request", lambda r: "/v1/stream?" in r.url and probes.append(r.url))
    page.reload()
    wait_status(page, "done", timeout=120)
    assert probes and int(probes[0].rsplit("from=", 1)[1]) >= saved["stream"]["offset"], probes
    text = last_message(page)["content"]
    assert text == reference(srv, posts[0]["body"])
    rendered = answer(page).locator(".content").inner_text()
    assert " ".join(rendered.split()) == " ".join(text.split()), "the page shows the text once, as stored"


def test_resume_shows_loading_on_503_and_retries_every_2_seconds(page: Any, srv: ServerProcess) -> None:
    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "200"})
    send(page, LONG_STORY)
    wait_content(page, 40)
    probes: list[float] = []

    # The one scripted reply of this test: a real server answers 503 "Loading model" only while it loads
    # its model at start-up, when no stream of this page can exist yet. Every later probe reaches the
    # real server and resumes the real stream.

    def loading_once(route: Any) -> None:
        probes.append(time.monotonic())
        if len(probes) == 1:
            route.fulfill(status=503, json={"error": {"code": 503, "message": "Loading model"}})
        else:
            route.continue_()

    page.route("**/v1/stream?*", loading_once)
    page.reload()
    from playwright.sync_api import expect

    expect(answer(page).locator(".status")).to_have_text("Server loading…")
    wait_status(page, "done", timeout=120)
    # A lower bound on the page's retry interval (it waits 2 s after a 503), behaviour, not a speed check.
    assert len(probes) >= 2 and probes[1] - probes[0] >= 1.9
    assert last_message(page)["content"] == reference(srv, posts[0]["body"])


def test_resume_of_an_expired_stream_keeps_the_partial_text(page: Any) -> None:
    from playwright.sync_api import expect

    page.evaluate(
        """() => {
        const now = Date.now();
        const stream = {key: "gone::smollm2", offset: 321, completionId: null};
        return window.llamba.store.put({id: "gone", title: "Expired stream", createdAt: now, updatedAt: now,
          messages: [{id: "u1", role: "user", content: "Hi", createdAt: now},
                     {id: "a1", role: "assistant", content: "Half an ans", status: "streaming",
                      createdAt: now, stream}]});
    }"""
    )
    page.goto("/#/c/gone")
    page.reload()  # a fresh start finds the saved stream and probes it
    expect(answer(page).locator(".status")).to_have_text("Lost: partial answer kept")
    expect(answer(page).locator(".content")).to_have_text("Half an ans")
    stored = page.evaluate("() => window.llamba.store.get('gone').messages[1]")
    assert stored["status"] == "lost" and "stream" not in stored


def test_stop_frees_the_slot_and_keeps_the_partial_answer(page: Any, srv: ServerProcess) -> None:
    from playwright.sync_api import expect

    settings(page, Temperature="0", **{"Max tokens": "900"})  # greedy: a sampled story may end too soon
    requests: list[Any] = []
    ended: list[Any] = []  # finished or failed: an aborted stream fails, one the server closed first finishes
    page.on("request", lambda request: requests.append(request))
    page.on("requestfinished", lambda request: ended.append(request))
    page.on("requestfailed", lambda request: ended.append(request))
    send(page, LONG_STORY)
    wait_content(page, 30)
    [slot] = [s["id"] for s in httpx.get(srv.base_url + "/slots").json() if s["is_processing"]]
    page.get_by_role("button", name="Stop").click()
    wait_status(page, "stopped", timeout=LIVENESS_S)
    # Liveness bound, not a speed check: the DELETE ends the generation at its next step.
    wait_until(lambda: busy_slots(srv) == 0, LIVENESS_S, "slot freed after Stop")
    # Cut short, not run to its end within the bound: the slot holds the 39 prompt tokens and those
    # generated before Stop, where the whole answer would leave 938 (900 tokens; the last is not cached).
    assert httpx.get(srv.base_url + "/slots").json()[slot]["n_cached"] < 900
    kept = last_message(page)["content"]
    assert kept and "stream" not in last_message(page)
    # The event after which nothing can arrive: the chat request's end (Stop aborts it). A page that
    # read on would show more text here; one that resumed would have asked GET /v1/stream.
    # (Response.finished() waits for a finish only: it never returns when Stop's abort wins the race with
    # the server's last event, and the run hung there for its 600 s twice.)
    [post] = [r for r in requests if is_chat_post(r)]
    deadline = time.monotonic() + LIVENESS_S
    while post not in ended:
        assert time.monotonic() < deadline, "the browser reports the chat request's end after Stop"
        page.wait_for_timeout(100)  # lets Playwright deliver the request's events
    assert last_message(page)["content"] == kept, "nothing more arrives after Stop"
    assert [r.url for r in requests if r.method == "GET" and "/v1/stream?" in r.url] == [], "no resume"
    expect(answer(page).locator(".status")).to_have_text("Stopped")
    expect(page.get_by_role("button", name="Send")).to_be_visible()


def test_a_reply_with_script_and_html_is_shown_as_text(page: Any) -> None:
    """Few-shot the model into echoing markup (an imported history), then check nothing of it runs."""
    from playwright.sync_api import expect

    history = {
        "format": "llamba.conversations",
        "version": 1,
        "conversations": [
            {
                "id": "echo",
                "title": "Echo <b>bot</b>",
                "createdAt": 1,
                "updatedAt": 1,
                "messages": [
                    {"role": "user", "content": "Hello <b>world</b>"},
                    {"role": "assistant", "content": "Hello <b>world</b>"},
                    {"role": "user", "content": "Good <i>day</i> to you"},
                    {
                        "role": "assistant",
                        "content": "Good <i>day</i> to you <img src=x onerror=window.pwned=2>",
                    },
                ],
            }
        ],
    }
    import_json(page, history)
    page.get_by_role("button", name="Echo <b>bot</b>", exact=True).click()
    settings(page, Temperature="0", **{"System prompt": "You repeat the user message exactly, nothing else."})
    send(page, "Careful <script>window.pwned=1</script> now")
    wait_status(page, "done")
    reply = last_message(page)["content"]
    assert "<script>window.pwned=1</script>" in reply, f"the model did not echo: {reply!r}"
    expect(answer(page).locator(".content")).to_contain_text("<script>window.pwned=1</script>")
    assert page.locator("#thread script, #thread img, #thread b, #thread i").count() == 0
    assert page.evaluate("() => window.pwned") is None
    expect(page.locator("article.msg.assistant").nth(1)).to_contain_text("<img src=x onerror=window.pwned=2>")


def import_json(page: Any, data: dict[str, Any]) -> None:
    path = artifact("import-test.json")
    path.write_text(json.dumps(data))
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Import").click()
    chooser.value.set_files(str(path))
    from playwright.sync_api import expect

    expect(page.locator(".toast").last).to_contain_text("Imported")


def test_markdown_renderer_escapes_everything_it_does_not_build(page: Any) -> None:
    html = page.evaluate(
        """async () => {
        const { renderMarkdown } = await import("/assets/js/markdown.js");
        const box = document.createElement("div");
        box.append(renderMarkdown([
          "# Title <script>window.pwned=1</script>",
          "Some **bold**, *em*, `code <b>`, ~~gone~~ and [a link](https://example.com/x).",
          "[bad](javascript:window.pwned=3) <img src=x onerror=window.pwned=4> <iframe src=//x></iframe>",
          "",
          "- one",
          "  - nested",
          "- two",
          "",
          "1. first",
          "",
          "2. second",
          "",
          "| a | b |",
          "|---|--:|",
          "| <u>x</u> | 2 |",
          "",
          "```html",
          "<script>window.pwned=5</script>",
          "```",
          "> quoted <svg onload=window.pwned=6>",
        ].join("\\n")));
        document.body.append(box);
        const built = [...box.querySelectorAll("*")].filter((e) => !e.closest("button"));  // not our icons
        const tags = built.map((e) => e.tagName.toLowerCase());
        const attrs = built.flatMap((e) => [...e.attributes].map((a) => a.name));
        const result = { tags: [...new Set(tags)].sort(), attrs: [...new Set(attrs)].sort(),
          hrefs: [...box.querySelectorAll("a")].map((a) => a.getAttribute("href")),
          text: box.textContent, lists: box.querySelectorAll("ol").length,
          copy: box.querySelectorAll("button.copy-code").length };
        box.remove();
        return result;
    }"""
    )
    assert not {"script", "img", "iframe", "svg", "u", "b"} & set(html["tags"])
    assert not [a for a in html["attrs"] if a.startswith("on") or a == "src"]
    assert html["hrefs"] == ["https://example.com/x"]
    for shown in (
        "<script>window.pwned=1</script>",
        "<img src=x onerror=window.pwned=4>",
        "<u>x</u>",
        "<svg",
    ):
        assert shown in html["text"]
    assert {"h1", "strong", "em", "code", "del", "a", "ul", "ol", "li", "table", "th", "td", "pre"} <= set(
        html["tags"]
    )
    assert html["lists"] == 1 and html["copy"] == 1
    assert page.evaluate("() => window.pwned") is None


def test_conversations_new_rename_search_delete_export_import(page: Any) -> None:
    from playwright.sync_api import expect

    settings(page, **{"Max tokens": "8"})
    send(page, "Name a colour.")
    wait_status(page, "done")
    page.get_by_role("button", name="New chat").click()
    expect(page.get_by_role("heading", name="How can I help you today?")).to_be_visible()
    send(page, "Name a fruit.")
    wait_status(page, "done")
    nav = page.get_by_role("navigation", name="Conversation list")
    expect(nav.get_by_role("listitem")).to_have_count(2)

    nav.get_by_role("button", name="Rename “Name a fruit.”").click()
    title = nav.get_by_role("textbox", name="Conversation title")
    title.fill("Fruit talk")
    title.press("Enter")
    expect(nav.get_by_role("button", name="Fruit talk", exact=True)).to_be_visible()
    expect(page.get_by_role("heading", level=1)).to_have_text("Fruit talk")

    page.get_by_role("searchbox", name="Search conversations").fill("colour")
    expect(nav.get_by_role("listitem")).to_have_count(1)
    page.get_by_role("searchbox", name="Search conversations").fill("")
    expect(nav.get_by_role("listitem")).to_have_count(2)

    with page.expect_download() as download:
        page.get_by_role("button", name="Export").click()
    exported = json.loads(download.value.path().read_text())
    assert exported["format"] == "llamba.conversations"
    assert sorted(c["title"] for c in exported["conversations"]) == ["Fruit talk", "Name a colour."]

    page.on("dialog", lambda d: d.accept())
    nav.get_by_role("button", name="Delete “Fruit talk”").click()
    expect(nav.get_by_role("listitem")).to_have_count(1)
    page.reload()
    expect(nav.get_by_role("listitem")).to_have_count(1)  # the deletion is stored, not just drawn
    import_json(page, exported)
    expect(nav.get_by_role("listitem")).to_have_count(2)
    nav.get_by_role("button", name="Fruit talk", exact=True).click()
    expect(page.locator("article.msg.user")).to_have_text("Name a fruit.")


def test_settings_show_the_server_defaults(page: Any) -> None:
    page.get_by_role("button", name="Settings", exact=True).click()
    dialog = page.get_by_role("dialog", name="Settings")
    props = page.evaluate("() => fetch('/props').then((r) => r.json())")["default_generation_settings"][
        "params"
    ]
    assert float(dialog.get_by_label("Temperature").input_value()) == pytest.approx(props["temperature"])
    assert int(dialog.get_by_label("Top-k").input_value()) == props["top_k"]
    assert float(dialog.get_by_label("Top-p").input_value()) == pytest.approx(props["top_p"])
    assert float(dialog.get_by_label("Min-p").input_value()) == pytest.approx(props["min_p"])
    assert int(dialog.get_by_label("Max tokens").input_value()) == props["n_predict"]
    page.keyboard.press("Escape")
    from playwright.sync_api import expect

    expect(dialog).to_be_hidden()
    assert page.evaluate("() => window.llamba.settings.sampling()") == {}, (
        "defaults are not sent as overrides"
    )


def test_api_key_is_asked_for_and_sent(browser: Any) -> None:  # noqa: F811
    """With --api-key the page still loads (its files are public), asks for the key, then uses it."""
    from playwright.sync_api import expect

    proc = ServerProcess("-m", "smollm2", "-c", "1024", "--api-key", "sekrit").wait_healthy()
    context = browser.new_context(viewport=DESKTOP, base_url=proc.base_url)
    try:
        page = context.new_page()
        errors = PageErrors(page)
        page.goto("/")
        dialog = page.get_by_role("dialog", name="Settings")
        expect(dialog.get_by_role("alert")).to_have_text("This server needs an API key.")
        expect(dialog.get_by_label("API key")).to_be_focused()
        dialog.get_by_label("API key").fill("sekrit")
        dialog.get_by_label("Max tokens").fill("8")
        dialog.get_by_role("button", name="Save").click()
        expect(page.locator("#model-name")).to_contain_text(
            "smollm2"
        )  # the -m name, llama-server's default alias
        posts = chat_posts(page)
        send(page, "Hi")
        wait_status(page, "done")
        assert posts[0]["headers"]["authorization"] == "Bearer sekrit"
        assert errors.unexpected(LOAD_ERRORS) == []
    finally:
        context.close()
        proc.stop()


def test_keyboard_only_and_phone_layout(browser: Any, srv: ServerProcess) -> None:  # noqa: F811
    from playwright.sync_api import expect

    context = browser.new_context(viewport=PHONE, base_url=srv.base_url, has_touch=True, is_mobile=True)
    page = context.new_page()
    errors = PageErrors(page)
    open_app(page)
    sidebar_toggle = page.get_by_role("button", name="Conversations")
    expect(page.get_by_role("button", name="New chat")).not_to_be_visible()
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], "no sideways scrolling"
    page.keyboard.press("Tab")  # the skip link comes first
    expect(page.get_by_role("link", name="Skip to the message box")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("textbox", name="Message")).to_be_focused()
    page.keyboard.type("Say hi.")
    page.keyboard.press("Enter")
    wait_status(page, "done")
    shoot(page, "webui-phone.png")
    sidebar_toggle.focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("button", name="New chat")).to_be_focused()
    shoot(page, "webui-phone-sidebar.png")
    page.keyboard.press("Escape")
    expect(page.get_by_role("button", name="New chat")).not_to_be_visible()
    expect(sidebar_toggle).to_be_focused()
    context.close()
    assert errors.unexpected(LOAD_ERRORS) == []


# -- reasoning ----------------------------------------------------------------------------------------
THINK_TEMPLATE = REPO / "tests" / "templates" / "chatml-think.jinja"

# Replaces the page's fetch for the chat POST only by a stream the test writes, chunk by chunk; every other
# request (the control call included) goes to the real server. Why a scripted stream: SmolLM2 does not
# reason by itself, and the test needs exact reasoning text, a known completion id and fixed timings to
# check what the page shows. test_skip_thinking_with_the_reasoning_template is the same path unscripted.
SCRIPTED_FETCH = """
(() => {
  const s = (window.__scripted = { posts: [], push: null, close: null });
  const realFetch = window.fetch.bind(window);
  window.fetch = (input, init = {}) => {
    const url = typeof input === "string" ? input : input.url;
    if (url.endsWith("/v1/chat/completions") && init.method === "POST") {
      s.posts.push(JSON.parse(init.body));
      const encoder = new TextEncoder();
      const body = new ReadableStream({
        start(controller) {
          s.push = (text) => controller.enqueue(encoder.encode(text));
          s.close = () => controller.close();
        },
      });
      return Promise.resolve(new Response(body, { headers: { "Content-Type": "text/event-stream" } }));
    }
    return realFetch(input, init);
  };
})();
"""


def push(page: Any, delta: dict[str, Any] | None = None, **extra: Any) -> None:
    """One chat.completion.chunk into the scripted stream (or [DONE] when delta is None and no extra)."""
    if delta is None and not extra:
        text = "data: [DONE]\n\n"
    else:
        choice = {"index": 0, "finish_reason": extra.pop("finish_reason", None), "delta": delta or {}}
        chunk = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "choices": [choice], **extra}
        text = "data: " + json.dumps(chunk) + "\n\n"
    # The page calls fetch a moment after Send: wait until the scripted stream exists.
    page.wait_for_function("() => typeof window.__scripted.push === 'function'")
    page.evaluate("(t) => window.__scripted.push(t)", text)


def test_thinking_block_and_skip_thinking_on_a_scripted_stream(browser: Any, srv: ServerProcess) -> None:  # noqa: F811
    """The client's side of reasoning, whatever the model: reasoning_content streams into the thinking block,
    Skip thinking shows only while reasoning and posts reasoning_end with the completion id."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport=DESKTOP, base_url=srv.base_url)
    context.add_init_script(SCRIPTED_FETCH)
    page = context.new_page()
    errors = PageErrors(page)
    open_app(page)
    send(page, "Which city is the capital of France, and why?")
    skip = page.get_by_role("button", name="Skip thinking")
    push(page, {"role": "assistant", "content": None})
    expect(skip).to_be_hidden()
    thoughts = [
        "The user asks for the capital of France. ",
        "Paris has been the seat of government since the 10th century, ",
        "it hosts the parliament, the presidency and most ministries. ",
        "So the answer is Paris; I should say why in a sentence or two.",
    ]
    for piece in thoughts:
        push(page, {"reasoning_content": piece})
    block = answer(page).locator("details.thinking")
    expect(block).to_have_attribute("open", "")
    expect(block.locator("summary")).to_have_text("Thinking…")
    expect(block.locator(".thinking-body")).to_have_text("".join(thoughts))
    expect(skip).to_be_visible()
    shoot(page, "webui-reasoning-live.png")
    with page.expect_response("**/v1/chat/completions/control") as control:
        skip.click()
    expect(skip).to_be_hidden()
    assert control.value.request.post_data_json == {"id": "chatcmpl-scripted", "action": "reasoning_end"}
    # The real server took the call and looked the id up: no generation of its own has that id.
    reply = control.value.json()
    assert control.value.status == 200 and reply["success"] is False, reply
    assert "chatcmpl-scripted" in reply["message"]
    for piece in [
        "The capital of France is **Paris**. ",
        "It is the seat of the government ",
        "and the largest city.",
    ]:
        push(page, {"content": piece})
    timings = {
        "prompt_n": 31,
        "prompt_ms": 58.2,
        "cache_n": 0,
        "predicted_n": 64,
        "predicted_per_second": 71.5,
    }
    push(page, {}, finish_reason="stop", timings=timings)
    push(page)
    wait_status(page, "done")
    expect(block.locator("summary")).to_contain_text("Thought for")
    expect(block).not_to_have_attribute("open", "")
    expect(answer(page).locator(".content strong")).to_have_text("Paris")
    expect(answer(page).locator(".stats")).to_have_text("64 tokens · 71.5 tok/s · 58 ms to first token")
    [body] = page.evaluate("() => window.__scripted.posts")
    assert body["reasoning_control"] is True and body["stream"] is True
    block.locator("summary").click()  # the thinking stays readable after the answer
    expect(block).to_have_attribute("open", "")
    shoot(page, "webui-reasoning.png")
    context.close()
    assert errors.unexpected(LOAD_ERRORS) == []


def test_sse_splitter_counts_bytes_across_any_split(page: Any) -> None:
    """Resume offsets are byte counts of whole events: they must hold however the network cuts the stream."""
    result = page.evaluate(
        """async () => {
        const { SseSplitter } = await import("/assets/js/api.js");
        const events = ['data: {"a":"héllo 🐉"}\\n\\n', 'data: {"b":"ü"}\\n\\n', "data: [DONE]\\n\\n"];
        const bytes = new TextEncoder().encode(events.join(""));
        const out = [];
        for (let cut = 1; cut < bytes.length; cut += 1) {
          const splitter = new SseSplitter();
          const got = [...splitter.push(bytes.slice(0, cut)), ...splitter.push(bytes.slice(cut))];
          out.push(JSON.stringify(got));
        }
        const size = (t) => new TextEncoder().encode(t).length;
        const expected = JSON.stringify(events.map((t) => ({ text: t, bytes: size(t) })));
        return { same: out.every((o) => o === expected), total: bytes.length };
    }"""
    )
    assert result["same"], "every split point gives the same events and byte counts"


def test_skip_thinking_with_the_reasoning_template(browser: Any) -> None:  # noqa: F811
    """The real thing: SmolLM2 under a thinking chat template; Skip thinking ends the thinking block."""
    from playwright.sync_api import expect

    proc = ServerProcess(
        "-m", "smollm2", "-c", "2048", "-np", "2", "--chat-template-file", str(THINK_TEMPLATE)
    )
    context = None
    try:
        proc.wait_healthy()
        context = browser.new_context(viewport=DESKTOP, base_url=proc.base_url)
        page = context.new_page()
        errors = PageErrors(page)
        open_app(page)
        settings(page, Temperature="0", **{"Max tokens": "160"})
        send(page, "Explain step by step how to bake bread at home.")
        skip = page.get_by_role("button", name="Skip thinking")
        expect(skip).to_be_visible(timeout=60_000)
        block = answer(page).locator("details.thinking")
        expect(block.locator("summary")).to_have_text("Thinking…")
        page.wait_for_function("() => window.llamba.current.messages.at(-1).reasoning.length > 60")
        shoot(page, "webui-reasoning-server-live.png")
        with page.expect_response("**/v1/chat/completions/control") as control:
            skip.click()
        assert control.value.json() == {"success": True}, "the server ended the running reasoning"
        expect(skip).to_be_hidden()
        wait_status(page, "done", timeout=120)
        final = last_message(page)
        assert final["reasoning"] and final["content"].strip(), final
        expect(block.locator("summary")).to_contain_text("Thought for")
        block.locator("summary").click()
        shoot(page, "webui-reasoning-server.png")
        assert errors.unexpected(LOAD_ERRORS) == []
    finally:
        if context is not None:
            context.close()
        proc.stop()


def test_the_page_works_under_an_api_prefix(browser: Any) -> None:  # noqa: F811
    """--api-prefix /llm: the page at /llm/ loads its files and talks to the API under the prefix."""
    from playwright.sync_api import expect

    proc = ServerProcess("-m", "smollm2", "-c", "1024", "--api-prefix", "/llm").wait_healthy(
        path="/llm/health"
    )
    context = browser.new_context(viewport=DESKTOP, base_url=proc.base_url)
    try:
        tab = context.new_page()
        errors = PageErrors(tab)
        tab.goto("/llm")  # redirected to /llm/
        expect(tab.locator("#model-name")).to_contain_text(
            "smollm2"
        )  # the -m name, llama-server's default alias
        settings(tab, Temperature="0", **{"Max tokens": "16"})  # greedy: a sampled reply may be empty
        send(tab, "Say hi.")
        wait_status(tab, "done")
        assert last_message(tab)["content"].strip()
        assert errors.unexpected(LOAD_ERRORS) == []
    finally:
        context.close()
        proc.stop()
