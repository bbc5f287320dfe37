"""Image and audio attachments in the web UI end to end: real headless Chromium against real servers, the
real Gemma 3 270M with a SYNTHETIC Gemma 3 projector (tests/synthetic_mmproj.py, "tiny": random weights,
16 image tokens) for the model that reads images, SmolLM2 with a SYNTHETIC Ultravox audio projector
(tests/synthetic_audio_mmproj.py, "tiny") for one that reads audio, the shared SmolLM2 server for one that
reads text only.

Everything is done through the page as a person would (the picker, a drop, a paste, by accessible names);
the requests the page sends are watched with page.on("request"), never answered by the test.
"""

from __future__ import annotations

import base64
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.server_process import ServerProcess
from tests.synthetic_audio_mmproj import wav_bytes, write_ultravox_mmproj
from tests.synthetic_mmproj import write_gemma3_mmproj
from tests.test_webui_browser import (
    LOAD_ERRORS,
    answer,
    chat_posts,
    last_message,
    open_app,
    send,
    settings,
    shoot,
    wait_status,
)
from tests.webui_browser import DESKTOP, PageErrors, browser  # noqa: F401


def gradient_png() -> Path:
    """A 64x48 gradient PNG (the projector goldens' input, drawn again here: this test reads no golden)."""
    path = Path(tempfile.mkdtemp(prefix="llamba-webui-")) / "mmproj_gradient.png"
    y, x = np.mgrid[0:48, 0:64]
    Image.fromarray(np.stack([x * 4, y * 5, (x + y) * 2], axis=-1).astype(np.uint8)).save(path)
    return path


PNG = gradient_png()
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG.read_bytes()).decode()
N_IMAGE = 16  # the tiny projector's tokens per image
TEXT_ONLY = "This model reads text only: images cannot be attached"
NO_AUDIO = "This model does not read audio: audio cannot be attached"
NO_IMAGES = "This model does not read images: images cannot be attached"
TONE = wav_bytes("tone")  # 1 s, 22.05 kHz stereo


@pytest.fixture(scope="module")
def vision_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    mmproj = write_gemma3_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny.gguf", "tiny")
    proc = ServerProcess("-m", "gemma3", "--mmproj", str(mmproj), "-c", "4096", "-np", "2").wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def audio_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    mmproj = write_ultravox_mmproj(tmp_path_factory.mktemp("mmproj") / "ultravox-tiny.gguf", "tiny", 2)
    proc = ServerProcess("-m", "smollm2", "--mmproj", str(mmproj), "-c", "4096").wait_healthy()
    yield proc
    proc.stop()


def tab(browser: Any, srv: ServerProcess) -> tuple[Any, Any, PageErrors]:  # noqa: F811
    context = browser.new_context(viewport=DESKTOP, base_url=srv.base_url)
    page = context.new_page()
    return context, page, PageErrors(page)


@pytest.fixture
def vision_page(browser: Any, vision_srv: ServerProcess) -> Iterator[Any]:  # noqa: F811
    from playwright.sync_api import expect

    context, page, errors = tab(browser, vision_srv)
    page.goto("/")
    expect(page.locator("#model-name")).to_contain_text("gemma3")
    # /props said the model reads images: the button says so
    expect(page.get_by_role("button", name="Attach files")).to_have_attribute(
        "title", "Attach images, text files or PDFs"
    )
    yield page
    context.close()
    assert errors.unexpected(LOAD_ERRORS) == []


@pytest.fixture
def text_page(browser: Any, server: ServerProcess) -> Iterator[Any]:  # noqa: F811
    context, page, errors = tab(browser, server)
    open_app(page)
    yield page
    context.close()
    assert errors.unexpected(LOAD_ERRORS) == []


def pick(page: Any, *paths: Path, button: str = "Attach files") -> None:
    """Attach files through the Attach files button's file chooser."""
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name=button).click()
    chooser.value.set_files([str(p) for p in paths])


