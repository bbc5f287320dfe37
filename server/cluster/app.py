"""The cluster router's Quart app: one address in front of the Ray-placed replicas of its models.

Its own routes: `/health` (200 once every model has a ready replica), `/models` (each model, its
replicas' state and its autoscaling), `/props`, `/metrics` (`server/cluster/metrics.py`); the
conversation routes (`/v1/stream` resume and stop, `/v1/streams/lookup`, the control endpoint) go to the
replica that owns the conversation. Every other request is proxied over HTTP, unbuffered
(`server/router/proxy.py`), to a replica of its model (the body's `model`, else the `model` query
parameter, else the default model, as router mode chooses): a request with `X-Conversation-Id` to its
owner, a new one where `server/cluster/placement.py` puts it. A replica that cannot be reached is marked
down and the request goes to another one (nothing was generated for it yet).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import structlog
from quart import Blueprint, Quart, Response, current_app, request

from server.cluster import metrics as cluster_metrics
from server.cluster.autoscale import ScalePolicy
from server.cluster.fleet import Fleet, ReplicaHandle, ReplicaLease
from server.cluster.placement import Replica, least_loaded
from server.config.settings import Settings
from server.http import errors
from server.http.auth import install_auth
from server.http.error_handlers import install_error_handlers
from server.model.prefixes import block_hashes
from server.router.catalogue import ModelEntry
from server.router.conversations import CONVERSATION_HEADER
from server.router.proxy import client_response, new_client, open_upstream
from server.router.upstream import UpstreamClient, UpstreamResponse

log = structlog.get_logger("cluster")

CLUSTER_KEY = "llamba.cluster"
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
CHAT_PATHS = {"/v1/chat/completions", "/chat/completions"}
COMPLETION_PATHS = {"/v1/completions", "/completions", "/completion"}
RETRY_AFTER_S = 1
REPLICA_HEADER = "X-Llamba-Replica"
TOKENIZE_TIMEOUT_S = 5.0

bp = Blueprint("cluster", __name__)


@dataclass
class Cluster:
    settings: Settings
    entries: dict[str, ModelEntry]  # the served models, by id
    fleets: dict[str, Fleet]  # their replicas, by model id
    default_id: str  # the model of a request that names none
    client: httpx.AsyncClient  # health polls and /tokenize
    upstream: UpstreamClient  # the proxied requests (server/router/upstream.py)
    secret: str
    address: str

    def fleet_named(self, name: str | None) -> Fleet:
        """The fleet of the model called `name` (its id or an alias), the default one for None; 400."""
        if not name:
            return self.fleets[self.default_id]
        for entry in self.entries.values():
            if name in entry.names():
                return self.fleets[entry.id]
        served = ", ".join(sorted(self.entries))
        raise errors.invalid_request(f"model '{name}' not found: this cluster serves {served}")

    def owner(self, conversation: str) -> tuple[Fleet, Replica] | None:
        for fleet in self.fleets.values():
            replica = fleet.owner(conversation)
            if replica is not None:
                return fleet, replica
        return None

    async def forward(self, lease: ReplicaLease, method: str, path: str, body: bytes) -> UpstreamResponse:
        return await open_upstream(self.upstream, lease, method, path, request.headers, body, self.secret)


def cluster() -> Cluster:
    return current_app.extensions[CLUSTER_KEY]


def create_cluster_app(
    settings: Settings,
    models: list[tuple[ModelEntry, Callable[[], ReplicaHandle], ScalePolicy, int]],
    secret: str,
    address: str,
) -> Quart:
    """`models`: each served model's entry, how to start one replica of it, its scaling policy and
    initial replica count; the first is the default model."""
    app = Quart("llamba-cluster")
    # No read timeout (a generation streams as long as it runs), no proxy from the environment.
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), trust_env=False)
    fleets = {
        entry.id: Fleet(
            entry.id,
            spawn,
            client,
            secret,
            scaling,
            initial,
            policy=settings.placement,
            conversation_ttl_s=settings.stream_ttl,
        )
        for entry, spawn, scaling, initial in models
    }
    entries = {entry.id: entry for entry, *_ in models}
    ctx = Cluster(settings, entries, fleets, models[0][0].id, client, new_client(), secret, address)
    app.extensions[CLUSTER_KEY] = ctx
    app.register_blueprint(bp)
    install_auth(app, settings.api_keys)
    install_error_handlers(app)

    @app.before_serving
    async def start_fleets() -> None:
        for fleet in ctx.fleets.values():
            fleet.start()

    @app.after_serving
    async def stop_fleets() -> None:
        await asyncio.gather(*(fleet.stop() for fleet in ctx.fleets.values()))
        await client.aclose()
        await ctx.upstream.aclose()

    return app


def _unavailable(model: str) -> tuple[dict[str, Any], int, dict[str, str]]:
    err = errors.unavailable(f"no replica of '{model}' is ready")
    return err.body(), err.status, {"Retry-After": str(RETRY_AFTER_S)}


# -- the cluster's own routes ----------------------------------------------------------------------------
@bp.get("/health")
@bp.get("/v1/health")
async def health() -> Any:
    for fleet in cluster().fleets.values():
        if not fleet.ready:
            return _unavailable(fleet.model_id)
    return {"status": "ok"}


def _listing(ctx: Cluster, fleet: Fleet) -> dict[str, Any]:
    entry = ctx.entries[fleet.model_id]
    item: dict[str, Any] = {"id": entry.id, "object": "model", "owned_by": "llamba", "created": 0}
    item |= {"aliases": list(entry.aliases), "path": entry.model}
    item["status"] = {"value": "loaded" if fleet.ready else "loading"}
    item["cluster"] = {
        "address": ctx.address,
        "placement": ctx.settings.placement,
        "placed": dict(fleet.placed),
        "retries": fleet.retries,
    }
    decision = fleet.last_decision
    item["scaling"] = {
        "min": fleet.scaling.min_replicas,
        "max": fleet.scaling.max_replicas,
        "current": fleet.current,
        "desired": decision.desired if decision else fleet.current,
        "last_decision": {"action": decision.action, "reason": decision.reason} if decision else None,
        "decisions": dict(fleet.decisions),
    }
    item["replicas"] = [r.listing() for r in fleet.replicas]
    return item


@bp.get("/models")
@bp.get("/v1/models")
async def models() -> Any:
    ctx = cluster()
    return {"object": "list", "data": [_listing(ctx, fleet) for fleet in ctx.fleets.values()]}


@bp.get("/metrics")
async def metrics() -> Any:
    """The cluster's own metrics and every live replica's, labelled by model and replica; `?model=`
    only that model's."""
    ctx = cluster()
    if not ctx.settings.metrics:
        raise errors.not_supported("This server does not support metrics endpoint.")
    name = request.args.get("model")
    fleets = [ctx.fleet_named(name)] if name else list(ctx.fleets.values())
    text = await cluster_metrics.aggregate(fleets, ctx.upstream, ctx.secret)
    return Response(text, content_type=cluster_metrics.CONTENT_TYPE)


