"""GET /openapi.json: the API's contract (server/openapi.py builds it from the routes' pydantic models)."""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from quart import Blueprint

from server.openapi import document

bp = Blueprint("openapi", __name__)


@cache
def _document() -> dict[str, Any]:
    try:
        return document(version("llamba"))
    except PackageNotFoundError:
        return document("unknown")


@bp.get("/openapi.json")
async def openapi() -> Any:
    return _document()