def transfer(page: Any, name: str, mime: str, data: bytes) -> Any:
    """A DataTransfer holding one file, made in the page (what a drop or a paste carries)."""
    return page.evaluate_handle(
        """([name, mime, b64]) => {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const data = new DataTransfer();
        data.items.add(new File([bytes], name, { type: mime }));
        return data;
    }""",
        [name, mime, base64.b64encode(data).decode()],
    )


def drop(page: Any, name: str, mime: str, data: bytes, on: str = "#message") -> None:
    page.dispatch_event(on, "drop", {"dataTransfer": transfer(page, name, mime, data)})


def paste(page: Any, name: str, mime: str, data: bytes) -> bool:
    """Paste one file into the message box; True when the page took the paste (preventDefault)."""
    files = transfer(page, name, mime, data)
    return page.evaluate(
        """(data) => {
        const event = new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true });
        document.querySelector("#message").dispatchEvent(event);
        return event.defaultPrevented;
    }""",
        files,
    )


def thumbnail_loaded(locator: Any) -> bool:
    return locator.evaluate("(img) => img.complete && img.naturalWidth > 0")


# -- a model that reads images ----------------------------------------------------------------------
STORED = """async () => {
    const db = await new Promise((ok, fail) => {
        const req = indexedDB.open("llamba");
        req.onsuccess = () => ok(req.result);
        req.onerror = () => fail(req.error);
    });
    const tx = db.transaction(["conversations", "images"]);
    const read = (req) => new Promise((ok) => (req.onsuccess = () => ok(req.result)));
    const conversation = await read(tx.objectStore("conversations").get(window.llamba.current.id));
    const images = await read(tx.objectStore("images").getAll());
    db.close();
    return { message: conversation.messages[0], images };
}"""


def test_an_attached_image_is_sent_shown_kept_and_resent(vision_page: Any) -> None:
    from playwright.sync_api import expect

    page = vision_page
    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "8"})
    pick(page, PNG)
    preview = page.locator("#composer").get_by_role("img", name=PNG.name)
    expect(preview).to_be_visible()
    assert thumbnail_loaded(preview)
    expect(page.get_by_role("button", name=f"Remove {PNG.name}")).to_be_visible()
    shoot(page, "webui-image-attached.png")

    question = "What colours are in this image?"
    send(page, question)
    wait_status(page, "done", timeout=120)
    expect(page.locator("#composer").get_by_role("img")).to_have_count(0)  # the composer is empty again
    # The answer came (random projector weights: its text may be blank lines, so its count is checked).
    final = last_message(page)
    assert final["content"] and final["timings"]["predicted_n"] > 0, final
    expect(answer(page).locator(".stats")).to_contain_text(f"{final['timings']['predicted_n']} tokens")
    user = page.locator("article.msg.user").first
    expect(user.get_by_role("img", name=PNG.name)).to_be_visible()
    expect(user.locator(".bubble")).to_have_text(question)
    # the request as it went out: the image part (the file's bytes, as a data: URL), then the question
    assert posts[0]["body"]["messages"][-1] == {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": PNG_URL}}, {"type": "text", "text": question}],
    }
    shoot(page, "webui-image-thread.png")

    send(page, "And which colour is brightest?")
    wait_status(page, "done", timeout=120)
    follow = posts[1]["body"]["messages"]
    assert follow[0] == posts[0]["body"]["messages"][-1], "the follow-up asks about the same image"
    assert [m["role"] for m in follow] == ["user", "assistant", "user"]
    # the server reused the cells of the first turn (the image's among them) instead of encoding it again
    assert last_message(page)["timings"]["cache_n"] > N_IMAGE + 2

    # Stored: the image in its own store, the conversation naming it only (the streaming saves stay small).
    stored = page.evaluate(STORED)
    [image] = stored["message"]["images"]
    assert "url" not in image and image["name"] == PNG.name
    assert [i["url"] for i in stored["images"] if i["id"] == image["id"]] == [PNG_URL]
    page.reload()
    thumb = page.locator("article.msg.user").first.get_by_role("img", name=PNG.name)
    expect(thumb).to_be_visible()
    assert thumbnail_loaded(thumb)


