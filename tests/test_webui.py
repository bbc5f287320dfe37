"""The web UI's static serving: /, assets, gzip, ETag revalidation, --no-webui, and public assets with keys.

These run the app in-process (Quart's test client, no model loaded): the routes here never touch the engine.
"""

from __future__ import annotations

import gzip
import re

import pytest

from server.app import create_app
from server.cli import Settings, parse_settings
from server.routes.webui import WEBUI_DIR

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def client(**settings: object):  # type: ignore[no-untyped-def]
    return create_app(Settings(**settings)).test_client()


async def test_index_is_html_with_a_strict_content_security_policy() -> None:
    reply = await client().get("/")
    assert reply.status_code == 200
    assert reply.headers["Content-Type"] == "text/html; charset=utf-8"
    csp = reply.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "object-src 'none'" in csp
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    body = await reply.get_data(as_text=True)
    assert '<script type="module" src="/assets/js/main.js">' in body
    assert (await (await client().get("/index.html")).get_data()) == body.encode()


async def test_assets_are_gzipped_when_accepted_and_typed() -> None:
    c = client()
    plain = await c.get("/assets/js/chat.js")
    packed = await c.get("/assets/js/chat.js", headers={"Accept-Encoding": "gzip, deflate, br"})
    assert plain.status_code == packed.status_code == 200
    assert plain.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert "Content-Encoding" not in plain.headers
    assert packed.headers["Content-Encoding"] == "gzip"
    assert packed.headers["Vary"] == "Accept-Encoding"
    raw = await plain.get_data()
    assert gzip.decompress(await packed.get_data()) == raw == (WEBUI_DIR / "assets/js/chat.js").read_bytes()
    assert len(await packed.get_data()) < len(raw) / 2
    css = await c.get("/assets/css/app.css")
    assert css.headers["Content-Type"] == "text/css; charset=utf-8"
    svg = await c.get("/assets/favicon.svg")
    assert svg.headers["Content-Type"].startswith("image/svg+xml")


async def test_etag_revalidation_answers_304() -> None:
    c = client()
    first = await c.get("/assets/css/app.css")
    etag = first.headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{20}"', etag)
    assert first.headers["Cache-Control"] == "no-cache"
    again = await c.get("/assets/css/app.css", headers={"If-None-Match": etag})
    assert again.status_code == 304 and await again.get_data() == b""
    stale = await c.get("/assets/css/app.css", headers={"If-None-Match": '"0000"'})
    assert stale.status_code == 200


@pytest.mark.parametrize(
    "path", ["/assets/../server/app.py", "/assets/%2e%2e/pyproject.toml", "/assets/nope.js", "/assets/js"]
)
async def test_nothing_outside_the_webui_folder_is_served(path: str) -> None:
    reply = await client().get(path)
    assert reply.status_code == 404
    assert (await reply.get_json())["error"]["type"] == "not_found_error"


async def test_no_webui_turns_the_ui_off() -> None:
    settings, _ = parse_settings(["--no-webui"])
    assert settings.webui is False
    c = create_app(settings).test_client()
    for path in ("/", "/index.html", "/assets/js/main.js"):
        reply = await c.get(path)
        assert reply.status_code == 404, path
        assert "--no-webui" in (await reply.get_json())["error"]["message"]


async def test_ui_files_stay_public_with_an_api_key() -> None:
    c = client(api_keys=("sekrit",))
    for path in ("/", "/assets/js/main.js", "/assets/css/app.css", "/assets/favicon.svg"):
        assert (await c.get(path)).status_code == 200, path
    assert (await c.get("/props")).status_code == 401


def test_every_module_the_page_imports_exists() -> None:
    """No build step: each relative import of each module must name a file that is there."""
    js = WEBUI_DIR / "assets" / "js"
    for module in js.rglob("*.js"):
        for target in re.findall(r'^import .* from "(\.{1,2}/[^"]+)";$', module.read_text(), re.MULTILINE):
            assert (module.parent / target).resolve().is_file(), f"{module.name} imports missing {target}"
