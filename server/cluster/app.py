"""The cluster router's Quart app: one address in front of a model's Ray-placed replicas.

Its own routes: `/health` (200 once a replica is ready), `/models` (the model and each replica's state),
`/props`; the conversation routes (`/v1/stream` resume and stop, `/v1/streams/lookup`, the control
endpoint) go to the replica that owns the conversation. Every other request is proxied to a replica over
HTTP, unbuffered (`server/router/proxy.py`): a request with `X-Conversation-Id` to its owner, a new one
where `server/cluster/placement.py` puts it. A replica that cannot be reached is marked down and the
request goes to another one (nothing was generated for it yet).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import structlog
from quart import Blueprint, Quart, Response, current_app, request

from server import errors
from server.auth import install_auth
from server.cli import Settings
from server.cluster.fleet import Fleet, ReplicaHandle, ReplicaLease
from server.cluster.placement import Replica, least_loaded
from server.cluster.prefixes import block_hashes
from server.error_handlers import install_error_handlers
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
    entry: ModelEntry
    fleet: Fleet
    client: httpx.AsyncClient  # health polls and /tokenize
    upstream: UpstreamClient  # the proxied requests (server/router/upstream.py)
    secret: str
    address: str

    async def forward(self, lease: ReplicaLease, method: str, path: str, body: bytes) -> UpstreamResponse:
        return await open_upstream(self.upstream, lease, method, path, request.headers, body, self.secret)


def cluster() -> Cluster:
    return current_app.extensions[CLUSTER_KEY]


def create_cluster_app(
    settings: Settings, entry: ModelEntry, handles: list[ReplicaHandle], secret: str, address: str
) -> Quart:
    app = Quart("llamba-cluster")
    # No read timeout (a generation streams as long as it runs), no proxy from the environment.
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), trust_env=False)
    fleet = Fleet(entry.id, handles, client, secret, policy=settings.placement)
    ctx = Cluster(settings, entry, fleet, client, new_client(), secret, address)
    app.extensions[CLUSTER_KEY] = ctx
    app.register_blueprint(bp)
    install_auth(app, settings.api_keys)
    install_error_handlers(app)

    @app.before_serving
    async def start_fleet() -> None:
        ctx.fleet.start()

    @app.after_serving
    async def stop_fleet() -> None:
        await ctx.fleet.stop()
        await client.aclose()
        await ctx.upstream.aclose()

    return app


def _unavailable() -> tuple[dict[str, Any], int, dict[str, str]]:
    err = errors.unavailable("no replica is ready")
    return err.body(), err.status, {"Retry-After": str(RETRY_AFTER_S)}


# -- the cluster's own routes ----------------------------------------------------------------------------
@bp.get("/health")
@bp.get("/v1/health")
async def health() -> Any:
    return {"status": "ok"} if cluster().fleet.ready else _unavailable()


def _listing(ctx: Cluster) -> dict[str, Any]:
    entry, fleet = ctx.entry, ctx.fleet
    item: dict[str, Any] = {"id": entry.id, "object": "model", "owned_by": "llamba", "created": 0}
    item |= {"aliases": list(entry.aliases), "path": entry.model}
    item["status"] = {"value": "loaded" if fleet.ready else "loading"}
    item["cluster"] = {
        "address": ctx.address,
        "placement": ctx.settings.placement,
        "placed": dict(fleet.placed),
    }
    item["replicas"] = [r.listing() for r in fleet.replicas]
    return item


@bp.get("/models")
@bp.get("/v1/models")
async def models() -> Any:
    return {"object": "list", "data": [_listing(cluster())]}


@bp.get("/props")
async def props() -> Any:
    """The least loaded replica's props (a model server's: the web UI treats the cluster as one
    server), with the cluster's own fields."""
    ctx = cluster()
    own = {"cluster": "ray", "replicas": len(ctx.fleet.replicas), "model_alias": ctx.entry.id}
    replica = least_loaded(ctx.fleet.replicas)
    if replica is None:
        return _unavailable()
    lease = ctx.fleet.lease(replica)
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
    owner = ctx.fleet.owner(_conversation_id())
    if owner is None:  # never seen, expired, or its replica died with its session
        raise errors.not_found("Stream not found or expired")
    return await _send_to(ctx, owner, b"")


