"""The web UI's static serving on a real server over HTTP: /, assets, gzip, ETag revalidation, --no-webui,
and UI files that stay public when the server has an API key."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import re
from collections.abc import Iterator

import httpx
import pytest

from server.apis.webui import WEBUI_DIR
from tests.server_process import ServerProcess

PLAIN = {"Accept-Encoding": "identity"}  # httpx asks for gzip by default and would undo it unseen


@pytest.fixture(scope="module")
def keyed() -> Iterator[ServerProcess]:
    """A server with an API key: the UI's files are public there, and served as on any other server."""
    proc = ServerProcess("-m", "smollm2", "-c", "512", "--no-slots", "--api-key", "sekrit").wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(keyed: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=keyed.base_url, headers=PLAIN, timeout=30) as c:
        yield c


def raw_get(client: httpx.Client, path: str, **headers: str) -> tuple[httpx.Response, bytes]:
    """The reply and its body exactly as sent (gzip not undone)."""
    with client.stream("GET", path, headers=headers) as reply:
        return reply, b"".join(reply.iter_raw())


def test_index_is_html_with_a_strict_content_security_policy(client: httpx.Client) -> None:
    reply = client.get("/")
    assert reply.status_code == 200
    assert reply.headers["Content-Type"] == "text/html; charset=utf-8"
    csp = reply.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "object-src 'none'" in csp
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    assert '<script type="module" src="assets/js/main.js">' in reply.text  # relative: --api-prefix
    assert client.get("/index.html").content == reply.content
    # the diagram frame (sandboxed by the page) alone allows inline style, for Mermaid's layout
    frame = client.get("/assets/diagram.html").headers["Content-Security-Policy"]
    assert "script-src 'self'" in frame and "default-src 'none'" in frame and "http" not in frame


def test_assets_are_gzipped_when_accepted_and_typed(client: httpx.Client) -> None:
    plain, raw = raw_get(client, "/assets/js/chat.js")
    packed, packed_bytes = raw_get(client, "/assets/js/chat.js", **{"Accept-Encoding": "gzip, deflate, br"})
    assert plain.status_code == packed.status_code == 200
    assert plain.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert "Content-Encoding" not in plain.headers
    assert packed.headers["Content-Encoding"] == "gzip"
    assert packed.headers["Vary"] == "Accept-Encoding"
    assert gzip.decompress(packed_bytes) == raw == (WEBUI_DIR / "assets/js/chat.js").read_bytes()
    assert len(packed_bytes) < len(raw) / 2
    assert client.get("/assets/css/app.css").headers["Content-Type"] == "text/css; charset=utf-8"
    assert client.get("/assets/favicon.svg").headers["Content-Type"].startswith("image/svg+xml")


def test_the_web_app_manifest_is_served_and_names_its_icons(client: httpx.Client) -> None:
    page = client.get("/").text
    assert '<link rel="manifest" href="assets/manifest.webmanifest" />' in page  # relative: --api-prefix
    assert 'name="theme-color"' in page
    reply = client.get("/assets/manifest.webmanifest")
    assert reply.status_code == 200
    assert reply.headers["Content-Type"] == "application/manifest+json; charset=utf-8"
    manifest = json.loads(reply.text)
    assert manifest["name"] == "Llamba" and manifest["short_name"] == "Llamba"
    assert manifest["display"] == "standalone" and manifest["start_url"] == manifest["scope"] == "../"
    assert re.fullmatch(r"#[0-9a-f]{6}", manifest["theme_color"])
    sizes = {}
    for icon in manifest["icons"]:
        image = client.get(f"/assets/{icon['src']}")
        assert image.status_code == 200 and image.headers["Content-Type"].startswith(icon["type"])
        if icon["type"] == "image/png":  # the size the manifest says is the PNG's own (IHDR width, height)
            assert image.content[:8] == b"\x89PNG\r\n\x1a\n"
            width, height = int.from_bytes(image.content[16:20]), int.from_bytes(image.content[20:24])
            assert icon["sizes"] == f"{width}x{height}"
            assert len(image.content) < 20_000  # small: a quantised palette
        sizes[icon["sizes"]] = icon["type"]
    assert sizes == {"any": "image/svg+xml", "192x192": "image/png", "512x512": "image/png"}


def test_etag_revalidation_answers_304(client: httpx.Client) -> None:
    first = client.get("/assets/css/app.css")
    etag = first.headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{20}"', etag)
    assert first.headers["Cache-Control"] == "no-cache"
    again = client.get("/assets/css/app.css", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    stale = client.get("/assets/css/app.css", headers={"If-None-Match": '"0000"'})
    assert stale.status_code == 200


@pytest.mark.parametrize(
    "path", ["/assets/../server/app.py", "/assets/%2e%2e/pyproject.toml", "/assets/nope.js", "/assets/js"]
)
def test_nothing_outside_the_webui_folder_is_served(keyed: ServerProcess, path: str) -> None:
    # http.client sends the path as written; httpx would resolve the dot segments before sending.
    conn = http.client.HTTPConnection("127.0.0.1", keyed.port, timeout=30)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        status, body = reply.status, reply.read()
    finally:
        conn.close()
    assert status == 404
    assert json.loads(body)["error"]["type"] == "not_found_error"


def test_ui_files_stay_public_with_an_api_key(client: httpx.Client) -> None:
    for path in ("/", "/assets/js/main.js", "/assets/css/app.css", "/assets/favicon.svg"):
        assert client.get(path).status_code == 200, path
    assert client.get("/props").status_code == 401
    assert client.get("/props", headers={"Authorization": "Bearer sekrit"}).status_code == 200


def test_no_webui_turns_the_ui_off() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "512", "--no-slots", "--no-webui").wait_healthy()
    try:
        for path in ("/", "/index.html", "/assets/js/main.js"):
            reply = httpx.get(proc.base_url + path, headers=PLAIN)
            assert reply.status_code == 404, path
            assert "--no-webui" in reply.json()["error"]["message"]
        assert httpx.get(proc.base_url + "/health").status_code == 200  # only the UI is off
    finally:
        proc.stop()


def test_every_module_the_page_imports_exists() -> None:
    """No build step: each relative import of each module must name a file that is there."""
    js = WEBUI_DIR / "assets" / "js"
    for module in js.rglob("*.js"):
        for target in re.findall(r'^import .* from "(\.{1,2}/[^"]+)";$', module.read_text(), re.MULTILINE):
            assert (module.parent / target).resolve().is_file(), f"{module.name} imports missing {target}"


def test_vendored_libraries_match_their_record() -> None:
    """Every file under assets/vendor/ is one VERSIONS.json records (scripts/vendor_webui.py wrote it from
    the published packages), with that sha256, and each library ships its licence."""
    vendor = WEBUI_DIR / "assets" / "vendor"
    record = json.loads((vendor / "VERSIONS.json").read_text())
    recorded = {f"{lib}/{name}": sha for lib, entry in record.items() for name, sha in entry["files"].items()}
    on_disk = {p.relative_to(vendor).as_posix() for p in vendor.rglob("*") if p.is_file()} - {"VERSIONS.json"}
    assert on_disk == set(recorded)
    for name, digest in recorded.items():
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name
    for lib, entry in record.items():
        assert f"{lib}/LICENSE" in recorded and entry["version"] and entry["package"]
    assert not [n for n in on_disk if n.endswith((".woff", ".ttf"))]  # KaTeX's fonts: woff2 only
