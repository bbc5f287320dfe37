"""First paint of the web UI's chat view on a local server, cold cache (issue 54's page-load bar: < 1 s).

Starts a real server (SmolLM2), then loads `/` `--loads` times in Debian's Chromium through Playwright
(tests/webui_browser.py's harness), each in a fresh browser context (an empty HTTP cache and storage:
a cold load). Per load it reads the Performance API's `first-contentful-paint`, the navigation's
`loadEventEnd`, and the bytes the page transferred (the resources' transferSize), and counts the
requests that failed or answered >= 400. Prints each load and the medians.

    .venv/bin/python scripts/webui_first_paint.py [--loads 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server_process import ServerProcess  # noqa: E402
from tests.webui_browser import CHROMIUM_ARGS, DESKTOP, chromium_path, missing_browser  # noqa: E402

TIMINGS = """() => {
  const paint = performance.getEntriesByName('first-contentful-paint')[0];
  const nav = performance.getEntriesByType('navigation')[0];
  const bytes = performance.getEntriesByType('resource').reduce((n, r) => n + r.transferSize, 0);
  return {fcp: paint ? paint.startTime : null, load: nav.loadEventEnd, bytes: bytes + nav.transferSize};
}"""


def one_load(browser: Any, url: str) -> dict[str, float]:
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
    page.goto(url, wait_until="load")
    page.get_by_role("textbox").first.wait_for()
    page.wait_for_timeout(300)  # requests the page makes after load (/props, /v1/models) have answered
    figures = page.evaluate(TIMINGS)
    context.close()
    return {**figures, "failed": len(failed)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loads", type=int, default=8)
    args = p.parse_args()
    if why := missing_browser():
        raise SystemExit(why)
    from playwright.sync_api import sync_playwright

    server = ServerProcess("-m", "smollm2", "-c", "2048").wait_healthy(timeout=600)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
            one_load(browser, server.base_url)  # the server's first answers (static files read once)
            loads = [one_load(browser, server.base_url) for _ in range(args.loads)]
            browser.close()
    finally:
        server.stop()
    for i, f in enumerate(loads, 1):
        print(
            f"load {i}: first paint {f['fcp']:.0f} ms, load event {f['load']:.0f} ms, "
            f"{f['bytes'] / 1024:.0f} KB, {f['failed']} failed requests"
        )
    med = {k: statistics.median(f[k] for f in loads) for k in ("fcp", "load", "bytes")}
    print(
        f"median of {len(loads)} cold loads: first paint {med['fcp']:.0f} ms, load event "
        f"{med['load']:.0f} ms, {med['bytes'] / 1024:.0f} KB; failed requests in all: "
        f"{sum(f['failed'] for f in loads)}"
    )


if __name__ == "__main__":
    main()
