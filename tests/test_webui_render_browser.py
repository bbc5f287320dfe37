"""The web UI's rendering of answers by its vendored libraries (marked, DOMPurify, highlight.js, KaTeX,
Mermaid), end to end in headless Chromium against a real server with SmolLM2, and a page load that makes
no failing request.

The answers are imported histories (Import, as a person would): they render without the model, so each
one is exactly the markdown the test means.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess
from tests.test_webui_browser import import_json, open_app, shoot
from tests.webui_browser import DESKTOP, PageErrors, app_page, browser  # noqa: F401

RICH_ANSWER = "\n".join(
    [
        "Here is the code:",
        "",
        "```python",
        "def square(x):",
        '    return x * x  # "squared"',
        "```",
        "",
        "Einstein: $E = mc^2$, Pythagoras: \\(a^2 + b^2 = c^2\\), and from $5 to $10 no math.",
        "",
        "$$\\int_0^1 x\\,dx = \\frac{1}{2}$$",
        "",
        "\\[ \\sqrt{2} \\approx 1.414 \\]",
        "",
        "```mermaid",
        "graph TD",
        "  A[Ask] --> B{Known?}",
        "  B -->|yes| C[Answer]",
        "```",
    ]
)

HOSTILE_ANSWERS = [
    "<script>window.pwned = 1</script> and <img src=x onerror=window.pwned=2> inline",
    "<div onclick=window.pwned=3>raw <b>html</b> block</div>\n\n"
    "<iframe src=javascript:window.pwned=4></iframe>",
    "[a link](javascript:window.pwned=5) [data](data:text/html,<script>alert(1)</script>) "
    "[fine](https://example.com/x) <https://example.org> [mail](mailto:a@example.com) "
    "![pic](https://example.com/p.png)",
    "TeX link: $\\href{javascript:window.pwned=6}{click me}$ and $\\url{javascript:alert(7)}$ "
    "and $\\htmlId{x}{y}$",
    '```mermaid\ngraph TD\n  A["<img src=x onerror=window.pwned=8>"] --> B[Two]\n'
    '  click A callback "tip"\n  click B href "javascript:window.pwned=9"\n```',
    '```mermaid\nflowchart LR\n  A["<b onmouseover=alert(10)>bold</b>"] --> B\n'
    '  %%{init: {"securityLevel": "loose"}}%%\n```',
]


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", "smollm2", "-c", "512", "-np", "1", "--no-slots").wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture
def page(browser: Any, srv: ServerProcess) -> Iterator[Any]:  # noqa: F811
    with app_page(browser, srv.base_url) as tab:  # no error allowed, not even a failed load
        yield tab


def history(title: str, answers: list[str]) -> dict[str, Any]:
    messages: list[dict[str, str]] = []
    for i, text in enumerate(answers):
        messages += [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": text}]
    conversation = {"id": title, "title": title, "createdAt": 1, "updatedAt": 1, "messages": messages}
    return {"format": "llamba.conversations", "version": 1, "conversations": [conversation]}


def open_imported(page: Any, title: str, answers: list[str]) -> None:
    import_json(page, history(title, answers))
    page.get_by_role("button", name=title, exact=True).click()


def test_a_default_server_page_load_makes_no_failing_request(browser: Any, srv: ServerProcess) -> None:  # noqa: F811
    """No tools configured: /props says so (endpoint_tools false) and the page never asks /tools; its web
    app manifest (with its icons) loads and Chromium reads it without error."""
    props = httpx.get(srv.base_url + "/props", timeout=30).json()
    assert props["endpoint_tools"] is False
    context = browser.new_context(viewport=DESKTOP, base_url=srv.base_url)
    page = context.new_page()
    errors = PageErrors(page)
    failed: list[str] = []
    asked: list[str] = []
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
    page.on("request", lambda r: asked.append(r.url))
    open_app(page)
    page.wait_for_load_state("networkidle")
    # Installable: Chromium's own reading of the page's web app manifest finds no error, and its icons load
    manifest = context.new_cdp_session(page).send("Page.getAppManifest")
    assert manifest["url"].endswith("/assets/manifest.webmanifest") and manifest["errors"] == []
    icons = page.evaluate(
        """async (url) => {
            const manifest = await (await fetch(url)).json();
            return Promise.all(manifest.icons.map(async (icon) => {
                const reply = await fetch(new URL(icon.src, url));
                return [icon.sizes, reply.status, reply.headers.get("content-type").split(";")[0]];
            }));
        }""",
        manifest["url"],
    )
    assert sorted(icons) == [
        ["192x192", 200, "image/png"],
        ["512x512", 200, "image/png"],
        ["any", 200, "image/svg+xml"],
    ]
    page.wait_for_load_state("networkidle")
    context.close()
    assert failed == []
    assert errors.unexpected() == []  # not even "Failed to load resource"
    assert not [url for url in asked if url.endswith("/tools")]
    assert not [url for url in asked if "/vendor/katex" in url or "/vendor/mermaid" in url]  # lazy


def test_code_math_and_a_diagram_render(page: Any) -> None:
    from playwright.sync_api import expect

    open_imported(page, "Rich", [RICH_ANSWER])
    content = page.locator("article.msg.assistant .content")
    code = content.locator(".code-block code.hljs")
    expect(code.locator(".hljs-keyword").first).to_have_text("def")
    expect(code.locator(".hljs-string")).to_have_count(0)  # the quote is in a comment
    expect(code.locator(".hljs-comment")).to_contain_text('"squared"')
    annotations = content.locator(".katex annotation[encoding='application/x-tex']")
    expect(annotations).to_have_count(4)
    assert annotations.all_text_contents() == [
        "E = mc^2",
        "a^2 + b^2 = c^2",
        "\\int_0^1 x\\,dx = \\frac{1}{2}",
        "\\sqrt{2} \\approx 1.414",
    ]
    expect(content.locator(".katex-display")).to_have_count(2)
    expect(content).to_contain_text("from $5 to $10 no math")
    svg = content.locator(".mermaid-diagram .diagram svg")
    expect(svg).to_have_count(1, timeout=30_000)
    expect(svg.locator("text, span").filter(has_text="Known?").first).to_be_attached()
    assert svg.bounding_box()["height"] > 50
    # the diagram's styles came through the CSSOM: its nodes are filled, not the SVG default black
    fill = svg.locator(".node rect, .node polygon").first.evaluate("e => getComputedStyle(e).fill")
    assert fill not in ("rgb(0, 0, 0)", "none"), fill
    # KaTeX's inline sizes applied (through the CSSOM too): its struts have a height
    assert page.locator(".katex .strut, .katex-html [class*=strut]").first.evaluate("e => e.style.height")
    content.locator(".mermaid-diagram").scroll_into_view_if_needed()
    shoot(page, "webui-rich-answer.png")


def test_hostile_answers_run_nothing(browser: Any, srv: ServerProcess) -> None:  # noqa: F811
    """Script, handlers, javascript: links, raw HTML, a TeX \\href and Mermaid clicks and HTML labels:
    nothing runs, in the page or in the diagram frame. The frame's CSP may refuse an inline handler that
    Mermaid's own label parsing met there (a console error from the frame): refused is the point."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport=DESKTOP, base_url=srv.base_url)
    page = context.new_page()
    dialogs: list[str] = []
    errors: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))

    def console(msg: Any) -> None:
        from_frame = "/assets/vendor/mermaid/" in msg.location.get("url", "")
        refused = "violates the following Content Security Policy" in msg.text
        if msg.type == "error" and not (from_frame and refused):
            errors.append(f"console: {msg.text}")

    page.on("console", console)
    open_app(page)
    open_imported(page, "Hostile", HOSTILE_ANSWERS)
    figures = page.locator(".mermaid-diagram[data-state]")
    expect(figures).to_have_count(2, timeout=30_000)  # each drawn, or refused with Mermaid's message
    expect(page.locator(".katex")).to_have_count(3)
    assert page.locator("#thread a[*|href]:not([href])").count() == 0  # no xlink:href in a diagram
    for element in page.locator("#thread a[href]").all():
        href = element.get_attribute("href") or ""
        assert href.startswith(("https://", "http://", "mailto:")), href
        assert "noopener" in (element.get_attribute("rel") or "")
    found = page.evaluate(
        """() => {
        const thread = document.querySelector("#thread");
        const all = [...thread.querySelectorAll("*")];
        return {
          tags: [...new Set(all.map((e) => e.localName))],
          handlers: all.flatMap((e) => [...e.attributes].map((a) => a.name).filter((a) => /^on/i.test(a))),
          katexLinks: thread.querySelectorAll(".katex a").length,
          text: thread.textContent,
        };
    }"""
    )
    assert not {"script", "img", "iframe", "foreignobject", "b"} & set(found["tags"])
    assert found["handlers"] == []
    assert found["katexLinks"] == 0
    for shown in ("<script>window.pwned = 1</script>", "<img src=x onerror=window.pwned=2>", "<b>html</b>"):
        assert shown in found["text"]
    page.mouse.move(400, 400)
    for node in page.locator(".mermaid-diagram .node").all():
        node.click(force=True)
    page.wait_for_timeout(300)
    assert page.evaluate("() => window.pwned") is None
    assert dialogs == []
    assert len(context.pages) == 1  # no link opened a window
    assert page.evaluate("() => window.pwned") is None
    context.close()
    assert errors == []
