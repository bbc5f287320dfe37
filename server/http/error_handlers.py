"""The errors every Llamba app (a model server, the router) answers alike: in the shape its route speaks
(Anthropic's under `/v1/messages`, Ollama's under `/api`, OpenAI's/llama-server's elsewhere), for API
errors, validation errors, HTTP errors and anything unexpected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from pydantic import ValidationError
from quart import Quart, current_app, request
from werkzeug.exceptions import HTTPException

from server.http import errors

log = structlog.get_logger("server")

ANTHROPIC_PREFIX = "/v1/messages"  # server/apis/anthropic/routes.py's routes
OLLAMA_PREFIX = "/api"  # server/apis/ollama/routes.py's routes

# Routes whose clients read another error shape than OpenAI's (every other route's), by path prefix.
ERROR_SHAPES: tuple[tuple[str, Callable[[errors.APIError], dict[str, Any]]], ...] = (
    (ANTHROPIC_PREFIX, errors.anthropic_body),
    (OLLAMA_PREFIX, errors.ollama_body),
)


def error_reply(err: errors.APIError) -> tuple[dict[str, Any], int, dict[str, str]]:
    """The error in the shape the request's route speaks, its status and headers."""
    path = request.path
    for prefix, shape in ERROR_SHAPES:
        if path == prefix or path.startswith(prefix + "/"):
            return shape(err), err.status, err.headers
    return err.body(), err.status, err.headers


def http_error(exc: HTTPException) -> errors.APIError:
    """Werkzeug's HTTP errors (no such route, a body Quart cannot read) as llama-server words them."""
    status = exc.code or 500
    if status == 404:
        return errors.not_found(f"File Not Found: {request.path}")
    if status == 400:
        return errors.invalid_request(f"Invalid request body: {exc.description}")
    if status == 413:
        limit = current_app.config["MAX_CONTENT_LENGTH"]
        return errors.APIError(
            413, f"the request body is over {limit} bytes (--max-body-size)", "request_too_large"
        )
    return errors.APIError(status, exc.description or exc.name, "invalid_request_error")


def install_error_handlers(app: Quart) -> None:
    @app.errorhandler(errors.APIError)
    async def on_api_error(exc: errors.APIError) -> Any:
        return error_reply(exc)

    @app.errorhandler(ValidationError)
    async def on_validation_error(exc: ValidationError) -> Any:
        return error_reply(errors.from_validation(exc))

    @app.errorhandler(HTTPException)
    async def on_http_error(exc: HTTPException) -> Any:
        return error_reply(http_error(exc))

    @app.errorhandler(Exception)
    async def on_unexpected(exc: Exception) -> Any:
        log.exception("request.failed", app=app.name, error=str(exc))
        return error_reply(errors.internal(exc))
