"""Ollama's API in router mode: what only the router can answer, and the routing of the rest.

- `GET /api/tags`: every catalogue model whose file is on this machine (server/router/local_models.py),
  loaded or not; `GET /api/ps`: the running children, with when their keep-alive unloads them.
- `POST /api/pull`, `DELETE /api/delete`: the router's downloads (server/router/ollama_pull.py).
- `POST /api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`, `/api/show`: the body's `model`
  looked up under Ollama's rules (`smollm2:latest`, `library/smollm2`: `Catalogue.resolve`), 404 in
  Ollama's words for a name the catalogue lacks, then forwarded to that model's child (loaded on demand)
  with the body as sent, whose own Ollama routes answer (server/apis/ollama/). A name the child would not
  take as its own (a router alias) is sent as the model's id. `keep_alive` sets the model's keep-alive
  (server/router/keep_alive.py; not for a request with `X-Conversation-Id`, forwarded as a conversation);
  with `keep_alive: 0` and nothing to answer (no messages, no prompt) the model is unloaded at once and
  the answer is Ollama's `done_reason: "unload"` object.
- `GET /api/version`: the version the children's API speaks.

Errors are Ollama's `{"error": "..."}` (server/http/error_handlers.py's `/api` prefix).
"""

from __future__ import annotations

import json
import os
import weakref
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
from quart import Blueprint, request

from server.apis.ollama.models import now, rfc3339
from server.apis.ollama.names import parse_name, same_model
from server.apis.ollama.routes import VERSION
from server.apis.openapi.document import OllamaDeleteRequest, OllamaPullRequest
from server.config.parse import parse_settings
from server.http import errors
from server.router.child import Child, inherited_environ
from server.router.front_door import upstreams
from server.router.keep_alive import KeepAliveError, parse_keep_alive
from server.router.local_models import LocalModel, local_model
from server.router.ollama_pull import delete_model, pull_reply
from server.router.pool import Lease
from server.router.state import RUNNING, ModelState

if TYPE_CHECKING:
    from server.router.app import Router

bp = Blueprint("router_ollama", __name__)

KEEPS_ALIVE = ("/api/chat", "/api/generate", "/api/embed", "/api/embeddings")
_slot_contexts: weakref.WeakKeyDictionary[Child, int] = weakref.WeakKeyDictionary()


def ctx() -> Router:
    return upstreams()  # type: ignore[return-value]


def display_name(model_id: str) -> str:
    return parse_name(model_id).full


async def body_object() -> dict[str, Any]:
    """The request's JSON object (Ollama's 400s for none and for another value)."""
    raw = await request.get_data()
    if not raw.strip():
        raise errors.invalid_request("missing request body")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise errors.invalid_request(str(exc)) from None
    if not isinstance(data, dict):
        raise errors.invalid_request("json: cannot unmarshal into a request object")
    return data


def asked_name(data: dict[str, Any]) -> str:
    name = data.get("model") or data.get("name")  # `name`: Ollama's deprecated spelling
    if not isinstance(name, str) or not name.strip():
        raise errors.invalid_request("model is required")
    return name


def catalogue_model(name: str) -> ModelState:
    """The running catalogue's model of that name under Ollama's rules; Ollama's 404 otherwise."""
    router = ctx()
    entry = router.catalogue.resolve(name)
    state = router.pool.states.get(entry.id) if entry is not None else None
    if state is None:
        raise errors.not_found(f"model '{name}' not found")
    return state


# -- what only the router knows ---------------------------------------------------------------------------
@bp.get("/api/version")
async def version() -> Any:
    return {"version": VERSION}


@bp.get("/api/tags")
async def tags() -> Any:
    """The catalogue's models that are here, newest first."""
    entries = [s.entry for s in ctx().pool.states.values() if not s.entry.hidden]
    found = await anyio.to_thread.run_sync(lambda: [(e.id, local_model(e)) for e in entries])
    rows = [_tags_row(model_id, m) for model_id, m in found if m is not None]
    rows.sort(key=lambda row: row.pop("_modified"), reverse=True)
    return {"models": rows}


def _tags_row(model_id: str, found: LocalModel) -> dict[str, Any]:
    name = display_name(model_id)
    return {
        "name": name,
        "model": name,
        "modified_at": rfc3339(datetime.fromtimestamp(found.modified, UTC)),
        "size": found.size,
        "digest": found.digest,
        "details": found.details(),
        "_modified": found.modified,
    }


