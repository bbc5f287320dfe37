"""/v1/chat/completions/control: act on a running chat completion, named by its `chatcmpl-...` id.

The id is the engine request's id, never a slot number (a slot can be reused between a lookup and the
call), so the call reaches the generation whether its client is still reading or it runs on in a
resumable session.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from engine.api import CONTROL_ACTIONS
from server.chat.schemas import ControlRequest
from server.http import errors
from server.http.request_body import json_body
from server.model.host import current_model

bp = Blueprint("control", __name__)


@bp.post("/v1/chat/completions/control")
@bp.post("/chat/completions/control")
async def control() -> Any:
    model = current_model()
    body = ControlRequest.model_validate(await json_body())
    if body.action not in CONTROL_ACTIONS:
        known = ", ".join(CONTROL_ACTIONS)
        raise errors.invalid_request(f"unknown action {body.action!r}; supported actions: {known}")
    return (await model.client.control(body.id, body.action)).as_dict()
