"""The web UI's message tree, file attachments and numbers end to end: real headless Chromium against a
real server with SmolLM2, greedy (Temperature 0) and short answers.

Edit and Regenerate make versions (siblings in the tree) that `< 1/2 >` switches between, stored in
IndexedDB and carried by an export; the request of a branch holds that branch alone (watched with
page.on("request")); Continue writes on from a cut answer; text files, PDFs (their text read by the
vendored pdf.js) and long pastes reach the prompt as text; each answer shows its speed and time to first
token, the composer the context used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess
from tests.test_webui_browser import (
    LOAD_ERRORS,
    answer,
    chat_posts,
    import_json,
    last_message,
    open_app,
    send,
    settings,
    wait_status,
)
from tests.webui_browser import DESKTOP, PageErrors, app_page, browser  # noqa: F401


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", "smollm2", "-c", "4096", "-np", "2").wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture
def page(browser: Any, srv: ServerProcess) -> Iterator[Any]:  # noqa: F811
    with app_page(browser, srv.base_url, LOAD_ERRORS, accept_dialogs=True) as tab:
        yield tab


def shown(page: Any) -> list[str]:
    """The texts of the shown branch's messages (a user message's bubble, an answer's content)."""
    return page.evaluate(
        """() => [...document.querySelectorAll("article.msg")].map((m) =>
            (m.querySelector(".bubble, .content")?.textContent || "").trim())"""
    )


def user(page: Any, n: int) -> Any:
    return page.locator("article.msg.user").nth(n)


def versions(message: Any) -> Any:
    return message.get_by_role("group", name="Versions")


def conversation(page: Any) -> dict[str, Any]:
    return page.evaluate("() => JSON.parse(JSON.stringify(window.llamba.current))")


# -- the tree -----------------------------------------------------------------------------------------
def test_edit_and_regenerate_make_versions_that_survive_reload_export_and_import(page: Any) -> None:
    from playwright.sync_api import expect

    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "8"})
    send(page, "Name a colour.")
    wait_status(page, "done")
    first_answer = last_message(page)["content"]
    answer(page).get_by_role("button", name="Regenerate").click()
    wait_status(page, "done")
    expect(versions(answer(page))).to_contain_text("2/2")
    assert posts[1]["body"]["messages"] == posts[0]["body"]["messages"]  # the same question again

    question = user(page, 0)
    question.hover()
    question.get_by_role("button", name="Edit message").click()
    page.get_by_role("textbox", name="Edit message text").fill("Name a fruit.")
    page.get_by_role("button", name="Submit edit").click()
    wait_status(page, "done")
    assert [m["content"] for m in posts[2]["body"]["messages"]] == ["Name a fruit."]
    expect(versions(user(page, 0))).to_contain_text("2/2")
    fruit = shown(page)
    assert fruit[0] == "Name a fruit." and len(fruit) == 2

    # < 1/2 >: back to the colour question, with its newest answer (the regenerated one)
    versions(user(page, 0)).get_by_role("button", name="Previous version").click()
    expect(versions(user(page, 0))).to_contain_text("1/2")
    expect(versions(answer(page))).to_contain_text("2/2")
    assert shown(page) == ["Name a colour.", first_answer]
    versions(answer(page)).get_by_role("button", name="Previous version").click()
    expect(versions(answer(page))).to_contain_text("1/2")

    # the next request carries this branch only: the colour question, its first answer, the new one
    send(page, "Another one?")
    wait_status(page, "done")
    sent = posts[3]["body"]["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "Name a colour."),
        ("assistant", first_answer),
        ("user", "Another one?"),
    ]
    branch = shown(page)
    tree = conversation(page)
    assert len(tree["messages"]) == 7 and tree["leaf"] == tree["messages"][-1]["id"]

    page.reload()  # the tree and the branch shown are stored
    expect(page.locator("article.msg")).to_have_count(4)
    assert shown(page) == branch
    expect(versions(user(page, 0))).to_contain_text("1/2")

    with page.expect_download() as download:
        page.get_by_role("button", name="Export").click()
    exported = json.loads(download.value.path().read_text())
    assert exported["version"] == 2
    saved = exported["conversations"][0]
    assert len(saved["messages"]) == 7 and saved["leaf"] == tree["leaf"]
    assert all("parent" in m for m in saved["messages"])
    nav = page.get_by_role("navigation", name="Conversation list")
    nav.get_by_role("button", name="Delete “Name a colour.”").click()
    expect(nav.get_by_role("listitem")).to_have_count(0)
    import_json(page, exported)
    nav.get_by_role("button", name="Name a colour.", exact=True).click()
    expect(page.locator("article.msg")).to_have_count(4)
    assert shown(page) == branch
    versions(user(page, 0)).get_by_role("button", name="Next version").click()
    expect(versions(user(page, 0))).to_contain_text("2/2")
    assert shown(page) == fruit


