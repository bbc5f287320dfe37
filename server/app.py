"""The Quart app: routes, API-key check, errors in OpenAI's shape, and the lifespan of the engine."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import anyio
import structlog
from pydantic import ValidationError
from quart import Quart, request
from werkzeug.exceptions import HTTPException

from server import errors
from server.cli import Settings
from server.routes import metrics, native, openai, slots
from server.service import ModelService

log = structlog.get_logger("server")

PUBLIC_PATHS = {"/health", "/v1/health", "/v1/models", "/models"}


def create_app(settings: Settings) -> Quart:
    app = Quart("llamba")
    service = ModelService(settings)
    app.extensions["llamba"] = service
    for bp in (openai.bp, native.bp, slots.bp, metrics.bp):
        app.register_blueprint(bp)
    _install_auth(app, settings)
    _install_error_handlers(app)
    _install_lifespan(app, service)
    return app


def _install_auth(app: Quart, settings: Settings) -> None:
    @app.before_request
    async def bind_request_and_check_key() -> Any:
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=uuid.uuid4().hex[:12])
        if not settings.api_keys or request.method == "OPTIONS" or is_public(request.path):
            return None
        auth = request.headers.get("Authorization", "")
        key = auth[7:] if auth.startswith("Bearer ") else request.headers.get("X-Api-Key", "")
        if key not in settings.api_keys:
            err = errors.authentication()
            return err.body(), err.status
        return None


def is_public(path: str) -> bool:
    return (
        path in PUBLIC_PATHS
        or path == "/"
        or path.startswith("/assets/")
        or path.endswith((".html", ".js", ".css"))
    )


def _install_error_handlers(app: Quart) -> None:
    @app.errorhandler(errors.APIError)
    async def api_error(exc: errors.APIError) -> Any:
        return exc.body(), exc.status

    @app.errorhandler(ValidationError)
    async def validation_error(exc: ValidationError) -> Any:
        err = errors.from_validation(exc)
        return err.body(), err.status

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Any:
        status = exc.code or 500
        if status == 404:
            err = errors.not_found(f"File Not Found: {request.path}")
        elif status == 400:
            err = errors.invalid_request(f"Invalid request body: {exc.description}")
        else:
            err = errors.APIError(status, exc.description or exc.name, "invalid_request_error")
        return err.body(), err.status

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception) -> Any:
        log.exception("request.failed", error=str(exc))
        err = errors.APIError(500, f"internal error: {exc}", "server_error")
        return err.body(), err.status


def _install_lifespan(app: Quart, service: ModelService) -> None:
    @app.before_serving
    async def start_loading() -> None:
        # Not awaited: the server answers (503 on /health) while the model loads.
        app.extensions["llamba.load"] = asyncio.get_running_loop().create_task(_load(app, service))

    @app.after_serving
    async def stop_engine() -> None:
        await anyio.to_thread.run_sync(service.stop)


async def _load(app: Quart, service: ModelService) -> None:
    try:
        await service.load()
    except Exception:
        on_failure = app.extensions.get("llamba.on_load_failure")
        if on_failure is not None:
            on_failure()