@bp.get("/api/ps")
async def ps() -> Any:
    """The models whose child runs (loaded, or asleep under --sleep-idle-seconds), the one that stays
    longest first."""
    running = [s for s in ctx().pool.states.values() if s.status in RUNNING and not s.stopping]
    found = await anyio.to_thread.run_sync(lambda: [local_model(s.entry) for s in running])
    rows = [_ps_row(state, m) for state, m in zip(running, found, strict=True)]
    rows.sort(key=lambda row: row.pop("_expires"), reverse=True)
    return {"models": rows}


def _ps_row(state: ModelState, found: LocalModel | None) -> dict[str, Any]:
    info = state.info or {}
    details = found.details() if found is not None else {"format": "gguf", "family": info.get("arch", "")}
    expires = ctx().pool.keep_alive.expires_at(state)
    name = display_name(state.id)
    return {
        "name": name,
        "model": name,
        "size": int(info.get("size") or (found.size if found else 0)),
        "digest": found.digest if found is not None else "",
        "details": details,
        "expires_at": rfc3339(datetime.fromtimestamp(expires, UTC)),
        "size_vram": 0,  # the child's backend is not told to the router
        "context_length": slot_context(state, found),
        "_expires": expires,
    }


def slot_context(state: ModelState, found: LocalModel | None) -> int:
    """A request's context on the model's child (its n_ctx_slot), from the flags it was started with."""
    child = state.child
    if child is None:
        return 0
    if child not in _slot_contexts:
        environ = {**inherited_environ(os.environ), **dict(state.entry.env)}
        try:
            settings = parse_settings(child.args[1:], environ)[0]
        except SystemExit:
            return 0
        trained = int((state.info or {}).get("n_ctx_train") or (found.facts.context_length if found else 0))
        n_ctx = settings.ctx_size or trained
        _slot_contexts[child] = n_ctx if settings.kv_unified else n_ctx // max(settings.parallel, 1)
    return _slot_contexts[child]


@bp.post("/api/pull")
async def pull() -> Any:
    body = OllamaPullRequest.model_validate(await body_object())
    return await pull_reply(ctx(), asked_name(body.model_dump()), body.stream is not False)


@bp.delete("/api/delete")
async def delete() -> Any:
    body = OllamaDeleteRequest.model_validate(await body_object())
    await delete_model(ctx(), asked_name(body.model_dump()))
    return "", 200


# -- forwarded to the model's child ----------------------------------------------------------------------
@bp.post("/api/chat")
@bp.post("/api/generate")
@bp.post("/api/embed")
@bp.post("/api/embeddings")
@bp.post("/api/show")
async def forward() -> Any:
    data = await body_object()
    name = asked_name(data)
    state = catalogue_model(name)
    seconds = _keep_alive(data) if request.path in KEEPS_ALIVE else None
    if seconds == 0 and _nothing_to_answer(data):
        await _unload_now(state)
        return _unloaded(name)
    body = await request.get_data()
    if not same_model(name, state.id) and name != state.id:  # a router alias: the child knows its id only
        body = json.dumps({**data, "model": state.id}).encode()

    def bind(lease: Lease) -> None:
        if request.path in KEEPS_ALIVE:
            ctx().pool.keep_alive.set(lease.state, seconds)

    return await ctx().forwarder.proxy_to(state, body, bind)


def _keep_alive(data: dict[str, Any]) -> float | None:
    value = data.get("keep_alive")
    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except KeepAliveError as exc:
        raise errors.invalid_request(str(exc)) from None


def _nothing_to_answer(data: dict[str, Any]) -> bool:
    """Ollama unloads instead of answering a chat without messages, a generate without a prompt."""
    if request.path == "/api/chat":
        return not data.get("messages")
    return request.path == "/api/generate" and not data.get("prompt")


async def _unload_now(state: ModelState) -> None:
    """Stop the model's child now; one busy with requests stops when they end."""
    pool = ctx().pool
    if state.child is None:
        return
    if state.idle:
        await pool.stop(state, reason="keep_alive")
    else:
        pool.keep_alive.set(state, 0)


def _unloaded(name: str) -> dict[str, Any]:
    reply: dict[str, Any] = {"model": name, "created_at": now()}
    if request.path == "/api/chat":
        reply["message"] = {"role": "assistant", "content": ""}
    else:
        reply["response"] = ""
    return reply | {"done": True, "done_reason": "unload"}
