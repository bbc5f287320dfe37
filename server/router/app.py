"""The router's Quart app: its own routes (/health, /props, /models, load, unload, SSE) and the proxy of
every other route to the child of the request's model (body `model`, else the `model` query parameter,
else the default model)."""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import anyio
from pydantic import ValidationError
from quart import Blueprint, Quart, Response, current_app, request

from server.apis import webui
from server.apis.openapi.document import ModelName
from server.apis.openapi.routes import cached_document
from server.config.settings import Settings
from server.http import errors
from server.http.auth import install_auth
from server.http.cors import install_cors
from server.http.error_handlers import install_error_handlers
from server.router import metrics as router_metrics
from server.router.catalogue import Catalogue, CatalogueError, build_catalogue
from server.router.child import Child
from server.router.conversations import CONVERSATION_HEADER, Conversations
from server.router.downloads import Downloads
from server.router.events import EventHub
from server.router.pool import Lease, ModelPool
from server.router.proxy import client_response, discard, new_client, open_upstream
from server.router.reload import reload_catalogue
from server.router.state import RUNNING, ModelState
from server.router.upstream import UpstreamClient, UpstreamResponse

ROUTER_KEY = "llamba.router"
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

bp = Blueprint("router", __name__)


@dataclass
class Router:
    """What the router's routes share: settings, catalogue, pool, events, owners, the HTTP client."""

    settings: Settings
    catalogue: Catalogue
    pool: ModelPool
    events: EventHub
    conversations: Conversations
    client: UpstreamClient
    secret: str  # every child's API key: only the router can call them
    downloads: Downloads

    reloading: asyncio.Lock = field(default_factory=asyncio.Lock)  # one rescan at a time

    async def reload(self) -> None:
        """Rescan the catalogue's sources and reconcile the pool (server/router/reload.py)."""
        s = self.settings
        async with self.reloading:
            try:
                fresh = await anyio.to_thread.run_sync(build_catalogue, s.models_dir, s.models_preset)
            except CatalogueError as exc:  # the old catalogue stays
                raise errors.APIError(500, f"models reload failed: {exc}", "server_error") from None
            await reload_catalogue(self.pool, fresh)

    async def forward(self, lease: Lease, body: bytes) -> UpstreamResponse:
        lease.state.requests += 1
        return await open_upstream(
            self.client, lease, request.method, request_target(), request.headers, body, self.secret
        )


def request_target() -> str:
    """The request's path and query as the client sent them (still percent-encoded)."""
    raw = request.scope.get("raw_path") or quote(request.path).encode()
    query = request.query_string
    return (raw + b"?" + query if query else raw).decode("latin-1")


def router() -> Router:
    return current_app.extensions[ROUTER_KEY]


def create_router_app(settings: Settings, catalogue: Catalogue, child_args: list[str]) -> Quart:
    app = Quart("llamba-router")
    events = EventHub()
    secret = secrets.token_hex(16)

    def spawn(state: ModelState, on_event: Any) -> Child:
        entry = state.entry
        args = ["-m", entry.model, "-a", entry.id, "--log-format", "json"]
        env = {**dict(entry.env), "LLAMA_ARG_API_KEY": secret}  # not in the args /models shows
        return Child(entry.id, [*args, *entry.args, *child_args], env, on_event)

    pool = ModelPool(catalogue, settings.models_max, events, spawn)
    conversations, downloads = Conversations(), Downloads(pool)
    ctx = Router(settings, catalogue, pool, events, conversations, new_client(), secret, downloads)
    app.extensions[ROUTER_KEY] = ctx
    from server.router import streams  # the conversation routes, registered before the catch-all

    app.register_blueprint(streams.bp)
    app.register_blueprint(webui.bp)  # the router serves the UI itself: it answers while models load
    app.config[webui.ENABLED_KEY] = settings.webui
    app.register_blueprint(bp)
    install_auth(app, settings.api_keys)
    install_cors(app, settings)  # the single-model server's policy: --cors-origins, else any origin
    install_error_handlers(app)
    _install_lifespan(app, ctx)
    return app


def _install_lifespan(app: Quart, ctx: Router) -> None:
    @app.before_serving
    async def load_on_startup() -> None:
        s = ctx.settings
        builtins_only = s.models_dir is None and s.models_preset is None
        for state in ctx.pool.states.values():
            entry = state.entry
            if entry.load_on_startup or (
                builtins_only and s.models_autoload and entry is ctx.catalogue.default
            ):
                ctx.pool.load(state)

    @app.after_serving
    async def stop_children() -> None:
        await ctx.downloads.shutdown()
        await ctx.pool.shutdown()
        await ctx.client.aclose()


# -- the router's own routes ---------------------------------------------------------------------------
@bp.get("/health")
@bp.get("/v1/health")
async def health() -> Any:
    return {"status": "ok"}


@bp.get("/models")
@bp.get("/v1/models")
async def models() -> Any:
    """The catalogue with each model's state; `?reload=1` rescans it first (llama-server's)."""
    if request.args.get("reload"):
        await router().reload()
    pool = router().pool
    return {"object": "list", "data": [pool.listing(s) for s in pool.states.values()]}


@bp.get("/v1/models/<path:name>")
async def model(name: str) -> Any:
    pool = router().pool
    return pool.listing(pool.state(name))


