"""Resumable conversations across the router: a chat with `X-Conversation-Id` goes to its model's child
(which keeps the session) and the router remembers the owner, so `/v1/stream` (resume, stop),
`/v1/streams/lookup` and the control endpoint reach it.

While the owner loads, the chat is parked in a task of its own: a client that leaves and reloads does not
cancel it (the child gets it once up and generates the whole answer into its session), a resume answers
503 with `Retry-After`, and a stop cancels the parked request (which answers 400).
"""

from __future__ import annotations

import asyncio
from typing import Any

from quart import Blueprint, Response, request

from server.http import errors
from server.router.app import Router, proxy_to, router
from server.router.conversations import Parked
from server.router.pool import Lease
from server.router.proxy import client_response, discard
from server.router.state import RUNNING, ModelState
from server.router.upstream import UpstreamResponse

bp = Blueprint("router_streams", __name__)

RETRY_AFTER_S = 1
STOPPED_WHILE_LOADING = "request cancelled by a stop while the model was loading"


async def forward_conversation(
    ctx: Router, state: ModelState, conversation: str, body: bytes, autoload: bool
) -> Response:
    parked = ctx.conversations.park(conversation, state.id)
    send = _wait_and_send(ctx, state, conversation, parked, body, autoload)
    task = asyncio.get_running_loop().create_task(send)
    try:
        lease, upstream = await asyncio.shield(task)
    except asyncio.CancelledError:  # the client left: the request goes on, nobody reads its answer here
        task.add_done_callback(_discard_result)
        raise
    return client_response(upstream, lease)


async def _wait_and_send(
    ctx: Router, state: ModelState, conversation: str, parked: Parked, body: bytes, autoload: bool
) -> tuple[Lease, UpstreamResponse]:
    """Wait for the model (or a stop), then send; the conversation stays parked until the child has it."""
    try:
        acquiring = asyncio.ensure_future(ctx.pool.acquire(state, autoload))
        stopping = asyncio.ensure_future(parked.stopped.wait())
        await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not acquiring.done():
            acquiring.cancel()
            raise errors.invalid_request(STOPPED_WHILE_LOADING)
        lease = acquiring.result()
        try:
            return lease, await ctx.forward(lease, body)
        except BaseException:
            lease.release()
            raise
    finally:
        ctx.conversations.unpark(conversation, parked)


def _discard_result(task: asyncio.Task[tuple[Lease, UpstreamResponse]]) -> None:
    if task.cancelled() or task.exception() is not None:
        return
    lease, upstream = task.result()
    asyncio.get_running_loop().create_task(discard(upstream, lease))


def _conversation_id() -> str:
    conversation = request.args.get("conv_id")
    if not conversation:
        raise errors.invalid_request("missing query parameter 'conv_id'")
    return conversation


def _owner(ctx: Router, conversation: str) -> ModelState | None:
    model_id = ctx.conversations.owner(conversation)
    return ctx.pool.states.get(model_id) if model_id else None


@bp.get("/v1/stream")
async def resume() -> Any:
    ctx = router()
    conversation = _conversation_id()
    owner = _owner(ctx, conversation)
    if owner is None:
        raise errors.not_found("Stream not found or expired")
    if ctx.conversations.parked(conversation) is not None or owner.status not in RUNNING or owner.stopping:
        if owner.child is None and ctx.conversations.parked(conversation) is None:
            raise errors.not_found("Stream not found or expired")  # its child is gone, and its session
        err = errors.unavailable("model is loading")
        return err.body(), err.status, {"Retry-After": str(RETRY_AFTER_S)}
    return await proxy_to(owner, b"")


@bp.delete("/v1/stream")
async def stop() -> Any:
    ctx = router()
    conversation = _conversation_id()
    parked = ctx.conversations.parked(conversation)
    if parked is not None:
        parked.stopped.set()
        return "", 204
    owner = _owner(ctx, conversation)
    if owner is None or owner.status not in RUNNING:
        return "", 204
    return await proxy_to(owner, b"")


@bp.post("/v1/streams/lookup")
async def lookup() -> Any:
    """Each running owner's own answer for its conversations, in one list."""
    ctx = router()
    body = await request.get_json(force=True, silent=True)
    ids = body.get("conversation_ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise errors.invalid_request('the body must be JSON: {"conversation_ids": [string, ...]}')
    by_owner: dict[str, list[str]] = {}
    for conversation in ids:
        owner = _owner(ctx, conversation)
        if owner is not None and owner.status in RUNNING:
            by_owner.setdefault(owner.id, []).append(conversation)
    found: list[Any] = []
    for model_id, conversations in by_owner.items():
        found += await _ask(ctx, ctx.pool.states[model_id], {"conversation_ids": conversations})
    return found


@bp.post("/v1/chat/completions/control")
@bp.post("/chat/completions/control")
async def control() -> Any:
    """A running completion is named by its id, which only its child knows: ask each running child."""
    ctx = router()
    body = await request.get_json(force=True, silent=True)
    answer: Any = {"success": False, "message": "no running model has this completion"}
    for state in [s for s in ctx.pool.states.values() if s.status in RUNNING and not s.stopping]:
        answer = await _ask(ctx, state, body)
        if isinstance(answer, dict) and answer.get("success"):
            return answer
        if isinstance(answer, dict) and "error" in answer:
            return answer, answer["error"].get("code", 400)
    return answer


async def _ask(ctx: Router, state: ModelState, payload: Any) -> Any:
    """One JSON call to a running child, as the router (the client's own body and path)."""
    import json

    lease = await ctx.pool.acquire(state, autoload=False)
    try:
        upstream = await ctx.forward(lease, json.dumps(payload).encode())
        try:
            return json.loads(await upstream.aread())
        finally:
            await upstream.aclose()
    finally:
        lease.release()
