"""/tools: list and invoke the tools of the configured MCP servers (registered only when there are some).

Independent of the model: it answers while the model still loads.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, current_app, jsonify

from server import errors
from server.mcp import McpManager
from server.request_body import json_body

bp = Blueprint("tools", __name__)

MANAGER_KEY = "llamba.mcp"


class ToolCallRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    tool: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


def manager() -> McpManager:
    return current_app.extensions[MANAGER_KEY]


@bp.get("/tools")
async def list_tools() -> Any:
    mcp = manager()
    await mcp.wait_ready()  # start-up warm-up is bounded, so this is too
    return jsonify([tool.to_json() for tool in mcp.tools()])


@bp.post("/tools")
async def call_tool() -> Any:
    body = await json_body(optional=True)
    if not isinstance(body, dict):
        raise errors.invalid_request('expected a JSON object {"tool": name, "params": {...}}')
    call = ToolCallRequest.model_validate(body)
    mcp = manager()
    await mcp.wait_ready()
    tool = mcp.tool(call.tool)
    if tool is None:
        raise errors.not_found(f'unknown tool "{call.tool}"')
    result = await mcp.call(tool, call.params)
    return result.to_json()