@bp.get("/props")
async def props() -> Any:
    """The least loaded replica's props of the `?model=` (else the default model): a model server's,
    as the web UI treats the cluster as one server, with the cluster's own fields."""
    ctx = cluster()
    fleet = ctx.fleet_named(request.args.get("model"))
    own = {"cluster": "ray", "replicas": len(fleet.replicas), "model_alias": fleet.model_id}
    replica = least_loaded(fleet.replicas)
    if replica is None:
        return _unavailable(fleet.model_id)
    lease = fleet.lease(replica)
    try:
        upstream = await ctx.forward(lease, "GET", "/props", b"")
        child = json.loads(await upstream.aread()) if upstream.status_code == 200 else {}
        await upstream.aclose()
    finally:
        lease.release()
    return child | own


# -- conversations ---------------------------------------------------------------------------------------
def _conversation_id() -> str:
    conversation = request.args.get("conv_id")
    if not conversation:
        raise errors.invalid_request("missing query parameter 'conv_id'")
    return conversation


@bp.get("/v1/stream")
async def resume() -> Any:
    ctx = cluster()
    owner = ctx.owner(_conversation_id())
    if owner is None:  # never seen, expired, or its replica died with its session
        raise errors.not_found("Stream not found or expired")
    return await _send_to(ctx, *owner, b"")


@bp.delete("/v1/stream")
async def stop() -> Any:
    ctx = cluster()
    owner = ctx.owner(_conversation_id())
    if owner is None:
        return "", 204
    return await _send_to(ctx, *owner, b"")


