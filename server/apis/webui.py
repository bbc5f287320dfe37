"""The bundled web UI: `/` and the static files under server/webui/, gzip-compressed and revalidated by ETag.

Files are read from disk on first use and kept in memory with their gzip form, keyed by (mtime, size), so
an edited file is picked up on the next request. `--no-webui` turns every route here into a 404.
"""

from __future__ import annotations

import gzip
import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quart import Blueprint, Response, current_app, request

from server.http import errors

bp = Blueprint("webui", __name__)

# app.config key: whether the UI is served (--no-webui sets it False); the model server and the router
# both serve it.
ENABLED_KEY = "LLAMBA_WEBUI"

# Package data (pyproject), so an installed wheel serves the UI as the source tree does.
WEBUI_DIR = Path(__file__).resolve().parents[1] / "webui"
COMPRESSIBLE = {".html", ".js", ".mjs", ".css", ".svg", ".json", ".txt", ".md", ".webmanifest"}
MIN_GZIP_BYTES = 512
# The web app manifest (installable as an app) by its registered type: Python's mimetypes may not know it.
TYPES = {
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".svg": "image/svg+xml",
    ".webmanifest": "application/manifest+json",
}
# The page runs only its own scripts: model output can never bring code in, even if rendering slipped.
# Its one worker is pdf.js's (the text of an attached PDF), a file of its own origin. The web app manifest
# and its icons are its own files too (default-src 'self' covers manifest-src).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; worker-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
# The diagram frame (assets/diagram.html, framed by the page with sandbox="allow-scripts": no origin of its
# own, no reach into the page): Mermaid lays diagrams out with inline styles, which only this frame allows.
# It loads nothing but its two scripts, and talks to the page only by postMessage (SVG text, sanitised there).
FRAME_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; img-src data:; font-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
)
FRAME_PAGE = "assets/diagram.html"


@dataclass(frozen=True)
class Asset:
    key: tuple[int, int]  # (mtime_ns, size) of the file it was read from
    body: bytes
    gzipped: bytes | None
    etag: str
    content_type: str


_cache: dict[Path, Asset] = {}


def _load(path: Path) -> Asset:
    stat = path.stat()
    key = (stat.st_mtime_ns, stat.st_size)
    cached = _cache.get(path)
    if cached is not None and cached.key == key:
        return cached
    body = path.read_bytes()
    packed = None
    if path.suffix in COMPRESSIBLE and len(body) >= MIN_GZIP_BYTES:
        packed = gzip.compress(body, compresslevel=9, mtime=0)
    content_type = TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if content_type.startswith("text/") or content_type.endswith(("json", "xml")):
        content_type += "; charset=utf-8"
    etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
    asset = Asset(key, body, packed, etag, content_type)
    _cache[path] = asset
    return asset


def _resolve(relative: str) -> Path:
    """The file under server/webui/ that `relative` names; 404 for anything else (no escaping the folder)."""
    root = WEBUI_DIR.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root) or not path.is_file() or any(p.startswith(".") for p in path.parts):
        raise errors.not_found(f"File Not Found: {request.path}")
    return path


def _accepts_gzip() -> bool:
    accepted = request.headers.get("Accept-Encoding", "")
    return any(part.split(";")[0].strip() == "gzip" for part in accepted.split(","))


def _serve(relative: str) -> Response:
    if not current_app.config.get(ENABLED_KEY, True):
        raise errors.not_found(f"File Not Found: {request.path} (the web UI is off: --no-webui)")
    asset = _load(_resolve(relative))
    headers = {"ETag": asset.etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
    headers["X-Content-Type-Options"] = "nosniff"
    if relative.endswith(".html"):
        policy = FRAME_CSP if relative == FRAME_PAGE else CSP
        headers |= {"Content-Security-Policy": policy, "Referrer-Policy": "no-referrer"}
    if asset.etag in _etags(request.headers.get("If-None-Match", "")):
        return Response(b"", status=304, headers=headers)
    body = asset.body
    if asset.gzipped is not None and _accepts_gzip():
        body = asset.gzipped
        headers["Content-Encoding"] = "gzip"
    return Response(body, status=200, headers=headers, content_type=asset.content_type)


def _etags(value: str) -> set[str]:
    return {tag.strip().removeprefix("W/") for tag in value.split(",") if tag.strip()}


# Ollama's answer at its root, which its clients probe to find a server (server/apis/ollama/).
OLLAMA_BANNER = "Ollama is running"


@bp.get("/")
async def root() -> Any:
    """The web UI for a client that accepts HTML (browsers, and `Accept: */*`); Ollama's plain-text
    banner for one that does not (no Accept header, as Go's HTTP client sends, or only text/plain)."""
    if not request.accept_mimetypes.accept_html:
        return Response(OLLAMA_BANNER, status=200, content_type="text/plain; charset=utf-8")
    return _serve("index.html")


@bp.get("/index.html")
async def index() -> Any:
    return _serve("index.html")


@bp.get("/assets/<path:relative>")
async def asset(relative: str) -> Any:
    return _serve("assets/" + relative)
