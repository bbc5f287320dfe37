"""/slots: what each slot is doing (llama-server's shape, the fields that apply here), and
/slots/<id>?action=save|restore|erase: a slot's cache to and from files in --slot-save-path."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, request

from server import errors
from server.request_body import json_body
from server.schemas import SlotActionRequest
from server.service import service

bp = Blueprint("slots", __name__)


@bp.get("/slots")
async def slots() -> Any:
    svc = service()
    if not svc.settings.slots:
        raise errors.not_supported("This server does not support slots endpoint.")
    return [slot.as_dict() for slot in svc.snapshot().slots]


@bp.post("/slots/<id_slot>")
async def slot_action(id_slot: str) -> Any:
    svc = service()
    action = request.args.get("action", "")
    body = SlotActionRequest.model_validate(await json_body(optional=True) or {})
    return await svc.slot_action(_slot_id(id_slot), action, body.filename)


def _slot_id(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise errors.invalid_request(f"Invalid slot id {value!r}") from None