async def _model_name() -> str:
    """The body's model name (server/apis/openapi/document.py's ModelName); 400 naming the field otherwise."""
    body = await request.get_json(force=True, silent=True)
    if not isinstance(body, dict):
        raise errors.invalid_request('the body must be JSON: {"model": string}')
    try:
        return ModelName.model_validate(body).model
    except ValidationError as exc:
        raise errors.from_validation(exc) from None


async def _model_from_body() -> ModelState:
    return router().pool.state(await _model_name())


@bp.post("/models/load")
async def load() -> Any:
    router().pool.load(await _model_from_body())
    return {"success": True}


@bp.post("/models/unload")
async def unload() -> Any:
    """Stop the model's child, or cancel its download."""
    state = await _model_from_body()
    if await router().downloads.cancel(state):
        return {"success": True}
    if state.child is None:
        raise errors.invalid_request(f"model '{state.id}' is not loaded")
    await router().pool.stop(state)
    return {"success": True}


@bp.post("/models")
async def download() -> Any:
    """Fetch a built-in model into the cache in the background (server/router/downloads.py)."""
    name = await _model_name()
    ctx = router()
    entry = ctx.catalogue.find(name)
    ctx.downloads.start(ctx.pool.states[entry.id] if entry else None, name)
    return {"success": True}


@bp.delete("/models")
async def remove() -> Any:
    """Remove a built-in model's file from the cache (`?model=`); a running one is stopped first."""
    name = request.args.get("model")
    if not name:
        raise errors.invalid_request("model must be a non-empty string")
    await router().downloads.remove(router().pool.state(name))
    return {"success": True}


@bp.get("/openapi.json")
async def openapi() -> Any:
    """The router's contract: its own routes and the model server's, which it proxies."""
    return cached_document(router=True)


@bp.get("/models/sse")
async def models_sse() -> Any:
    ctx = router()
    first = [
        {"model": s.id, "event": "model_status", "data": {"status": s.status}}
        for s in ctx.pool.states.values()
    ]
    response = Response(
        ctx.events.listen(first), headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    response.timeout = None
    return response


@bp.get("/metrics")
async def metrics() -> Any:
    """Every model's metrics labelled by model, with the router's own; `?model=` is that child's."""
    ctx = router()
    if request.args.get("model"):
        return await proxy_to(ctx.pool.state(request.args["model"]), b"")
    if not ctx.settings.metrics:
        raise errors.not_supported("This server does not support metrics endpoint.")
    text = await router_metrics.aggregate(ctx.pool, ctx.client, ctx.secret)
    return Response(text, content_type=router_metrics.CONTENT_TYPE)


@bp.get("/props")
async def props() -> Any:
    """The router's props; with `?model=`, that model's child's (it says whether it sleeps). Without,
    the default model's props under the router's, when it runs (the web UI reads them)."""
    ctx = router()
    if request.args.get("model"):
        return await proxy_to(ctx.pool.state(request.args["model"]), b"")
    s = ctx.settings
    own = {"role": "router", "models_max": s.models_max, "max_instances": s.models_max}
    own["model_alias"] = ctx.catalogue.default_id  # what a chat without `model` runs on
    own |= {
        "models_autoload": s.models_autoload,
        "default_model": ctx.catalogue.default_id,
        "build_info": "b0-llamba",
    }
    default = ctx.pool.states[ctx.catalogue.default_id]
    if default.status not in RUNNING or default.stopping:
        return own | {"is_sleeping": False}
    lease = await ctx.pool.acquire(default)
    try:
        upstream = await ctx.forward(lease, b"")
        child_props = json.loads(await upstream.aread()) if upstream.status_code == 200 else {}
        await upstream.aclose()
    finally:
        lease.release()
    return child_props | own


@bp.route("/", methods=ALL_METHODS, defaults={"path": ""})
@bp.route("/<path:path>", methods=ALL_METHODS)
async def catch_all(path: str) -> Any:
    if (
        request.method == "OPTIONS"
    ):  # a CORS preflight: answered here (install_cors adds the headers), no load
        return Response("", 200)
    body = await request.get_data()
    return await proxy_to(requested_model(body), body)


def requested_model(body: bytes) -> ModelState:
    """The request's model: the body's `model`, else the `model` query parameter, else the default."""
    name = None
    if body and request.method in ("POST", "PUT", "PATCH"):
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("model"), str) and data["model"]:
            name = data["model"]
    name = name or request.args.get("model")
    pool = router().pool
    return pool.state(name) if name else pool.states[router().catalogue.default_id]


def _autoload() -> bool:
    value = request.args.get("autoload")
    if value is None:
        return router().settings.models_autoload
    return value.lower() in ("1", "true", "yes")


async def proxy_to(state: ModelState, body: bytes) -> Response:
    ctx = router()
    conversation = request.headers.get(CONVERSATION_HEADER)
    if conversation and request.method == "POST":
        from server.router.streams import forward_conversation

        return await forward_conversation(ctx, state, conversation, body, _autoload())
    lease = await ctx.pool.acquire(state, _autoload())
    try:
        upstream = await ctx.forward(lease, body)
    except BaseException:
        lease.release()
        raise
    return client_response(upstream, lease)


__all__ = ["Router", "create_router_app", "discard", "proxy_to", "router"]