@bp.post("/v1/streams/lookup")
async def lookup() -> Any:
    ctx = cluster()
    body = await request.get_json(force=True, silent=True)
    ids = body.get("conversation_ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise errors.invalid_request('the body must be JSON: {"conversation_ids": [string, ...]}')
    by_owner: dict[tuple[str, int], list[str]] = {}
    owners: dict[tuple[str, int], tuple[Fleet, Replica]] = {}
    for conversation in ids:
        owner = ctx.owner(conversation)
        if owner is not None:
            key = (owner[0].model_id, owner[1].index)
            owners[key] = owner
            by_owner.setdefault(key, []).append(conversation)
    found: list[Any] = []
    for key, conversations in by_owner.items():
        payload = json.dumps({"conversation_ids": conversations}).encode()
        answer = await _ask(ctx, *owners[key], payload)
        found += answer if isinstance(answer, list) else []
    return found


@bp.post("/v1/chat/completions/control")
@bp.post("/chat/completions/control")
async def control() -> Any:
    """A running completion is named by its id, which only its replica knows: ask each ready (or
    draining) one."""
    ctx = cluster()
    body = await request.get_data()
    answer: Any = {"success": False, "message": "no replica has this completion"}
    for fleet, replica in [(f, r) for f in ctx.fleets.values() for r in f.serving]:
        answer = await _ask(ctx, fleet, replica, body)
        if isinstance(answer, dict) and answer.get("success"):
            return answer
        if isinstance(answer, dict) and "error" in answer:
            return answer, answer["error"].get("code", 400)
    return answer


async def _ask(ctx: Cluster, fleet: Fleet, replica: Replica, body: bytes) -> Any:
    lease = fleet.lease(replica)
    try:
        upstream = await ctx.forward(lease, "POST", request.path, body)
        try:
            return json.loads(await upstream.aread())
        finally:
            await upstream.aclose()
    finally:
        lease.release()


# -- the proxy -------------------------------------------------------------------------------------------
def _path() -> str:
    return request.path + (f"?{request.query_string.decode()}" if request.query_string else "")


async def _send_to(ctx: Cluster, fleet: Fleet, replica: Replica, body: bytes) -> Response:
    lease = fleet.lease(replica)
    try:
        upstream = await ctx.forward(lease, request.method, _path(), body)
    except BaseException:
        lease.release()
        raise
    return _respond(upstream, lease)


def _respond(upstream: UpstreamResponse, lease: ReplicaLease) -> Response:
    """The replica's answer, streamed; `X-Llamba-Replica` names the replica that gave it."""
    response = client_response(upstream, lease)
    response.headers[REPLICA_HEADER] = str(lease.replica.index)
    return response


@bp.route("/", methods=ALL_METHODS, defaults={"path": ""})
@bp.route("/<path:path>", methods=ALL_METHODS)
async def catch_all(path: str) -> Any:
    ctx = cluster()
    body = await request.get_data()
    data = _json_body(body)
    fleet = ctx.fleet_named(_model_name(data))
    conversation = request.headers.get(CONVERSATION_HEADER) if request.method == "POST" else None
    owner = fleet.owner(conversation) if conversation else None
    if owner is not None:  # a new turn of a conversation: its session and its cache are there
        fleet.placed["sticky"] += 1
        return await _send_to(ctx, fleet, owner, body)
    hashes = await _prompt_hashes(ctx, fleet, data)
    tried: set[int] = set()
    while (lease := fleet.place(hashes, exclude=tried)) is not None:
        if conversation:
            fleet.own(conversation, lease.replica)
        try:
            upstream = await ctx.forward(lease, request.method, _path(), body)
        except errors.APIError as exc:  # it could not be reached: nothing ran there, try another
            lease.release()
            fleet.mark_down(lease.replica, exc.message)
            tried.add(lease.replica.index)
            continue
        except BaseException:
            lease.release()
            raise
        return _respond(upstream, lease)
    return _unavailable(fleet.model_id)


def _json_body(body: bytes) -> dict[str, Any] | None:
    if not body or request.method not in ("POST", "PUT", "PATCH"):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _model_name(data: dict[str, Any] | None) -> str | None:
    """The body's `model`, else the `model` query parameter (router mode's order); 400 if not a string."""
    name = (data or {}).get("model") or request.args.get("model")
    if name is not None and not isinstance(name, str):
        raise errors.invalid_request("'model' must be a string")
    return name or None


async def _prompt_hashes(ctx: Cluster, fleet: Fleet, data: dict[str, Any] | None) -> list[str]:
    """The new request's prompt as block hashes, tokenized by a replica (the router holds no tokenizer);
    none when no placement could use them (one replica ready, or no replica has anything cached)."""
    ready = fleet.ready
    if (
        ctx.settings.placement != "prefix"
        or data is None
        or len(ready) < 2
        or not any(r.hashes for r in ready)
    ):
        return []
    if request.path in CHAT_PATHS and isinstance(data.get("messages"), list):
        payload = {k: v for k, v in data.items() if k not in ("stream", "stream_options")}
    elif request.path in COMPLETION_PATHS and isinstance(data.get("prompt"), str):
        payload = {"content": data["prompt"], "add_special": True}
    else:
        return []
    replica = min(ready, key=lambda r: r.load)
    try:
        answer = await ctx.client.post(
            replica.url + "/tokenize",
            json=payload,
            headers={"Authorization": f"Bearer {ctx.secret}"},
            timeout=TOKENIZE_TIMEOUT_S,
        )
        tokens = answer.json().get("tokens") if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return []
    return block_hashes(tokens) if isinstance(tokens, list) else []


__all__ = ["Cluster", "create_cluster_app"]
