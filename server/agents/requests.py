"""What a request brings to the tools: the /tools call body, and the built-in tools' context a request
names in its headers (x-tool-cwd, x-tool-runtime, x-resp-type). The /tools routes and the tool loops of
the chat and Responses routes read both alike.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from quart import request

from server.builtin_tools import BadContext, ToolContext
from server.http import errors
from server.state import app_state


class ToolCallRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tool: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    cwd: str | None = None  # Llamba's: the working directory, when no x-tool-cwd header gives it


def request_context(body_cwd: str | None = None) -> ToolContext | None:
    """The built-in tools' context for this request (x-tool-cwd, x-tool-runtime, x-resp-type); None
    without built-in tools. An unusable one is a 400."""
    box = app_state().toolbox
    if box is None or box.builtin is None:
        return None
    headers = request.headers
    try:
        return ToolContext.of(
            headers.get("x-tool-cwd") or body_cwd,
            headers.get("x-tool-runtime"),
            box.builtin.defaults,
            headers.get("x-resp-type") or None,
        )
    except BadContext as exc:
        raise errors.invalid_request(str(exc)) from exc
