"""/v1/chat/completions/control: act on a running chat completion, named by its `chatcmpl-...` id.

The id is the engine request's id, never a slot number (a slot can be reused between a lookup and the
call), so the call reaches the generation whether its client is still reading or it runs on in a
resumable session.
"""

from __future__ import annotations

import asyncio
from typing import Any

from quart import Blueprint, current_app, request

from engine.text.reasoning import CONTROL_ACTIONS, ControlResult
from server import errors
from server.schemas import ControlRequest
from server.service import ModelService

bp = Blueprint("control", __name__)

# The engine answers at its next step; this only bounds the wait if it is stopping and never will.
CONTROL_TIMEOUT = 10.0


def service() -> ModelService:
    return current_app.extensions["llamba"]


@bp.post("/v1/chat/completions/control")
@bp.post("/chat/completions/control")
async def control() -> Any:
    svc = service()
    body = ControlRequest.model_validate(await request.get_json(force=True))
    if body.action not in CONTROL_ACTIONS:
        known = ", ".join(CONTROL_ACTIONS)
        raise errors.invalid_request(f"unknown action {body.action!r}; supported actions: {known}")
    _, engine = svc.require_ready()
    future = asyncio.wrap_future(engine.control(body.id, body.action))
    try:
        result = await asyncio.wait_for(future, CONTROL_TIMEOUT)
    except TimeoutError:
        result = ControlResult(False, "the engine did not answer in time")
    return result.as_dict()
