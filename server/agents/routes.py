"""/tools: list and invoke the built-in tools (`--tools`) and the MCP servers' tools (registered only when
there are some).

Independent of the model: it answers while the model still loads. A request's mistakes (no such tool,
params that do not fit the tool's schema, an unusable x-tool-cwd or x-tool-runtime) are 4xx in OpenAI's
error shape naming the field. A tool's own failure (a missing file, an old_text that is not unique, a
path outside the working directory) is a 200 `{"error": "..."}`, as llama-server answers: the call was
well formed, and the web UI and the tool loop show that text to the model, which may try again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint, jsonify

from server.agents.requests import ToolCallRequest, request_context
from server.agents.toolbox import Toolbox
from server.builtin_tools import BuiltinTool
from server.builtin_tools.shell import ExecShellCommand, Execution
from server.http import errors, sse
from server.http.request_body import json_body
from server.state import app_state

bp = Blueprint("tools", __name__)


def manager() -> Toolbox:
    box = app_state().toolbox
    assert box is not None  # /tools is registered only with a toolbox
    return box


@bp.get("/tools")
async def list_tools() -> Any:
    box = manager()
    await box.wait_ready()  # start-up warm-up is bounded, so this is too
    return jsonify([tool.to_json() for tool in box.tools()])


@bp.post("/tools")
async def call_tool() -> Any:
    body = await json_body(optional=True)
    if not isinstance(body, dict):
        raise errors.invalid_request('expected a JSON object {"tool": name, "params": {...}}')
    call = ToolCallRequest.model_validate(body)
    box = manager()
    await box.wait_ready()
    tool = box.tool(call.tool)
    if tool is None:
        raise errors.not_found(f'unknown tool "{call.tool}"')
    context = request_context(call.cwd)
    if call.stream:
        if not isinstance(tool, BuiltinTool) or not tool.streams:
            raise errors.invalid_request(f"'stream': tool \"{call.tool}\" does not support stream = true")
        params = ExecShellCommand.model_validate(call.params)
        assert context is not None
        return sse.response(exec_events(Execution(params, context.cwd, context.runtime)))
    result = await box.call(tool, call.params, context=context)
    return result.to_json()


async def exec_events(execution: Execution) -> AsyncIterator[bytes]:
    """llama-server's stream: `{"chunk": text}` events as the output comes, the exit code as the last
    chunk, then `{"done": true}`. A client that goes away closes this, which kills the command."""
    try:
        async for chunk in execution.chunks():
            yield sse.event({"chunk": chunk})
    except OSError as exc:  # the runtime's client (docker, ssh) is not installed
        yield sse.event({"done": True, "error": f"failed to spawn process: {exc}"})
        return
    yield sse.event({"chunk": execution.tail()})
    yield sse.event({"done": True})
