"""The Quart app: routes, API-key check, errors in OpenAI's shape, and the lifespan of the engine."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable

import anyio
import structlog
from quart import Quart

from server.agents import cors_proxy
from server.agents import routes as tools
from server.agents.toolbox import Toolbox
from server.apis import webui
from server.apis.anthropic import routes as anthropic
from server.apis.embeddings import routes as embeddings
from server.apis.native import control, metrics, slots
from server.apis.native import routes as native
from server.apis.ollama import routes as ollama
from server.apis.openai import routes as openai
from server.apis.openapi import routes as openapi
from server.apis.responses import routes as responses
from server.apis.responses.runs import ResponsesState
from server.apis.responses.store import ResponseStore
from server.builtin_tools import BuiltinTools, ToolContext
from server.config.settings import Settings
from server.http import sse, unknown_fields
from server.http.auth import install_auth
from server.http.cors import install_cors
from server.http.error_handlers import install_error_handlers
from server.http.request_body import check_headers, read_whole_body
from server.mcp import HostPolicy, McpManager
from server.model.host import ModelHost
from server.model.sleep import IdleSleeper
from server.state import AppState
from server.streams import routes as stream
from server.streams.journal import JournalDir, Recipe
from server.streams.resume import Regenerator, RestoreContext, restore_sessions
from server.streams.sessions import SessionLimits, SessionStore

log = structlog.get_logger("server")


def create_app(settings: Settings, on_load_failure: Callable[[], None] | None = None) -> Quart:
    """The app; `on_load_failure` is called when the model fails to load (the CLI exits with 1)."""
    app = Quart("llamba")
    model = ModelHost(settings)
    limits = SessionLimits(
        settings.stream_buffer_size,
        settings.stream_ttl,
        settings.stream_max_sessions,
        settings.stream_max_sessions_per_client,
    )
    # --stream-journal: the model's journal folder (locked; JournalError when it cannot be used).
    journals = None
    if settings.stream_journal is not None:
        journals = JournalDir(settings.stream_journal, str(settings.model), settings.stream_buffer_size)
    sessions = SessionStore(limits, journals=journals)
    app.config[sse.UNREAD_LIMIT_KEY] = settings.stream_buffer_size
    # Read at start (before serving): with --responses-dir, the stored responses of earlier runs.
    store = ResponseStore(settings.responses_max, settings.responses_dir)
    state = AppState(model, sessions, ResponsesState(store), settings.limits)
    state.install(app)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_size  # a larger body is a 413
    for routes in (
        openai, anthropic, ollama, responses, control, native, embeddings, slots, metrics, stream, openapi,
        webui,
    ):  # fmt: skip
        app.register_blueprint(routes.bp)
    app.config[webui.ENABLED_KEY] = settings.webui
    app.before_request(check_headers)
    app.before_request(read_whole_body)
    install_auth(app, settings.api_keys)
    install_cors(app, settings)
    install_error_handlers(app)
    unknown_fields.install(app, settings.strict_fields)
    state.toolbox = _install_tools(app, settings)
    app.register_blueprint(cors_proxy.bp if settings.ui_mcp_proxy else cors_proxy.disabled_bp)
    _install_lifespan(app, model, sessions, store, on_load_failure)
    if settings.sleep_idle_seconds > 0:
        _install_sleep(app, model, settings.sleep_idle_seconds)
    return app


def _install_sleep(app: Quart, model: ModelHost, idle_seconds: float) -> None:
    """--sleep-idle-seconds: the middleware that wakes the model, and its idle watch
    (server/model/sleep.py)."""
    sleeper = IdleSleeper(app.asgi_app, model, idle_seconds)
    app.asgi_app = sleeper  # type: ignore[method-assign]

    @app.before_serving
    async def watch_idle() -> None:
        sleeper.start()

    @app.after_serving
    async def stop_watching() -> None:
        await sleeper.stop()


def _install_tools(app: Quart, settings: Settings) -> Toolbox | None:
    """/tools, the built-in tools and the MCP servers exist only when some are configured: /tools runs
    code on this host. --mcp-allow-hosts alone gives the tool loop its per-request MCP servers."""
    if not settings.mcp_servers and not settings.tools and not settings.mcp_allow_hosts:
        return None
    mcp = None
    if settings.mcp_servers or settings.mcp_allow_hosts:
        mcp = McpManager(settings.mcp_servers, policy=HostPolicy.parse(settings.mcp_allow_hosts))
    # The built-in tools' defaults: the server's own cwd, and --tools-runtime (checked while parsing). The
    # file tools are confined to the working directory unless the shell tool, which reaches every path
    # anyway, is enabled too (server/builtin_tools/workdir.py).
    confined = "exec_shell_command" not in settings.tools
    here = ToolContext(os.getcwd(), regex_timeout=settings.tools_regex_timeout, confined=confined)
    defaults = ToolContext.of(None, settings.tools_runtime, here)
    manager = Toolbox(mcp, BuiltinTools(settings.tools, defaults) if settings.tools else None)
    if settings.mcp_servers or settings.tools:
        app.register_blueprint(tools.bp)

    @app.before_serving
    async def start_mcp() -> None:
        manager.start()  # warm-up runs in the background; /tools waits for it, /health does not

    @app.after_serving
    async def stop_mcp() -> None:
        await manager.stop()  # idempotent: `python -m server` stops it earlier, before the HTTP drain

    return manager


def _install_lifespan(
    app: Quart,
    model: ModelHost,
    sessions: SessionStore,
    store: ResponseStore,
    on_load_failure: Callable[[], None] | None,
) -> None:
    loading: set[asyncio.Task[None]] = set()  # holds the task: the loop keeps only weak references

    @app.before_serving
    async def start_loading() -> None:
        # Not awaited: the server answers (503 on /health) while the model loads.
        load = asyncio.get_running_loop().create_task(_load(model, on_load_failure))
        loading.add(load)
        if sessions.journals is not None:  # replayable at once; resumed ones wait for the model
            sessions.journals.start()
            regenerators = _regenerators(model)
            path = str(model.settings.model)
            restore_sessions(RestoreContext(sessions, sessions.journals, regenerators, path, load))
        sessions.start_gc()

    @app.after_serving
    async def stop_engine() -> None:
        # Sessions first: their producers hold engine requests that must not outlive the engine, and
        # background responses they stop are stored (as cancelled) before the store's last write.
        await sessions.close()
        if sessions.journals is not None:
            await anyio.to_thread.run_sync(sessions.journals.close)
        await anyio.to_thread.run_sync(store.close)
        await anyio.to_thread.run_sync(model.stop)


def _regenerators(model: ModelHost) -> dict[str, Regenerator]:
    """The durable routes (`Recipe.route`): how each makes a journaled stream again after a restart."""

    async def chat(recipe: Recipe) -> AsyncIterator[bytes]:
        return await openai.regenerate_chat(model, recipe)

    async def messages(recipe: Recipe) -> AsyncIterator[bytes]:
        return await anthropic.regenerate_messages(model, recipe)

    return {
        "chat": Regenerator(chat, openai.chat_error_event),
        "messages": Regenerator(messages, anthropic.error_event),
    }


async def _load(model: ModelHost, on_failure: Callable[[], None] | None) -> None:
    try:
        await model.load()
    except Exception:
        if on_failure is not None:
            on_failure()