def test_delete_a_branch_shows_its_sibling(page: Any) -> None:
    from playwright.sync_api import expect

    settings(page, Temperature="0", **{"Max tokens": "4"})
    send(page, "Name a colour.")
    wait_status(page, "done")
    answer(page).get_by_role("button", name="Regenerate").click()
    wait_status(page, "done")
    expect(versions(answer(page))).to_contain_text("2/2")
    kept = conversation(page)["messages"][1]["id"]
    answer(page).get_by_role("button", name="Delete message").click()
    expect(versions(answer(page))).to_be_hidden()  # one version left: no switch
    tree = conversation(page)
    assert [m["id"] for m in tree["messages"]][1:] == [kept] and tree["leaf"] == kept
    page.reload()
    expect(page.locator("article.msg")).to_have_count(2)


def test_continue_extends_an_answer_cut_by_its_length(page: Any) -> None:
    from playwright.sync_api import expect

    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "6"})
    send(page, "Tell me a very long story about dragons.")
    wait_status(page, "done")
    cut = last_message(page)
    assert cut["finishReason"] == "length"
    answer(page).get_by_role("button", name="Continue").click()
    wait_status(page, "done")
    body = posts[1]["body"]
    assert body["continue_final_message"] is True
    assert body["messages"][-1] == {"role": "assistant", "content": cut["content"]}
    longer = last_message(page)
    assert longer["id"] == cut["id"] and longer["content"].startswith(cut["content"])
    assert len(longer["content"]) > len(cut["content"])
    expect(page.locator("article.msg")).to_have_count(2)  # the same answer, written on


