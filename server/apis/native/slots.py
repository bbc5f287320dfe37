"""/slots: what each slot is doing, as llama-server's `server_slot::to_json` writes it,
/slots/<id>?action=save|restore|erase: a slot's cache to and from files in --slot-save-path, and
/slots/prefixes (Llamba's): the prompt cache's summary and the load a cluster router places requests by."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
from quart import Blueprint, request

from engine.api import SlotSnapshot
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
    slots = model.snapshot().slots
    if request.args.get("fail_on_no_slot") and all(s.is_processing for s in slots):
        raise errors.unavailable("no slot available")
    detokenize = model.prompts.tokenizer.decode if model.settings.slots_debug else None
    return [slot_json(slot, detokenize) for slot in slots]


def slot_json(slot: SlotSnapshot, debug: Callable[[Sequence[int]], str] | None = None) -> dict[str, Any]:
    """One slot in llama-server's shape: a slot that never ran a request has only its identity; once it
    has, the request (running, else the last one, whose progress reads as reset) with its params and
    progress. `n_cached` is Llamba's (its tests and the cluster's read it); `stopping_word`, which
    llama-server's README shows in next_token, stays "": a slot is released as the word is found.
    `debug` (LLAMA_SERVER_SLOTS_DEBUG; detokenizes with special tokens) adds the request's `prompt` and
    `generated` text, as llama-server's slots_debug does."""
    out: dict[str, Any] = {
        "id": slot.id,
        "n_ctx": slot.n_ctx,
        "speculative": slot.speculative,
        "is_processing": slot.is_processing,
        "id_task": slot.id_task,
        "n_cached": slot.n_cached,
    }
    if not slot.has_task:
        return out
    p = slot.progress
    next_token = {
        "has_next_token": p.has_next_token,
        "has_new_line": p.has_new_line,
        "n_remain": p.n_remain,
        "n_decoded": p.n_decoded,
        "stopping_word": "",
    }
    out |= {
        "n_prompt_tokens": slot.n_cached,
        "n_prompt_tokens_processed": p.n_prompt_processed,
        "n_prompt_tokens_cache": p.n_prompt_cached,
        "params": dict(slot.params),
        "next_token": [next_token],
    }
    if debug is not None:
        out |= {"prompt": debug(list(slot.prompt)), "generated": "".join(list(slot.text))}
    return out


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
