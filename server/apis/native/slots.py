"""/slots: what each slot is doing (llama-server's shape, the fields that apply here),
/slots/<id>?action=save|restore|erase: a slot's cache to and from files in --slot-save-path, and
/slots/prefixes (Llamba's): the prompt cache's summary and the load a cluster router places requests by."""

from __future__ import annotations

from typing import Any

import anyio
from quart import Blueprint, request

from server.chat.schemas import SlotActionRequest
from server.http import errors
from server.http.request_body import json_body
from server.model.host import current_model
from server.model.prefixes import BLOCK_TOKENS, summary_hashes

bp = Blueprint("slots", __name__)


@bp.get("/slots")
async def slots() -> Any:
    model = current_model()
    if not model.settings.slots:
        raise errors.not_supported("This server does not support slots endpoint.")
    return [slot.as_dict() for slot in model.snapshot().slots]


@bp.get("/slots/prefixes")
async def prefixes() -> Any:
    """The block-prefix hashes of every prompt the slots and the host cache hold (server/cluster/
    prefixes.py), with the queue and busy slots: what a cluster router needs to place a new request."""
    model = current_model()
    prompts = await model.cached_prompts()
    hashes = await anyio.to_thread.run_sync(summary_hashes, prompts)
    snapshot = model.snapshot() if model.ready else None
    return {
        "block_tokens": BLOCK_TOKENS,
        "hashes": sorted(hashes),
        "n_slots": len(snapshot.slots) if snapshot else 0,
        "n_busy": snapshot.n_busy if snapshot else 0,
        "n_waiting": snapshot.n_waiting if snapshot else 0,
    }


@bp.post("/slots/<id_slot>")
async def slot_action(id_slot: str) -> Any:
    model = current_model()
    action = request.args.get("action", "")
    body = SlotActionRequest.model_validate(await json_body(optional=True) or {})
    slot_id = _slot_id(id_slot)
    return await model.client.slot_action(slot_id, action, body.filename)


def _slot_id(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise errors.invalid_request(f"Invalid slot id {value!r}") from None