@bp.delete("/v1/stream")
async def stop() -> Any:
    ctx = cluster()
    owner = ctx.fleet.owner(_conversation_id())
    if owner is None:
        return "", 204
    return await _send_to(ctx, owner, b"")


@bp.post("/v1/streams/lookup")
async def lookup() -> Any:
    ctx = cluster()
    body = await request.get_json(force=True, silent=True)
    ids = body.get("conversation_ids") if isinstance(body, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise errors.invalid_request('the body must be JSON: {"conversation_ids": [string, ...]}')
    by_owner: dict[int, list[str]] = {}
    for conversation in ids:
        owner = ctx.fleet.owner(conversation)
        if owner is not None:
            by_owner.setdefault(owner.index, []).append(conversation)
    found: list[Any] = []
    for index, conversations in by_owner.items():
        payload = json.dumps({"conversation_ids": conversations}).encode()
        answer = await _ask(ctx, ctx.fleet.replicas[index], payload)
        found += answer if isinstance(answer, list) else []
    return found


@bp.post("/v1/chat/completions/control")
@bp.post("/chat/completions/control")
async def control() -> Any:
    """A running completion is named by its id, which only its replica knows: ask each ready one."""
    ctx = cluster()
    body = await request.get_data()
    answer: Any = {"success": False, "message": "no replica has this completion"}
    for replica in ctx.fleet.ready:
        answer = await _ask(ctx, replica, body)
        if isinstance(answer, dict) and answer.get("success"):
            return answer
        if isinstance(answer, dict) and "error" in answer:
            return answer, answer["error"].get("code", 400)
    return answer


async def _ask(ctx: Cluster, replica: Replica, body: bytes) -> Any:
    lease = ctx.fleet.lease(replica)
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


async def _send_to(ctx: Cluster, replica: Replica, body: bytes) -> Response:
    lease = ctx.fleet.lease(replica)
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
    _check_model(ctx.entry, data)
    conversation = request.headers.get(CONVERSATION_HEADER) if request.method == "POST" else None
    owner = ctx.fleet.owner(conversation) if conversation else None
    if owner is not None:  # a new turn of a conversation: its session and its cache are there
        return await _send_to(ctx, owner, body)
    hashes = await _prompt_hashes(ctx, data)
    tried: set[int] = set()
    while (lease := ctx.fleet.place(hashes, exclude=tried)) is not None:
        if conversation:
            ctx.fleet.own(conversation, lease.replica)
        try:
            upstream = await ctx.forward(lease, request.method, _path(), body)
        except errors.APIError as exc:  # it could not be reached: nothing ran there, try another
            lease.release()
            ctx.fleet.mark_down(lease.replica, exc.message)
            tried.add(lease.replica.index)
            continue
        except BaseException:
            lease.release()
            raise
        return _respond(upstream, lease)
    return _unavailable()


def _json_body(body: bytes) -> dict[str, Any] | None:
    if not body or request.method not in ("POST", "PUT", "PATCH"):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _check_model(entry: ModelEntry, data: dict[str, Any] | None) -> None:
    name = (data or {}).get("model") or request.args.get("model")
    if isinstance(name, str) and name and name not in entry.names():
        raise errors.invalid_request(f"model '{name}' not found: this cluster serves '{entry.id}'")


async def _prompt_hashes(ctx: Cluster, data: dict[str, Any] | None) -> list[str]:
    """The new request's prompt as block hashes, tokenized by a replica (the router holds no tokenizer);
    none when no placement could use them (one replica ready, or no replica has anything cached)."""
    ready = ctx.fleet.ready
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
