"""The cluster router's Quart app: one address in front of the Ray-placed replicas of its models.

Its routes are the front door's (`server/router/front_door.py`, shared with router mode): `/health` (200
once every model has a ready replica), `/models` (each model, its replicas' state and its autoscaling),
`/props`, `/metrics` (`server/cluster/metrics.py`); the conversation routes (`/v1/stream` resume and
stop, `/v1/streams/lookup`, the control endpoint) go to the replica that owns the conversation. Every
other request is proxied over HTTP, unbuffered (`server/router/proxy.py`), to a replica of its model (the
body's `model`, else the `model` query parameter, else the default model, as router mode chooses): a
request with `X-Conversation-Id` to its owner, a new one where `server/cluster/placement.py` puts it. A
replica that cannot be reached is marked down and the request goes to another one (nothing was generated
for it yet).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import structlog
from quart import Quart, Response, request
from quart.typing import ResponseReturnValue

from server.cluster import metrics as cluster_metrics
from server.cluster.autoscale import ScalePolicy
from server.cluster.fleet import Fleet
from server.cluster.monitor import ReplicaHandle
from server.cluster.placement import Replica, least_loaded
from server.cluster.routing import ReplicaLease
from server.config.settings import Settings
from server.http import errors
from server.http.auth import install_auth
from server.http.error_handlers import install_error_handlers
from server.model.prefixes import block_hashes
from server.router.catalogue import ModelEntry
from server.router.conversations import CONVERSATION_HEADER
from server.router.front_door import as_reply, install_front_door, json_body, read_json, retry_later
from server.router.proxy import client_response, new_client, open_upstream
from server.router.upstream import UpstreamClient, UpstreamResponse

log = structlog.get_logger("cluster")

CHAT_PATHS = {"/v1/chat/completions", "/chat/completions"}
COMPLETION_PATHS = {"/v1/completions", "/completions", "/completion"}
REPLICA_HEADER = "X-Llamba-Replica"
TOKENIZE_TIMEOUT_S = 5.0

Owner = tuple[Fleet, Replica]  # a conversation's replica, and the fleet it is in


@dataclass
class Cluster:
    """The cluster's models and their fleets, and its answers to the front door (`front_door.Upstreams`,
    a conversation's owner being a replica)."""

    settings: Settings
    entries: dict[str, ModelEntry]  # the served models, by id
    fleets: dict[str, Fleet]  # their replicas, by model id
    default_id: str  # the model of a request that names none
    client: httpx.AsyncClient  # health polls and /tokenize
    upstream: UpstreamClient  # the proxied requests (server/router/upstream.py)
    secret: str
    address: str

    answers_preflight = False  # no CORS here: a preflight goes to a replica as any request
    no_completion = "no replica has this completion"

    def fleet_named(self, name: str | None) -> Fleet:
        """The fleet of the model called `name` (its id or an alias), the default one for None; 400."""
        if not name:
            return self.fleets[self.default_id]
        for entry in self.entries.values():
            if name in entry.names():
                return self.fleets[entry.id]
        served = ", ".join(sorted(self.entries))
        raise errors.invalid_request(f"model '{name}' not found: this cluster serves {served}")

    async def forward(self, lease: ReplicaLease, method: str, path: str, body: bytes) -> UpstreamResponse:
        return await open_upstream(self.upstream, lease, method, path, request.headers, body, self.secret)

    # -- the front door's models, props and metrics ---------------------------------------------------
    def unavailable(self) -> errors.APIError | None:
        for fleet in self.fleets.values():
            if not fleet.ready:
                return _no_replica(fleet)
        return None

    async def listing(self, reload: bool) -> list[dict[str, Any]]:
        """Each model's entry (`reload` is not for the cluster: its models are fixed at its start)."""
        return [_listing(self, fleet) for fleet in self.fleets.values()]

    async def props(self, model: str | None) -> ResponseReturnValue:
        """The least loaded replica's props of the `?model=` (else the default model): a model server's,
        as the web UI treats the cluster as one server, with the cluster's own fields."""
        fleet = self.fleet_named(model)
        own = {"cluster": "ray", "replicas": len(fleet.replicas), "model_alias": fleet.model_id}
        replica = least_loaded(fleet.replicas)
        if replica is None:
            return as_reply(_no_replica(fleet))
        lease = fleet.routing.lease(replica)
        try:
            upstream = await self.forward(lease, "GET", "/props", b"")
            child = json.loads(await upstream.aread()) if upstream.status_code == 200 else {}
            await upstream.aclose()
        finally:
            lease.release()
        return child | own

    async def model_metrics(self, model: str) -> ResponseReturnValue | None:
        return None  # the cluster's aggregate of that model: its own families and its replicas'

    async def metrics(self, model: str | None) -> str:
        """The cluster's own metrics and every live replica's, labelled by model and replica; `model`'s
        only when given."""
        fleets = [self.fleet_named(model)] if model else list(self.fleets.values())
        return await cluster_metrics.aggregate(fleets, self.upstream, self.secret)

    # -- the front door's conversations -----------------------------------------------------------------
    def owner(self, conversation: str) -> Owner | None:
        for fleet in self.fleets.values():
            replica = fleet.routing.owner(conversation)
            if replica is not None:
                return fleet, replica
        return None

    def resumable(self, conversation: str) -> Owner | None:
        return self.owner(conversation)  # none: never seen, expired, or its replica died with its session

    def cancel_parked(self, conversation: str) -> bool:
        return False  # nothing waits here: a request with no ready replica is answered 503 at once

    def owner_name(self, owner: Owner) -> str:
        return f"{owner[0].model_id}#{owner[1].index}"

    def serving(self) -> list[Owner]:
        """Every ready (or draining) replica."""
        return [(f, r) for f in self.fleets.values() for r in f.serving]

    async def send(self, owner: Owner, body: bytes) -> Response:
        fleet, replica = owner
        lease = fleet.routing.lease(replica)
        try:
            upstream = await self.forward(lease, request.method, _path(), body)
        except BaseException:
            lease.release()
            raise
        return _respond(upstream, lease)

    async def ask(self, owner: Owner, payload: bytes) -> Any:
        lease = owner[0].routing.lease(owner[1])
        try:
            return await read_json(await self.forward(lease, "POST", request.path, payload))
        finally:
            lease.release()

    async def lookup(self, owner: Owner, payload: bytes) -> Iterable[Any]:
        answer = await self.ask(owner, payload)
        return answer if isinstance(answer, list) else []

    async def control_payload(self) -> bytes:
        return await request.get_data()

    # -- the front door's proxy -------------------------------------------------------------------------
    async def proxy(self, body: bytes) -> ResponseReturnValue:
        return await _place_and_send(self, body)


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
    install_front_door(app, ctx)
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


