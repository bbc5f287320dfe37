"""How a request reaches the router's child: a lease on its model (waiting for its load, or for room),
then the request as the client sent it, its answer streamed back (`server/router/proxy.py`).

A chat with `X-Conversation-Id` goes to its model's child too (which keeps the session), but through a
task of its own, parked in `server/router/conversations.py` while the model loads: a client that leaves
and reloads does not cancel it (the child gets it once up and generates the whole answer into its
session), a resume answers 503 with `Retry-After` meanwhile, and a stop cancels the parked request (which
answers 400).

`LLAMA_SERVER_DEBUG_FAKE_TIMING` (llama-server's test knob, set by its test suite): each request holds its
model's lease two seconds before it is sent, so a test can see a model busy and the queue behind it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from quart import Response, request

from server.http import errors
from server.router.conversations import CONVERSATION_HEADER, Conversations, Parked
from server.router.front_door import read_json
from server.router.pool import Lease, ModelPool
from server.router.proxy import client_response, discard, open_upstream
from server.router.state import ModelState
from server.router.upstream import UpstreamClient, UpstreamResponse

STOPPED_WHILE_LOADING = "request cancelled by a stop while the model was loading"
FAKE_TIMING_S = 2.0 if os.environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING") else 0.0


def request_target() -> str:
    """The request's path and query as the client sent them (still percent-encoded)."""
    raw = request.scope.get("raw_path") or quote(request.path).encode()
    query = request.query_string
    return (raw + b"?" + query if query else raw).decode("latin-1")


@dataclass
class Forwarder:
    """The router's way to its children: their pool, the conversations' owners, the HTTP client and the
    secret every child's API key is (only the router can call them)."""

    pool: ModelPool
    conversations: Conversations
    client: UpstreamClient
    secret: str
    models_autoload: bool  # --models-autoload: a request for an unloaded model loads it

    async def send(self, lease: Lease, body: bytes) -> UpstreamResponse:
        """The request, with this body, to the lease's child; its answer's head."""
        lease.state.requests += 1
        if FAKE_TIMING_S:
            await asyncio.sleep(FAKE_TIMING_S)  # the model counts as busy meanwhile (llama-server's)
        return await open_upstream(
            self.client, lease, request.method, request_target(), request.headers, body, self.secret
        )

    async def proxy_to(
        self, state: ModelState, body: bytes, on_lease: Callable[[Lease], None] | None = None
    ) -> Response:
        """The request to its model's child, the child's answer streamed back to the client; `on_lease`
        hears of the lease before the request is sent (Ollama's keep_alive binds to its child)."""
        conversation = request.headers.get(CONVERSATION_HEADER)
        if conversation and request.method == "POST":
            return await self.forward_conversation(state, conversation, body, self._autoload())
        lease = await self.pool.acquire(state, self._autoload())
        try:
            if on_lease is not None:
                on_lease(lease)
            upstream = await self.send(lease, body)
        except BaseException:
            lease.release()
            raise
        return client_response(upstream, lease)

    async def ask(self, state: ModelState, payload: bytes) -> Any:
        """One JSON call to a running child, as the router (the client's own path), never loading it."""
        lease = await self.pool.acquire(state, autoload=False)
        try:
            return await read_json(await self.send(lease, payload))
        finally:
            lease.release()

    def _autoload(self) -> bool:
        value = request.args.get("autoload")
        if value is None:
            return self.models_autoload
        return value.lower() in ("1", "true", "yes")

    async def forward_conversation(
        self, state: ModelState, conversation: str, body: bytes, autoload: bool
    ) -> Response:
        parked = self.conversations.park(conversation, state.id)
        send = self._wait_and_send(state, conversation, parked, body, autoload)
        task = asyncio.get_running_loop().create_task(send)
        try:
            lease, upstream = await asyncio.shield(task)
        except asyncio.CancelledError:  # the client left: the request goes on, nobody reads its answer here
            task.add_done_callback(_discard_result)
            raise
        return client_response(upstream, lease)

    async def _wait_and_send(
        self, state: ModelState, conversation: str, parked: Parked, body: bytes, autoload: bool
    ) -> tuple[Lease, UpstreamResponse]:
        """Wait for the model (or a stop), then send; the conversation stays parked until the child has it."""
        try:
            acquiring = asyncio.ensure_future(self.pool.acquire(state, autoload))
            stopping = asyncio.ensure_future(parked.stopped.wait())
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not acquiring.done():
                acquiring.cancel()
                raise errors.invalid_request(STOPPED_WHILE_LOADING)
            lease = acquiring.result()
            try:
                return lease, await self.send(lease, body)
            except BaseException:
                lease.release()
                raise
        finally:
            self.conversations.unpark(conversation, parked)


def _discard_result(task: asyncio.Task[tuple[Lease, UpstreamResponse]]) -> None:
    if task.cancelled() or task.exception() is not None:
        return
    lease, upstream = task.result()
    asyncio.get_running_loop().create_task(discard(upstream, lease))
