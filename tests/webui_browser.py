"""Headless Chromium for the web UI tests: Debian's /usr/bin/chromium driven by Playwright (no browser
download, ever), plus helpers that act on the page the way a person would, by accessible names."""

from __future__ import annotations

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