def test_refusals_and_a_server_400_are_shown(vision_page: Any, tmp_path: Path) -> None:
    """A file that is neither an image, a text file nor a PDF is refused in the composer; an image the
    server cannot decode gets the server's 400 message in the thread."""
    from playwright.sync_api import expect

    page = vision_page
    notice = page.get_by_role("alert")
    drop(page, PNG.name, "image/png", PNG.read_bytes(), on="#sidebar")  # beside the chat: says where
    expect(notice).to_have_text("Drop files on the chat to attach them.")
    drop(page, "blob.bin", "application/octet-stream", b"\x00\x01")
    expect(notice).to_have_text("Not attached: blob.bin is not an image, a text file or a PDF.")
    drop(page, PNG.name, "image/png", PNG.read_bytes())  # a drop attaches like the picker
    expect(notice).to_be_hidden()
    page.get_by_role("button", name=f"Remove {PNG.name}").click()
    expect(page.locator("#composer").get_by_role("img")).to_have_count(0)

    broken = tmp_path / "broken.png"
    broken.write_bytes(b"these bytes are not a PNG")
    pick(page, broken)
    expect(page.locator("#composer").get_by_role("img", name="broken.png")).to_be_attached()
    send(page, "What is this?")
    wait_status(page, "error")
    expect(answer(page).locator(".msg-error")).to_contain_text("Failed to load image")
    expect(page.locator("article.msg.user").get_by_role("img", name="broken.png")).to_be_attached()


def test_a_conversation_the_browser_cannot_store_says_so(vision_page: Any) -> None:
    """A full storage quota, made to happen: a real one needs gigabytes, so the page's IndexedDB refuses
    images from here on (the browser's own QuotaExceededError). The conversation stays on screen and
    answers; a message says it is not saved."""
    from playwright.sync_api import expect

    page = vision_page
    page.evaluate(
        """() => {
        const put = IDBObjectStore.prototype.put;
        IDBObjectStore.prototype.put = function (...args) {
            if (this.name === "images") throw new DOMException("quota", "QuotaExceededError");
            return put.apply(this, args);
        };
    }"""
    )
    settings(page, Temperature="0", **{"Max tokens": "4"})
    pick(page, PNG)
    send(page, "Describe it.")
    expect(page.locator(".toast-error")).to_contain_text(
        "“Describe it.” could not be saved in this browser (the browser's storage is full)"
    )
    wait_status(page, "done", timeout=120)
    expect(page.locator("article.msg.user").get_by_role("img", name=PNG.name)).to_be_visible()
    assert page.locator(".toast-error").count() == 1, "said once, not at every save of the answer"


# -- a model that reads text only -------------------------------------------------------------------
def test_a_text_only_model_refuses_images_visibly(text_page: Any) -> None:
    from playwright.sync_api import expect

    page = text_page
    posts = chat_posts(page)
    attach = page.get_by_role("button", name="Attach files")
    expect(attach).to_have_attribute("title", "Attach text files or PDFs")  # what it takes
    notice = page.get_by_role("alert")

    drop(page, PNG.name, "image/png", PNG.read_bytes())
    expect(notice).to_have_text(TEXT_ONLY)
    expect(page.locator("#composer").get_by_role("img")).to_have_count(0)
    shoot(page, "webui-image-text-only.png")

    page.reload()
    expect(notice).to_be_hidden()
    assert paste(page, "image.png", "image/png", PNG.read_bytes()), "the page took the paste"
    expect(notice).to_have_text(TEXT_ONLY)
    expect(page.locator("#composer").get_by_role("img")).to_have_count(0)
    assert page.get_by_role("textbox", name="Message").input_value() == ""
    expect(page.get_by_role("button", name="Send")).to_be_disabled()  # nothing to send
    with page.expect_file_chooser() as chooser:  # the picker offers text files and PDFs only
        attach.click()
    accept = chooser.value.element.get_attribute("accept").split(",")
    assert "image/*" not in accept and "audio/*" not in accept and ".pdf" in accept and ".py" in accept
    chooser.value.set_files({"name": "image.png", "mimeType": "image/png", "buffer": PNG.read_bytes()})
    expect(notice).to_have_text(TEXT_ONLY)
    assert posts == [], json.dumps(posts)[:300]


