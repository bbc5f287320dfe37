"""The front door the router and the cluster share: the routes both serve in front of their model servers,
defined once. `/health`, `/models` (and `/v1/...`), `/props`, `/metrics`, the conversation routes
(`/v1/stream` resume and stop, `/v1/streams/lookup`, the control endpoint) and the catch-all proxy of
every other request.

What differs between the two is behind the `Upstreams` each app installs: the router's
(`server/router/app.py`: one child process per loaded model, loaded on demand) and the cluster's
(`server/cluster/app.py`: Ray-placed replicas of its models). The front door parses and checks the
request, says the errors both say alike, and walks the owners of conversations; the upstreams say which
server a request goes to and how it gets there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from quart import Blueprint, Quart, Response, current_app, request
from quart.typing import ResponseReturnValue

from server.config.settings import Settings
from server.http import errors
from server.router.metrics import CONTENT_TYPE

UPSTREAMS_KEY = "llamba.upstreams"
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
RETRY_AFTER_S = 1

# The server that holds a conversation: the router's model (its `ModelState`), a cluster's replica.
Owner = TypeVar("Owner")

bp = Blueprint("front_door", __name__)


class Upstreams(Protocol[Owner]):
    """What the front door asks of the servers behind it."""

    settings: Settings
    answers_preflight: bool  # a CORS preflight is answered here (the router's CORS), not proxied
    no_completion: str  # the control endpoint's answer when no server knows the completion

    def unavailable(self) -> errors.APIError | None:
        """Why /health is not ok yet; None when it is."""

    async def listing(self, reload: bool) -> list[dict[str, Any]]:
        """GET /models' entries; `reload` (`?reload=1`): rescan the models first, where they can be."""

    async def props(self, model: str | None) -> ResponseReturnValue:
        """GET /props, of the `?model=` (the query's value, empty or None when not given)."""

    async def model_metrics(self, model: str) -> ResponseReturnValue | None:
        """GET /metrics?model=: that model's server's own answer, or None for the aggregate of it."""

    async def metrics(self, model: str | None) -> str:
        """The aggregate /metrics text (every model's, or `model`'s only)."""

    def owner(self, conversation: str) -> Owner | None:
        """The running server that holds the conversation, if any."""

    def resumable(self, conversation: str) -> Owner | None:
        """Where a resume of the conversation goes; None: no stream; an APIError (503 with Retry-After)
        while its owner is not up yet."""

    def cancel_parked(self, conversation: str) -> bool:
        """Cancel the conversation's request waiting for its model, if one is (a stop); True if one was."""

    def owner_name(self, owner: Owner) -> str:
        """A name that tells owners apart."""

    def serving(self) -> list[Owner]:
        """The servers a running completion may be on, in the order to ask them."""

    async def send(self, owner: Owner, body: bytes) -> Response:
        """The request, with this body, to the owner; its answer streamed back."""

    async def ask(self, owner: Owner, payload: bytes) -> Any:
        """One JSON call on the request's route to the owner: its answer, parsed."""

    async def lookup(self, owner: Owner, payload: bytes) -> Iterable[Any]:
        """The owner's answer to a /v1/streams/lookup of `payload`, as the items it adds to the reply."""

    async def control_payload(self) -> bytes:
        """The body the control endpoint sends to each server."""

    async def proxy(self, body: bytes) -> ResponseReturnValue:
        """Any other request, to a server of its model."""


def install_front_door(app: Quart, upstreams: Upstreams[Any]) -> None:
    """Serve the front door's routes on `app` in front of `upstreams`. Registered after every other
    route of the app: its catch-all takes what they do not."""
    app.extensions[UPSTREAMS_KEY] = upstreams
    app.register_blueprint(bp)


def upstreams(app: Quart | None = None) -> Upstreams[Any]:
    """The upstreams of `app` (else of the app answering the current request): the router's `Router`,
    the cluster's `Cluster`."""
    return (app or current_app).extensions[UPSTREAMS_KEY]


def retry_later(message: str) -> errors.APIError:
    """A 503 that says when to try again (a model still loading, no replica ready yet)."""
    headers = {"Retry-After": str(RETRY_AFTER_S)}
    return errors.APIError(503, message, "unavailable_error", headers=headers)


