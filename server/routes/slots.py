"""/slots: what each slot is doing (llama-server's shape, the fields that apply here), and
/slots/<id>?action=save|restore|erase: a slot's cache to and from files in --slot-save-path."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from quart import Blueprint, current_app, request

from engine.slot_files import SlotBusyError, SlotFileError, check_filename
from server import errors
from server.service import ModelService

bp = Blueprint("slots", __name__)

SLOT_ACTIONS = ("save", "restore", "erase")
# The engine answers between two steps; this only bounds the wait if it is stopping and never will.
ACTION_TIMEOUT = 60.0


@bp.get("/slots")
async def slots() -> Any:
    svc: ModelService = current_app.extensions["llamba"]
    if not svc.settings.slots:
        raise errors.not_supported("This server does not support slots endpoint.")
    _, engine = svc.require_ready()
    return engine.stats()


@bp.post("/slots/<id_slot>")
async def slot_action(id_slot: str) -> Any:
    svc: ModelService = current_app.extensions["llamba"]
    save_dir = svc.settings.slot_save_path
    if save_dir is None:
        raise errors.not_supported(
            "This server does not support slots action. Start it with `--slot-save-path`"
        )
    _, engine = svc.require_ready()
    slot_id = _slot_id(id_slot, len(engine.scheduler.slots))
    action = request.args.get("action", "")
    if action not in SLOT_ACTIONS:
        raise errors.invalid_request("Invalid action")
    path = None
    if action != "erase":
        body = await request.get_json(force=True, silent=True)
        filename = body.get("filename") if isinstance(body, dict) else None
        try:
            path = Path(save_dir) / check_filename(filename)
        except SlotFileError as exc:
            raise errors.invalid_request(str(exc)) from None
    try:
        if action == "save":
            Path(save_dir).mkdir(parents=True, exist_ok=True)
        return await asyncio.wait_for(
            asyncio.wrap_future(engine.slot_action(slot_id, action, path)), ACTION_TIMEOUT
        )
    except SlotFileError as exc:
        raise errors.invalid_request(str(exc)) from None
    except SlotBusyError as exc:
        raise errors.unavailable(str(exc)) from None
    except OSError as exc:  # the save directory is missing or not writable
        raise errors.APIError(500, f"failed to save slot: {exc.strerror}", "server_error") from None


def _slot_id(value: str, n_slots: int) -> int:
    try:
        slot_id = int(value)
    except ValueError:
        raise errors.invalid_request(f"Invalid slot id {value!r}") from None
    if not 0 <= slot_id < n_slots:
        raise errors.invalid_request(f"Invalid slot id {slot_id}: the server has {n_slots} slots")
    return slot_id
