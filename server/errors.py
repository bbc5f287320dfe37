"""Errors in OpenAI's shape, with llama-server's error types."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class APIError(Exception):
    def __init__(self, status: int, message: str, error_type: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
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
    """One readable line naming the offending field(s)."""
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"'{where}': {err['msg']}")
    return invalid_request("Invalid request: " + "; ".join(parts))