def as_reply(err: errors.APIError) -> tuple[dict[str, Any], int, dict[str, str]]:
    """The error as a route's own answer: OpenAI's shape on every path (raised, the error handlers would
    give `/v1/messages` Anthropic's)."""
    return err.body(), err.status, err.headers


def json_body(body: bytes) -> dict[str, Any] | None:
    """The request's body as a JSON object, if it is one (of a POST, PUT or PATCH)."""
    if not body or request.method not in ("POST", "PUT", "PATCH"):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


class Upstream(Protocol):
    """An upstream's streamed answer as both apps' clients return it."""

    async def aread(self) -> bytes: ...

    async def aclose(self) -> None: ...


async def read_json(upstream: Upstream) -> Any:
    """An upstream's whole answer as JSON, the connection given back however it ends."""
    try:
        return json.loads(await upstream.aread())
    finally:
        await upstream.aclose()


def conversation_id() -> str:
    conversation = request.args.get("conv_id")
    if not conversation:
        raise errors.invalid_request("missing query parameter 'conv_id'")
    return conversation


@bp.get("/health")
@bp.get("/v1/health")
async def health() -> Any:
    err = upstreams().unavailable()
    return as_reply(err) if err is not None else {"status": "ok"}


@bp.get("/models")
@bp.get("/v1/models")
async def models() -> Any:
    """The models and their state; `?reload=1` rescans them first (llama-server's)."""
    return {"object": "list", "data": await upstreams().listing(bool(request.args.get("reload")))}


@bp.get("/props")
async def props() -> Any:
    return await upstreams().props(request.args.get("model"))


@bp.get("/metrics")
async def metrics() -> Any:
    """Every model's metrics labelled by model, with the front door's own; `?model=` that model's."""
    door = upstreams()
    model = request.args.get("model")
    if model:
        own = await door.model_metrics(model)
        if own is not None:
            return own
    if not door.settings.metrics:
        raise errors.not_supported("This server does not support metrics endpoint.")
    return Response(await door.metrics(model or None), content_type=CONTENT_TYPE)


# -- conversations ---------------------------------------------------------------------------------------
@bp.get("/v1/stream")
async def resume() -> Any:
    door = upstreams()
    owner = door.resumable(conversation_id())
    if owner is None:  # never seen, expired, or its server died with its session
        raise errors.not_found("Stream not found or expired")
    return await door.send(owner, b"")


@bp.delete("/v1/stream")
async def stop() -> Any:
    door = upstreams()
    conversation = conversation_id()
    if door.cancel_parked(conversation):
        return "", 204
    owner = door.owner(conversation)
    if owner is None:
        return "", 204
    return await door.send(owner, b"")


@bp.post("/v1/streams/lookup")
async def lookup() -> Any:
    """Each running owner's own answer for its conversations, in one list."""
    door = upstreams()
    body = await request.get_json(force=True, silent=True)
    ids = body.get("conversation_ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise errors.invalid_request('the body must be JSON: {"conversation_ids": [string, ...]}')
    by_owner: dict[str, tuple[Any, list[str]]] = {}
    for conversation in ids:
        owner = door.owner(conversation)
        if owner is not None:
            by_owner.setdefault(door.owner_name(owner), (owner, []))[1].append(conversation)
    found: list[Any] = []
    for owner, conversations in by_owner.values():
        found += await door.lookup(owner, json.dumps({"conversation_ids": conversations}).encode())
    return found


@bp.post("/v1/chat/completions/control")
@bp.post("/chat/completions/control")
async def control() -> Any:
    """A running completion is named by its id, which only its server knows: ask each serving one."""
    door = upstreams()
    payload = await door.control_payload()
    answer: Any = {"success": False, "message": door.no_completion}
    for owner in door.serving():
        answer = await door.ask(owner, payload)
        if isinstance(answer, dict) and answer.get("success"):
            return answer
        if isinstance(answer, dict) and "error" in answer:
            return answer, answer["error"].get("code", 400)
    return answer


# -- the proxy -------------------------------------------------------------------------------------------
@bp.route("/", methods=ALL_METHODS, defaults={"path": ""})
@bp.route("/<path:path>", methods=ALL_METHODS)
async def catch_all(path: str) -> Any:
    door = upstreams()
    if request.method == "OPTIONS" and door.answers_preflight:  # install_cors adds the headers; no load
        return Response("", 200)
    return await door.proxy(await request.get_data())