def test_export_keeps_images_and_import_takes_data_image_urls_only(text_page: Any) -> None:
    """An export carries each image whole (its data: URL); an import keeps only data:image/ URLs (an <img>
    never fetches from elsewhere), each under a fresh id."""
    images = text_page.evaluate(
        """async () => {
        const { exportJson, parseImport } = await import("/assets/js/transfer.js");
        const image = (id, url) => ({ id, name: `${id}.png`, url });
        const message = { id: "u", role: "user", content: "Q", createdAt: 1, images: [
            image("a", "data:image/png;base64,AAAA"), image("b", "https://example.com/b.png"),
            image("c", "javascript:alert(1)"), image("d", "data:text/html;base64,PGI+") ] };
        const conversation = { id: "c", title: "T", createdAt: 1, updatedAt: 1, messages: [message] };
        const text = exportJson([conversation]);
        return { exported: JSON.parse(text).conversations[0].messages[0].images,
                 imported: parseImport(text)[0].messages[0].images };
    }"""
    )
    assert [i["url"] for i in images["exported"]][0] == "data:image/png;base64,AAAA"
    [kept] = images["imported"]
    assert kept["url"] == "data:image/png;base64,AAAA" and kept["name"] == "a.png" and kept["id"] != "a"


# -- a model that reads audio -----------------------------------------------------------------------
@pytest.fixture
def audio_page(browser: Any, audio_srv: ServerProcess) -> Iterator[Any]:  # noqa: F811
    from playwright.sync_api import expect

    context, page, errors = tab(browser, audio_srv)
    page.goto("/")
    expect(page.locator("#model-name")).to_contain_text("smollm2")
    # /props said the model reads audio (and not images): the button is on, and says so
    attach = page.get_by_role("button", name="Attach files", exact=True)
    expect(attach).to_have_attribute("title", "Attach audio, text files or PDFs")
    yield page
    context.close()
    assert errors.unexpected(LOAD_ERRORS) == []


