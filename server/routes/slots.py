"""/slots: what each slot is doing (llama-server's shape, the fields that apply here)."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, current_app

from server import errors
from server.service import ModelService

bp = Blueprint("slots", __name__)


@bp.get("/slots")
async def slots() -> Any:
    svc: ModelService = current_app.extensions["llamba"]
    if not svc.settings.slots:
        raise errors.not_supported("This server does not support slots endpoint.")
    _, engine = svc.require_ready()
    return engine.stats()