def test_old_flat_conversations_import_and_migrate(browser: Any, srv: ServerProcess) -> None:  # noqa: F811
    """An export of version 1 imports as one branch; a version 2 database (no tree) is upgraded."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport=DESKTOP, base_url=srv.base_url)
    page = context.new_page()
    errors = PageErrors(page)
    page.goto("/assets/favicon.svg")  # the origin, before the app opens its database
    flat = {
        "id": "old",
        "title": "Old chat",
        "createdAt": 1,
        "updatedAt": 2,
        "messages": [
            {"id": "u1", "role": "user", "content": "Hi", "createdAt": 1},
            {"id": "a1", "role": "assistant", "content": "Hello!", "createdAt": 1, "status": "done"},
            {"id": "u2", "role": "user", "content": "Bye", "createdAt": 2},
            {"id": "a2", "role": "assistant", "content": "Goodbye!", "createdAt": 2, "status": "done"},
        ],
    }
    page.evaluate(
        """(conversation) => new Promise((ok, fail) => {
        const req = indexedDB.open("llamba", 2);
        req.onupgradeneeded = () => {
            const store = req.result.createObjectStore("conversations", { keyPath: "id" });
            store.createIndex("updatedAt", "updatedAt");
            req.result.createObjectStore("images", { keyPath: "id" });
        };
        req.onsuccess = () => {
            const tx = req.result.transaction("conversations", "readwrite");
            tx.objectStore("conversations").put(conversation);
            tx.oncomplete = () => { req.result.close(); ok(); };
        };
        req.onerror = () => fail(req.error);
    })""",
        flat,
    )
    open_app(page)
    page.goto("/#/c/old")
    expect(page.locator("article.msg")).to_have_count(4)
    assert shown(page) == ["Hi", "Hello!", "Bye", "Goodbye!"]
    stored = page.evaluate(
        """async () => {
        const db = await new Promise((ok) => {
            const req = indexedDB.open("llamba");
            req.onsuccess = () => ok(req.result);
        });
        const get = db.transaction("conversations").objectStore("conversations").get("old");
        const saved = await new Promise((ok) => (get.onsuccess = () => ok(get.result)));
        db.close();
        return { version: db.version, leaf: saved.leaf, parents: saved.messages.map((m) => m.parent) };
    }"""
    )
    assert stored == {"version": 3, "leaf": "a2", "parents": [None, "u1", "a1", "u2"]}

    version1 = {"format": "llamba.conversations", "version": 1, "conversations": [dict(flat, id="v1")]}
    version1["conversations"][0]["title"] = "Version one"
    import_json(page, version1)
    page.get_by_role("navigation", name="Conversation list").get_by_role(
        "button", name="Version one", exact=True
    ).click()
    expect(page.locator("article.msg")).to_have_count(4)
    assert shown(page) == ["Hi", "Hello!", "Bye", "Goodbye!"]
    context.close()
    assert errors.unexpected(LOAD_ERRORS) == []


# -- attachments --------------------------------------------------------------------------------------
def text_parts(post: dict[str, Any]) -> str:
    content = post["body"]["messages"][-1]["content"]
    return (
        "".join(p["text"] for p in content if p["type"] == "text") if isinstance(content, list) else content
    )


def test_a_text_file_reaches_the_prompt(page: Any) -> None:
    from playwright.sync_api import expect

    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "4"})
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Attach files").click()
    code = b"def answer():\n    return 42\n"
    chooser.value.set_files({"name": "answer.py", "mimeType": "text/x-python", "buffer": code})
    expect(page.locator("#composer .file-chip")).to_have_text("answer.py")
    send(page, "What does this return?")
    wait_status(page, "done")
    assert posts[0]["body"]["messages"][-1]["content"] == [
        {"type": "text", "text": "What does this return?"},
        {"type": "text", "text": "\n\n--- File: answer.py ---\n" + code.decode()},
    ]
    expect(user(page, 0).locator(".file-chip")).to_have_text("answer.py")
    page.reload()  # kept with the message, and sent again with the next turn
    send(page, "And why?")
    wait_status(page, "done")
    assert posts[1]["body"]["messages"][0] == posts[0]["body"]["messages"][-1]


def minimal_pdf(text: str) -> bytes:
    """A one-page PDF with `text` in Helvetica, written by hand (its xref offsets counted)."""
    stream = f"BT /F1 18 Tf 40 100 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_a_pdf_s_text_reaches_the_prompt(page: Any) -> None:
    from playwright.sync_api import expect

    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "4"})
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Attach files").click()
    pdf = minimal_pdf("The llama lives in the Andes.")
    chooser.value.set_files({"name": "llama.pdf", "mimeType": "application/pdf", "buffer": pdf})
    page.wait_for_function(  # pdf.js loads on the first PDF: its text, or why not
        "() => document.querySelector('#composer .file-chip')"
        " || !document.querySelector('#attach-notice').hidden",
        timeout=20_000,
    )
    notice = page.locator("#attach-notice")
    assert notice.is_hidden(), notice.text_content()
    expect(page.locator("#composer .file-chip")).to_have_text("llama.pdf")
    send(page, "Where?")
    wait_status(page, "done")
    assert "\n\n--- PDF File: llama.pdf ---\nThe llama lives in the Andes." in text_parts(posts[0])


def test_a_long_paste_becomes_an_attached_text_file(page: Any) -> None:
    from playwright.sync_api import expect

    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "4"})
    log = "".join(f"line {i}: all quiet\n" for i in range(120))  # over 2,000 characters
    assert len(log) > 2000
    short = "a short paste"
    taken = page.evaluate(
        """(texts) => texts.map((text) => {
        const data = new DataTransfer();
        data.setData("text/plain", text);
        const event = new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true });
        document.querySelector("#message").dispatchEvent(event);
        return event.defaultPrevented;
    })""",
        [log, short],
    )
    assert taken == [True, False]  # the short one pastes into the box as usual
    expect(page.locator("#composer .file-chip")).to_have_text("pasted-1.txt")
    assert page.get_by_role("textbox", name="Message").input_value() == ""
    send(page, "Summarise the log.")
    wait_status(page, "done")
    assert text_parts(posts[0]) == "Summarise the log.\n\n--- File: pasted-1.txt ---\n" + log


# -- numbers ------------------------------------------------------------------------------------------
def test_each_answer_shows_its_speed_and_the_composer_the_context_used(page: Any, srv: ServerProcess) -> None:
    from playwright.sync_api import expect

    n_ctx = httpx.get(srv.base_url + "/props").json()["default_generation_settings"]["n_ctx"]
    gauge = page.locator("#context-gauge")
    expect(gauge).to_be_hidden()  # nothing answered yet
    settings(page, Temperature="0", **{"Max tokens": "8"})
    send(page, "Name a colour.")
    wait_status(page, "done")
    t = last_message(page)["timings"]
    stats = answer(page).locator(".stats")
    expect(stats).to_contain_text(f"{t['predicted_n']} tokens")
    expect(stats).to_contain_text(f"{t['predicted_per_second']:.1f} tok/s")
    expect(stats).to_contain_text("to first token")
    used = t["prompt_n"] + t["cache_n"] + t["predicted_n"]
    expect(gauge).to_contain_text(f"Context: {used:,} / {n_ctx:,} tokens")
    assert page.locator("#context-meter").evaluate("(m) => [m.value, m.max]") == [used, n_ctx]
    expect(page.locator("#model-name")).to_have_text("smollm2")