def test_an_attached_audio_file_is_sent_shown_kept_and_resent(audio_page: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    page = audio_page
    posts = chat_posts(page)
    settings(page, Temperature="0", **{"Max tokens": "8"})
    tone = tmp_path / "tone.wav"
    tone.write_bytes(TONE)
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Attach files").click()
    accept = chooser.value.element.get_attribute("accept").split(",")
    assert "audio/*" in accept and "image/*" not in accept  # only the media the model reads
    chooser.value.set_files(str(tone))
    chip = page.locator("#composer .audio-chip")
    expect(chip).to_have_text(tone.name)
    expect(page.get_by_role("button", name=f"Remove {tone.name}")).to_be_visible()
    shoot(page, "webui-audio-attached.png")

    question = "What do you hear?"
    send(page, question)
    wait_status(page, "done", timeout=120)
    expect(chip).to_have_count(0)  # the composer is empty again
    final = last_message(page)
    assert final["content"] and final["timings"]["predicted_n"] > 0, final
    user = page.locator("article.msg.user").first
    expect(user.locator(".audio-chip")).to_have_text(tone.name)
    expect(user.locator(".bubble")).to_have_text(question)
    # the request as it went out: the audio part (the file's bytes in base64, no data: head), then the text
    data = base64.b64encode(TONE).decode()
    audio_part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    assert posts[0]["body"]["messages"][-1] == {
        "role": "user",
        "content": [audio_part, {"type": "text", "text": question}],
    }

    send(page, "Is it loud?")
    wait_status(page, "done", timeout=120)
    follow = posts[1]["body"]["messages"]
    assert follow[0] == posts[0]["body"]["messages"][-1], "the follow-up resends the same audio"
    assert [m["role"] for m in follow] == ["user", "assistant", "user"]

    # Stored beside the images: the conversation names it (with its kind and format) only.
    stored = page.evaluate(STORED)
    [item] = stored["message"]["images"]
    assert "url" not in item and item["name"] == tone.name
    assert item["kind"] == "audio" and item["format"] == "wav"
    [url] = [i["url"] for i in stored["images"] if i["id"] == item["id"]]
    assert url.split(",", 1)[1] == data
    page.reload()
    expect(page.locator("article.msg.user").first.locator(".audio-chip")).to_have_text(tone.name)
    send(page, "Once more?")
    wait_status(page, "done", timeout=120)
    assert posts[2]["body"]["messages"][0] == posts[0]["body"]["messages"][-1], "resent after a reload"


def test_an_audio_model_refuses_images_visibly(audio_page: Any) -> None:
    from playwright.sync_api import expect

    page = audio_page
    notice = page.get_by_role("alert")
    drop(page, PNG.name, "image/png", PNG.read_bytes())
    expect(notice).to_have_text(NO_IMAGES)
    drop(page, "blob.bin", "application/octet-stream", b"\x00\x01")
    expect(notice).to_have_text("Not attached: blob.bin is not an audio file, a text file or a PDF.")
    assert paste(page, "clip.wav", "audio/wav", TONE), "the page took the paste"
    expect(notice).to_be_hidden()
    expect(page.locator("#composer .audio-chip")).to_have_text("clip.wav")


def test_an_image_model_refuses_audio_visibly(vision_page: Any) -> None:
    from playwright.sync_api import expect

    page = vision_page
    posts = chat_posts(page)
    notice = page.get_by_role("alert")
    attach = page.get_by_role("button", name="Attach files", exact=True)
    with page.expect_file_chooser() as chooser:
        attach.click()
    accept = chooser.value.element.get_attribute("accept").split(",")
    assert "image/*" in accept and "audio/*" not in accept
    chooser.value.set_files({"name": "tone.wav", "mimeType": "audio/wav", "buffer": TONE})
    expect(notice).to_have_text(NO_AUDIO)
    drop(page, "tone.wav", "audio/wav", TONE)
    expect(notice).to_have_text(NO_AUDIO)
    expect(page.locator("#composer .attachment")).to_have_count(0)
    expect(page.get_by_role("button", name="Send")).to_be_disabled()  # nothing to send
    assert posts == []


def test_a_text_only_model_refuses_audio_visibly(text_page: Any) -> None:
    from playwright.sync_api import expect

    page = text_page
    drop(page, "tone.wav", "audio/wav", TONE)
    expect(page.get_by_role("alert")).to_have_text(NO_AUDIO)
    expect(page.locator("#composer .attachment")).to_have_count(0)
    expect(page.get_by_role("button", name="Attach files")).to_have_attribute(
        "title", "Attach text files or PDFs"
    )


def test_import_keeps_audio_as_base64_data_urls(text_page: Any) -> None:
    audio = text_page.evaluate(
        """async () => {
        const { exportJson, parseImport } = await import("/assets/js/transfer.js");
        const clip = (id, url, format) => ({ id, name: `${id}.wav`, url, kind: "audio", format });
        const message = { id: "u", role: "user", content: "Q", createdAt: 1, images: [
            clip("a", "data:audio/wav;base64,UklGRg==", "wav"), clip("b", "https://example.com/b.wav", "wav"),
            clip("c", "data:audio/flac;base64,ZkxhQw==", "ogg") ] };
        const conversation = { id: "c", title: "T", createdAt: 1, updatedAt: 1, messages: [message] };
        return parseImport(exportJson([conversation]))[0].messages[0].images;
    }"""
    )
    kept = [(a["name"], a["kind"], a["format"]) for a in audio]
    assert kept == [("a.wav", "audio", "wav"), ("c.wav", "audio", "wav")]  # no https: URL, no "ogg" format
    assert audio[0]["url"] == "data:audio/wav;base64,UklGRg==" and audio[0]["id"] != "a"
