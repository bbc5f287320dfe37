"""Screenshots of the web UI's main views, desktop (1280x800) and phone (390x844), for docs/screenshots/.

Starts a real server (SmolLM2, the built-in read_file and write_file tools) and drives Debian's Chromium
through Playwright (tests/webui_browser.py's harness: no browser download):

- chat: an imported conversation whose answer has highlighted code and KaTeX math (imported, so the
  picture shows exactly that markdown; the model is too small to write it on demand);
- settings: the Settings dialog with a saved preset (its Delete button) under the sampler fields;
- permission: a real answer paused before write_file (forced by tool_choice), the “Allow write_file?”
  prompt up; the script then denies it, so nothing is written (the tool's folder is a temporary one).

Each PNG is quantised to a 256-colour palette (Pillow), which keeps a UI screenshot far under 200 KB.

    .venv/bin/python scripts/webui_screenshots.py [OUT_DIR]   # default: docs/screenshots/
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server_process import ServerProcess  # noqa: E402
from tests.webui_browser import CHROMIUM_ARGS, DESKTOP, PHONE, chromium_path, missing_browser  # noqa: E402

ANSWER = "\n".join(
    [
        "A function that squares a number, and the sum it comes from:",
        "",
        "```python",
        "def square(x: float) -> float:",
        '    """x times itself."""',
        "    return x * x",
        "",
        "print(sum(square(n) for n in range(1, 4)))  # 14",
        "```",
        "",
        "The sum of the first $n$ squares is $\\sum_{k=1}^{n} k^2 = \\frac{n(n+1)(2n+1)}{6}$, so for",
        "$n = 3$:",
        "",
        "$$1 + 4 + 9 = \\frac{3 \\cdot 4 \\cdot 7}{6} = 14$$",
    ]
)
CONVERSATION = {
    "format": "llamba.conversations",
    "version": 1,
    "conversations": [
        {
            "id": "squares",
            "title": "Sum of squares",
            "createdAt": 1,
            "updatedAt": 1,
            "messages": [
                {"role": "user", "content": "Write a Python function that squares a number, and the sum."},
                {"role": "assistant", "content": ANSWER},
            ],
        }
    ],
}
FORCED_WRITE = {"tool_choice": {"type": "function", "function": {"name": "write_file"}}}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "out", nargs="?", default=str(ROOT / "docs" / "screenshots"), help="folder for the PNGs"
    )
    out = Path(parser.parse_args().out)
    missing = missing_browser()
    if missing:
        print(missing, file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    srv = ServerProcess("-m", "smollm2", "-c", "2048", "--tools", "read_file,write_file")
    try:
        srv.wait_healthy(timeout=600)
        with sync_playwright() as p, tempfile.TemporaryDirectory() as workdir:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            for device, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
                for view, draw in VIEWS.items():
                    page = new_page(browser, srv.base_url, viewport, Path(workdir))
                    draw(page, out)
                    save(page, out / f"{view}-{device}.png")
                    page.context.close()
            browser.close()
    finally:
        srv.stop()
    for path in sorted(out.glob("*.png")):
        print(
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {path.stat().st_size:,} bytes"
        )
    return 0


def new_page(browser: Any, base_url: str, viewport: dict[str, int], workdir: Path) -> Any:
    """A fresh browser context (its own storage) on the app, its tools working in `workdir`."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport=viewport, base_url=base_url, color_scheme="light")
    page = context.new_page()
    page.route(
        "**/v1/chat/completions",
        lambda route: route.continue_(headers={**route.request.headers, "x-tool-cwd": str(workdir)}),
    )
    page.goto("/")
    expect(page.locator("#model-name")).to_contain_text("smollm2")
    return page


def chat_view(page: Any, out: Path) -> None:
    """The imported answer, its code highlighted and its math typeset."""
    from playwright.sync_api import expect

    path = out / ".import.json"
    path.write_text(json.dumps(CONVERSATION))
    try:
        page.locator("#import-file").set_input_files(str(path))  # Import's file (a phone's sidebar is shut)
        expect(page.locator(".toast").last).to_contain_text("Imported")
    finally:
        path.unlink()
    page.goto("/#/c/squares")
    expect(page.locator(".hljs-keyword").first).to_be_visible(timeout=30_000)
    expect(page.locator(".katex-display").first).to_be_visible(timeout=30_000)
    page.evaluate("() => document.querySelectorAll('.toast').forEach((t) => t.remove())")


def settings_view(page: Any, out: Path) -> None:
    """Settings with a saved preset (its Delete button shows) and a changed field."""
    page.get_by_role("button", name="Settings", exact=True).click()
    form = page.get_by_role("dialog", name="Settings")
    form.get_by_label("Temperature", exact=True).fill("0.2")
    form.get_by_label("Preset name").fill("Precise")
    form.get_by_role("button", name="Add preset").click()
    form.get_by_label("System prompt", exact=True).fill("You are a careful assistant.")
    form.get_by_role("list", name="Saved presets").scroll_into_view_if_needed()  # the presets, at its foot
    page.evaluate("() => document.querySelectorAll('.toast').forEach((t) => t.remove())")


def permission_view(page: Any, out: Path) -> None:
    """A real answer paused before write_file: the prompt shows the call's arguments."""
    from playwright.sync_api import expect

    page.get_by_role("button", name="Settings", exact=True).click()
    form = page.get_by_role("dialog", name="Settings")
    form.get_by_label("Temperature", exact=True).fill("0")
    form.get_by_label("Max tool rounds", exact=True).fill("1")
    form.get_by_label("Custom JSON", exact=True).fill(json.dumps(FORCED_WRITE))
    form.get_by_role("button", name="Save").click()
    page.get_by_role("button", name="Tools", exact=True).click()
    panel = page.get_by_role("group", name="MCP servers for this conversation")
    panel.get_by_role("checkbox", name="builtin", exact=True).check()
    panel.get_by_role("checkbox", name="read_file", exact=True).uncheck()
    page.get_by_role("button", name="Tools", exact=True).click()
    page.get_by_label("Message", exact=True).fill("Write the word hello to the file notes.txt.")
    page.get_by_label("Message", exact=True).press("Enter")
    expect(page.get_by_role("dialog", name="Allow write_file?")).to_be_visible(timeout=180_000)
    page.evaluate("() => document.querySelectorAll('.toast').forEach((t) => t.remove())")


VIEWS: dict[str, Callable[[Any, Path], None]] = {
    "chat": chat_view,
    "settings": settings_view,
    "permission": permission_view,
}


def save(page: Any, path: Path) -> None:
    """The viewport as a PNG with a 256-colour palette (a UI has few colours: small, and still sharp)."""
    page.wait_for_timeout(300)  # the last frame painted (fonts, a dialog's entrance)
    page.screenshot(path=str(path))
    with Image.open(path) as image:
        image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    prompt = page.get_by_role("dialog", name="Allow write_file?")
    if prompt.is_visible():  # deny it: the screenshot is all the script wanted, nothing is written
        prompt.get_by_role("button", name="Deny").click()


if __name__ == "__main__":
    sys.exit(main())
