"""The router's Quart app: the front door (server/router/front_door.py) in front of its children, one per
loaded model (a request goes to its model's: the body's `model`, else the `model` query parameter, else
the default model), and its own routes: a model by name, load, unload, download, remove, the models'
SSE, /openapi.json, the web UI, and Ollama's API (server/router/ollama.py)."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import ValidationError
from quart import Blueprint, Quart, Response, request
from quart.typing import ResponseReturnValue

from server.apis import webui
from server.apis.openapi.document import ModelName, cached_document
from server.config.settings import Settings
from server.http import errors, sse
from server.http.auth import install_auth
from server.http.cors import install_cors
from server.http.error_handlers import install_error_handlers
from server.router import metrics as router_metrics
from server.router import ollama
from server.router.catalogue import Catalogue, CatalogueError, build_catalogue
from server.router.child import Child
from server.router.conversations import Conversations
from server.router.downloads import Downloads
from server.router.events import EventHub
from server.router.forward import Forwarder
from server.router.front_door import install_front_door, json_body, retry_later, upstreams
from server.router.pool import ModelPool
from server.router.proxy import new_client
from server.router.reload import reload_catalogue
from server.router.state import RUNNING, ModelState
from server.router.upstream import UpstreamClient

bp = Blueprint("router", __name__)


@dataclass
class Router:
    """What the router's routes share (settings, catalogue, pool, events, owners, the HTTP client), and
    its answers to the front door (`front_door.Upstreams`, a conversation's owner being its model)."""

    settings: Settings
    catalogue: Catalogue
    pool: ModelPool
    events: EventHub
    conversations: Conversations
    client: UpstreamClient
    secret: str  # every child's API key: only the router can call them
    downloads: Downloads

    reloading: asyncio.Lock = field(default_factory=asyncio.Lock)  # one rescan at a time
    forwarder: Forwarder = field(init=False)

    answers_preflight = True  # install_cors adds the headers: a preflight loads no model
    no_completion = "no running model has this completion"

    def __post_init__(self) -> None:
        s = self.settings
        self.forwarder = Forwarder(self.pool, self.conversations, self.client, self.secret, s.models_autoload)

    async def reload(self) -> None:
        """Rescan the catalogue's sources and reconcile the pool (server/router/reload.py)."""
        s = self.settings
        async with self.reloading:
            try:
                fresh = await anyio.to_thread.run_sync(build_catalogue, s.models_dir, s.models_preset)
            except CatalogueError as exc:  # the old catalogue stays
                raise errors.APIError(500, f"models reload failed: {exc}", "server_error") from None
            await reload_catalogue(self.pool, fresh)

    # -- the front door's models, props and metrics ---------------------------------------------------
    def unavailable(self) -> errors.APIError | None:
        return None  # the router answers while its models load (on demand)

    async def listing(self, reload: bool) -> list[dict[str, Any]]:
        if reload:
            await self.reload()
        return [self.pool.listing(s) for s in self.pool.states.values() if not s.entry.hidden]

    async def props(self, model: str | None) -> ResponseReturnValue:
        """The router's props; with `?model=`, that model's child's (it says whether it sleeps). Without,
        the default model's props under the router's, when it runs (the web UI reads them)."""
        if model:
            return await self.forwarder.proxy_to(self.pool.state(model), b"")
        s, default_id = self.settings, self.catalogue.default_id
        own = {"role": "router", "models_max": s.models_max, "max_instances": s.models_max}
        own["model_alias"] = default_id  # what a chat without `model` runs on
        own |= {"models_autoload": s.models_autoload, "default_model": default_id, "build_info": "b0-llamba"}
        own["ui_settings"] = s.ui_settings  # --ui-config(-file): the page's defaults, loaded model or not
        default = self.pool.states[default_id]
        if default.status not in RUNNING or default.stopping:
            return own | {"is_sleeping": False}
        lease = await self.pool.acquire(default)
        try:
            upstream = await self.forwarder.send(lease, b"")
            child_props = json.loads(await upstream.aread()) if upstream.status_code == 200 else {}
            await upstream.aclose()
        finally:
            lease.release()
        return child_props | own

    async def model_metrics(self, model: str) -> ResponseReturnValue | None:
        """That model's child's own /metrics, as llama-server's router does (it has no aggregate)."""
        return await self.forwarder.proxy_to(self.pool.state(model), b"")

    async def metrics(self, model: str | None) -> str:
        return await router_metrics.aggregate(self.pool, self.client, self.secret)

    # -- the front door's conversations -----------------------------------------------------------------
    def _any_owner(self, conversation: str) -> ModelState | None:
        model_id = self.conversations.owner(conversation)
        return self.pool.states.get(model_id) if model_id else None

    def owner(self, conversation: str) -> ModelState | None:
        state = self._any_owner(conversation)
        return state if state is not None and state.status in RUNNING else None

    def resumable(self, conversation: str) -> ModelState | None:
        """Its model's child while it runs; 503 while its request is parked or the model (re)loads."""
        state = self._any_owner(conversation)
        if state is None:
            return None
        parked = self.conversations.parked(conversation)
        if parked is not None or state.status not in RUNNING or state.stopping:
            if state.child is None and parked is None:
                return None  # its child is gone, and its session
            raise retry_later("model is loading")
        return state

    def cancel_parked(self, conversation: str) -> bool:
        parked = self.conversations.parked(conversation)
        if parked is not None:
            parked.stopped.set()
            self.conversations.forget(conversation)
        return parked is not None

    def owner_name(self, owner: ModelState) -> str:
        return owner.id

    def serving(self) -> list[ModelState]:
        return [s for s in self.pool.states.values() if s.status in RUNNING and not s.stopping]

    async def send(self, owner: ModelState, body: bytes) -> Response:
        return await self.forwarder.proxy_to(owner, body)

    async def ask(self, owner: ModelState, payload: bytes) -> Any:
        return await self.forwarder.ask(owner, payload)

    async def lookup(self, owner: ModelState, payload: bytes) -> Iterable[Any]:
        """The child's answer as it is (a list), its model's state looked up by id as before."""
        return await self.forwarder.ask(self.pool.states[owner.id], payload)

    async def control_payload(self) -> bytes:
        return json.dumps(await request.get_json(force=True, silent=True)).encode()

    # -- the front door's proxy -------------------------------------------------------------------------
    async def proxy(self, body: bytes) -> ResponseReturnValue:
        return await self.forwarder.proxy_to(self.requested_model(body), body)

    def requested_model(self, body: bytes) -> ModelState:
        """The request's model: the body's `model`, else the `model` query parameter, else the default."""
        data = json_body(body)
        name = data["model"] if data and isinstance(data.get("model"), str) and data["model"] else None
        name = name or request.args.get("model")
        return self.pool.state(name) if name else self.pool.states[self.catalogue.default_id]


def router(app: Quart | None = None) -> Router:
    ctx = upstreams(app)
    assert isinstance(ctx, Router)
    return ctx


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
    app.register_blueprint(webui.bp)  # the router serves the UI itself: it answers while models load
    app.config[webui.ENABLED_KEY] = settings.webui
    app.config[sse.UNREAD_LIMIT_KEY] = settings.stream_buffer_size  # its own streams: Ollama's pull
    app.register_blueprint(bp)
    app.register_blueprint(ollama.bp)  # Ollama's API: its own answers, and its requests routed by name
    install_front_door(app, ctx)  # last: its catch-all proxies what no other route takes
    install_auth(app, settings.api_keys)
    install_cors(app, settings)  # the single-model server's policy: --cors-origins, else any origin
    install_error_handlers(app)
    _install_lifespan(app, ctx)
    return app


def _install_lifespan(app: Quart, ctx: Router) -> None:
    @app.before_serving
    async def load_on_startup() -> None:
        s = ctx.settings
        no_cache = all(e.source != "cache" for e in ctx.catalogue.entries.values())
        builtins_only = s.models_dir is None and s.models_preset is None and no_cache
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
    entry = ctx.catalogue.resolve(name)
    ctx.downloads.start(ctx.pool.states[entry.id] if entry else None, entry.id if entry else name)
    return {"success": True}


@bp.delete("/models")
async def remove() -> Any:
    """Remove a cache model's files (`?model=`); a running one is stopped first."""
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


__all__ = ["Router", "create_router_app", "router"]
