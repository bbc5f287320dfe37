"""Headless Chromium for the web UI tests: Debian's /usr/bin/chromium driven by Playwright (no browser
download, ever), plus helpers that act on the page the way a person would, by accessible names."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.server_process import REPO

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "tests" / "artifacts"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
LOAD_ERRORS = "Failed to load resource"  # Chromium logs every non-2xx fetch; the tests cause some on purpose


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright's Python package is missing: install the test extra (make test does)"
    if not CHROMIUM.is_file() and not shutil.which("chromium"):
        return "Debian's chromium is not installed (make test installs it as root: apt-get install chromium)"
    return None


def chromium_path() -> str:
    return str(CHROMIUM) if CHROMIUM.is_file() else str(shutil.which("chromium"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for the module's tests; every browser test uses it (directly or through a page), so a
    missing browser skips them all here, or fails them under CI=true."""
    require(missing_browser())
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def artifact(name: str) -> Path:
    """A path in tests/artifacts/ (git-ignored by the .gitignore it writes there)."""
    ARTIFACTS.mkdir(exist_ok=True)
    ignore = ARTIFACTS / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    return ARTIFACTS / name


class PageErrors:
    """Uncaught exceptions and console errors of a page; a test ends by asserting there were none."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("console", lambda msg: msg.type == "error" and self.errors.append(f"console: {msg.text}"))

    def unexpected(self, *allowed: str) -> list[str]:
        return [e for e in self.errors if not any(a in e for a in allowed)]


def open_app(page: Any) -> None:
    """The app at /, once /props answered (the model's name shows: the -m name, llama-server's alias)."""
    from playwright.sync_api import expect

    page.goto("/")
    expect(page.locator("#model-name")).to_contain_text("smollm2")


@contextlib.contextmanager
def app_page(
    browser: Any,
    base_url: str,
    *allowed: str,
    viewport: dict[str, int] = DESKTOP,
    tool_cwd: Path | None = None,
    accept_dialogs: bool = False,
) -> Iterator[Any]:
    """A page of its own browser context (its own storage) on the app, open; on leaving, the context is
    closed and the page must have had no uncaught exception and no console error but those naming one of
    `allowed`. `tool_cwd`: the built-in tools of its chats work there (x-tool-cwd), never in the
    repository. `accept_dialogs`: confirm() and friends answer yes (Delete asks)."""
    context = browser.new_context(viewport=viewport, base_url=base_url)
    page = context.new_page()
    if tool_cwd is not None:
        page.route(
            "**/v1/chat/completions",
            lambda route: route.continue_(headers={**route.request.headers, "x-tool-cwd": str(tool_cwd)}),
        )
    if accept_dialogs:
        page.on("dialog", lambda d: d.accept())
    errors = PageErrors(page)
    open_app(page)
    yield page
    context.close()
    assert errors.unexpected(*allowed) == []
