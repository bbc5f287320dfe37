"""GET /openapi.json: the API's contract (server/apis/openapi/document.py builds it from the routes'
pydantic models)."""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from server.apis.openapi.document import cached_document

bp = Blueprint("openapi", __name__)


@bp.get("/openapi.json")
async def openapi() -> Any:
    return cached_document()