def _no_replica(fleet: Fleet) -> errors.APIError:
    return retry_later(f"no replica of '{fleet.model_id}' is ready")


def _listing(ctx: Cluster, fleet: Fleet) -> dict[str, Any]:
    entry = ctx.entries[fleet.model_id]
    item: dict[str, Any] = {"id": entry.id, "object": "model", "owned_by": "llamba", "created": 0}
    item |= {"aliases": list(entry.aliases), "path": entry.model}
    item["status"] = {"value": "loaded" if fleet.ready else "loading"}
    item["cluster"] = {
        "address": ctx.address,
        "placement": ctx.settings.placement,
        "placed": dict(fleet.routing.placed),
        "retries": fleet.routing.retries,
    }
    scaler = fleet.scaler
    decision = scaler.last_decision
    item["scaling"] = {
        "min": scaler.policy.min_replicas,
        "max": scaler.policy.max_replicas,
        "current": fleet.current,
        "desired": decision.desired if decision else fleet.current,
        "last_decision": {"action": decision.action, "reason": decision.reason} if decision else None,
        "decisions": dict(scaler.decisions),
    }
    item["replicas"] = [r.listing() for r in fleet.replicas]
    return item


# -- the proxy -------------------------------------------------------------------------------------------
def _path() -> str:
    return request.path + (f"?{request.query_string.decode()}" if request.query_string else "")


def _respond(upstream: UpstreamResponse, lease: ReplicaLease) -> Response:
    """The replica's answer, streamed; `X-Llamba-Replica` names the replica that gave it."""
    response = client_response(upstream, lease)
    response.headers[REPLICA_HEADER] = str(lease.replica.index)
    return response


async def _place_and_send(ctx: Cluster, body: bytes) -> ResponseReturnValue:
    """A conversation's next turn to its owner; a new request where placement puts it, to another
    replica while the one chosen cannot be reached."""
    data = json_body(body)
    fleet = ctx.fleet_named(_model_name(data))
    conversation = request.headers.get(CONVERSATION_HEADER) if request.method == "POST" else None
    routing = fleet.routing
    owner = routing.owner(conversation) if conversation else None
    if owner is not None:  # a new turn of a conversation: its session and its cache are there
        routing.placed["sticky"] += 1
        return await ctx.send((fleet, owner), body)
    hashes = await _prompt_hashes(ctx, fleet, data)
    tried: set[int] = set()
    while (lease := routing.place(hashes, exclude=tried)) is not None:
        if conversation:
            routing.own(conversation, lease.replica)
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
    return as_reply(_no_replica(fleet))


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
