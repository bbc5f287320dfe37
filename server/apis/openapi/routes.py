"""GET /openapi.json: the API's contract (server/apis/openapi/document.py builds it from the routes'
pydantic models)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from quart import Blueprint

from server.apis.openapi.document import document

bp = Blueprint("openapi", __name__)


@cache
def cached_document(router: bool = False) -> dict[str, Any]:
    try:
        return document(version("llamba"), router)
    except PackageNotFoundError:
        return document("unknown", router)


@bp.get("/openapi.json")
async def openapi() -> Any:
    return cached_document()
