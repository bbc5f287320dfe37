"""Errors in OpenAI's shape, with llama-server's error types."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class APIError(Exception):
    def __init__(
        self, status: int, message: str, error_type: str, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.headers = headers or {}  # e.g. Retry-After on a 503
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {
            "error": {"code": self.status, "message": self.message, "type": self.error_type, **self.extra}
        }


def invalid_request(message: str) -> APIError:
    return APIError(400, message, "invalid_request_error")


def not_found(message: str) -> APIError:
    return APIError(404, message, "not_found_error")


def unavailable(message: str = "Loading model") -> APIError:
    return APIError(503, message, "unavailable_error")


def authentication() -> APIError:
    return APIError(401, "Invalid API Key", "authentication_error")


def internal(exc: Exception) -> APIError:
    """An unexpected exception (a bug) as the client sees it; the caller logs it."""
    return APIError(500, f"internal error: {exc}", "server_error")


def failed_dependency(message: str) -> APIError:
    """424: a server the request named (an MCP server_url) could not be used; OpenAI's status for it."""
    return APIError(424, message, "external_connector_error")


def not_supported(message: str) -> APIError:
    return APIError(501, message, "not_supported_error")


def exceed_context(n_prompt_tokens: int, n_ctx: int) -> APIError:
    return APIError(
        400,
        f"the request exceeds the available context size ({n_prompt_tokens} prompt tokens, context {n_ctx})",
        "exceed_context_size_error",
        n_prompt_tokens=n_prompt_tokens,
        n_ctx=n_ctx,
    )


def from_validation(exc: ValidationError) -> APIError:
    """One readable line naming the offending field(s). Of a union's alternatives only the deepest
    errors are told (a list of blocks whose block 2 is wrong is not also "not a string"), and the
    union's own labels are left out of the field path."""
    found = [(field_path(err["loc"]), err["msg"]) for err in exc.errors()]
    deepest = [
        (where, msg)
        for where, msg in found
        if not any(other != where and other.startswith(where + ".") for other, _ in found)
    ]
    parts = [f"'{where or 'body'}': {msg}" for where, msg in deepest[:3]]
    return invalid_request("Invalid request: " + "; ".join(parts))


# The labels pydantic gives a union's alternatives in an error's location: not fields.
_UNION_LABELS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in _UNION_LABELS)))


# Anthropic's error types by HTTP status (its Messages API documents these); other 4xx are invalid
# requests and other 5xx api errors.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_body(err: APIError) -> dict[str, Any]:
    """An error in Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""
    fallback = "invalid_request_error" if 400 <= err.status < 500 else "api_error"
    return {
        "type": "error",
        "error": {"type": ANTHROPIC_TYPES.get(err.status, fallback), "message": err.message},
    }


def ollama_body(err: APIError) -> dict[str, Any]:
    """An error in Ollama's shape: {"error": "message"} (its /api/* routes)."""
    return {"error": err.message}
