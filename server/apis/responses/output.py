"""A Responses API response's output items built from token events: the stream's item events as they
come (output_item.added, content_part.added, the deltas, their .done events, output_item.done) and the
finished items, which the stored response and a whole reply hold (the same items, so a stream and a
whole reply agree).

Items follow each other as the generation's parts do: a `reasoning` item while reasoning streams, a
`message` item for the answer, a `function_call` item per call. One item is open at a time.

A run with `mcp` tools (server/agents/loop.py) starts with an `mcp_list_tools` item per server; a call of an
MCP tool is an `mcp_call` item (OpenAI's shape: `name` is the server's own tool name, `server_label`
its server) whose arguments stream as `response.mcp_call_arguments.delta`; it stays pending after
`response.mcp_call_arguments.done` until its result comes (`response.mcp_call.completed` or
`.failed`, then `response.output_item.done` with `output` or `error`), and the next round's items
follow it. A call that waits for the client's approval is an `mcp_approval_request` item instead (added,
then done with its arguments; the run ends there), and a call the client then approves is an `mcp_call`
item with its `approval_request_id`, first in the next response.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from engine.api import TokenEvent, ToolCallDelta
from server.agents.loop import ToolExecuted
from server.mcp import McpTool

Payload = dict[str, Any]  # one stream event, before its sequence number


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class OutputItems:
    """The output items of one response, fed token events in order."""

    def __init__(
        self, mcp_tools: Mapping[str, McpTool] | None = None, approval: frozenset[str] = frozenset()
    ) -> None:
        self.items: list[dict[str, Any]] = []  # finished and open items, in output order
        self.n_reasoning_tokens = 0
        self.mcp_tools = mcp_tools or {}  # the MCP tools by the name the model calls them
        self.approval = approval  # those whose calls become mcp_approval_request items (not run)
        self._open: int | None = None
        self._call_items: dict[int, int] = {}  # tool-call index -> its item index
        self._pending: dict[str, int] = {}  # an MCP call's id -> its item, until its result comes

    def feed(self, event: TokenEvent) -> list[Payload]:
        out: list[Payload] = []
        if event.reasoning_text:
            self.n_reasoning_tokens += event.token is not None
            out += self._text("reasoning", event.reasoning_text)
        if event.text:
            out += self._text("message", event.text)
        for step in event.tool_calls:
            out += self._tool_step(step)
        if event.finish_reason is not None and self._pending and self._open in self._pending.values():
            out += self.close()  # the round ended: its MCP calls' arguments are done, the calls run now
        return out

    def close(self, status: str = "completed") -> list[Payload]:
        """Finish the open item (`status` incomplete when the output was cut at its length limit)."""
        if self._open is None:
            return []
        index, self._open = self._open, None
        item = self.items[index]
        if item["type"] == "mcp_approval_request":  # its arguments complete: done, waiting for the client
            return [item_event("done", index, item)]
        item["status"] = status
        head = {"item_id": item["id"], "output_index": index}
        out: list[Payload] = []
        if item["type"] == "mcp_call":  # done once its result comes (`tool_result`)
            item["status"] = "calling"
            return [{"type": "response.mcp_call_arguments.done", **head, "arguments": item["arguments"]}]
        if item["type"] == "function_call":
            out.append(
                {"type": "response.function_call_arguments.done", **head, "arguments": item["arguments"]}
            )
        else:
            part = item["content"][0]
            done = (
                "response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done"
            )
            extra = {} if item["type"] == "reasoning" else {"logprobs": []}
            out.append({"type": done, **head, "content_index": 0, "text": part["text"], **extra})
            out.append({"type": "response.content_part.done", **head, "content_index": 0, "part": dict(part)})
        out.append(item_event("done", index, item))
        return out

    def abandon_calls(self) -> list[Payload]:
        """The MCP calls left without a result (the run ended or stopped before they ran): done, as
        `incomplete`."""
        out: list[Payload] = []
        for index in self._pending.values():
            self.items[index]["status"] = "incomplete"
            out.append(item_event("done", index, self.items[index]))
        self._pending.clear()
        return out

    def finished(self) -> list[dict[str, Any]]:
        """The items done so far (all of them once the response ends)."""
        waiting = {self._open, *self._pending.values()}
        return [copy_item(item) for i, item in enumerate(self.items) if i not in waiting]

    def list_tools(self) -> list[Payload]:
        """An `mcp_list_tools` item for each server whose tools the run offers."""
        servers: dict[str, list[McpTool]] = {}
        for tool in self.mcp_tools.values():
            servers.setdefault(tool.server, []).append(tool)
        out: list[Payload] = []
        for label, tools in servers.items():
            listed = [listed_tool(tool) for tool in tools]
            item = {"id": item_id("mcpl"), "type": "mcp_list_tools", "server_label": label, "tools": listed}
            self.items.append(item)
            head = {"item_id": item["id"], "output_index": len(self.items) - 1}
            out.append(item_event("added", head["output_index"], item))
            out.append({"type": "response.mcp_list_tools.in_progress", **head})
            out.append({"type": "response.mcp_list_tools.completed", **head})
            out.append(item_event("done", head["output_index"], item))
        return out

    def tool_result(self, executed: ToolExecuted) -> list[Payload]:
        """An MCP call's result: its item completed (or failed) and done."""
        out = self.close()
        index = self._pending.pop(executed.call.id)
        item = self.items[index]
        head = {"item_id": item["id"], "output_index": index}
        if executed.is_error:
            text = executed.content.removeprefix("Error: ")
            error = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": text}]}
            item |= {"status": "failed", "output": None, "error": error}
        else:
            item |= {"status": "completed", "output": executed.content, "error": None}
        out.append({"type": f"response.mcp_call.{item['status']}", **head})
        out.append(item_event("done", index, item))
        return out

    def approved_call(self, executed: ToolExecuted, tool: McpTool, request_id: str) -> list[Payload]:
        """A call the client approved (an mcp_approval_response), run before the response's rounds:
        its `mcp_call` item, added and done with its result."""
        item = {"id": item_id("mcp"), "type": "mcp_call", "server_label": tool.server, "name": tool.tool,
                "arguments": executed.call.arguments, "approval_request_id": request_id,
                "status": "in_progress"}  # fmt: skip
        out = self.close()
        self.items.append(item)
        index = len(self.items) - 1
        self._pending[executed.call.id] = index
        out.append(item_event("added", index, item))
        out.append({"type": "response.mcp_call.in_progress", "item_id": item["id"], "output_index": index})
        return out + self.tool_result(executed)

    def _start(self, item: dict[str, Any], part: dict[str, Any] | None) -> list[Payload]:
        out = self.close()
        self.items.append(item)
        index = self._open = len(self.items) - 1
        out.append(item_event("added", index, item))
        if part is not None:
            item["content"].append(part)
            head = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append({"type": "response.content_part.added", **head, "part": dict(part)})
        return out

    def _text(self, kind: str, text: str) -> list[Payload]:
        out: list[Payload] = []
        if self._open is None or self.items[self._open]["type"] != kind:
            if kind == "reasoning":
                item = {"id": item_id("rs"), "type": "reasoning", "summary": [], "content": []}
                part = {"type": "reasoning_text", "text": ""}
            else:
                item = {"id": item_id("msg"), "type": "message", "role": "assistant", "content": []}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._start(item | {"status": "in_progress"}, part)
        index = self._open
        assert index is not None
        item = self.items[index]
        item["content"][0]["text"] += text
        head = {"item_id": item["id"], "output_index": index, "content_index": 0, "delta": text}
        if kind == "reasoning":
            return [*out, {"type": "response.reasoning_text.delta", **head}]
        return [*out, {"type": "response.output_text.delta", **head, "logprobs": []}]

    def _tool_step(self, step: ToolCallDelta) -> list[Payload]:
        out: list[Payload] = []
        if step.index not in self._call_items:
            out += self._new_call(step)
        index = self._call_items[step.index]
        item = self.items[index]
        if step.arguments:
            item["arguments"] += step.arguments
            if item["type"] == "mcp_approval_request":
                return out  # told whole, when it is done
            delta = {"item_id": item["id"], "output_index": index, "delta": step.arguments}
            kind = "mcp_call_arguments" if item["type"] == "mcp_call" else "function_call_arguments"
            out.append({"type": f"response.{kind}.delta", **delta})
        return out

    def _new_call(self, step: ToolCallDelta) -> list[Payload]:
        """A call's item: `mcp_call` for an MCP tool (Llamba runs it), `mcp_approval_request` for one
        whose calls wait for the client's approval, else `function_call`."""
        tool = self.mcp_tools.get(step.name or "")
        if tool is not None and tool.name in self.approval:
            item = {"id": item_id("mcpr"), "type": "mcp_approval_request", "server_label": tool.server,
                    "name": tool.tool, "arguments": ""}  # fmt: skip
            out = self._start(item, None)
            self._call_items[step.index] = len(self.items) - 1
            return out
        if tool is None:
            call_id = step.id or item_id("call")
            item = {"id": item_id("fc"), "type": "function_call", "call_id": call_id, "name": step.name or ""}
        else:
            item = {"id": item_id("mcp"), "type": "mcp_call", "server_label": tool.server, "name": tool.tool}
        out = self._start(item | {"arguments": "", "status": "in_progress"}, None)
        index = self._call_items[step.index] = len(self.items) - 1
        if tool is not None:
            self._pending[step.id or ""] = index
            out.append(
                {"type": "response.mcp_call.in_progress", "item_id": item["id"], "output_index": index}
            )
        return out


def item_event(kind: str, index: int, item: dict[str, Any]) -> Payload:
    """`response.output_item.added` or `.done` (kind) of the item at `index`."""
    return {"type": f"response.output_item.{kind}", "output_index": index, "item": copy_item(item)}


def copy_item(item: dict[str, Any]) -> dict[str, Any]:
    copied = dict(item)
    if "content" in copied:
        copied["content"] = [dict(part) for part in copied["content"]]
    return copied


def listed_tool(tool: McpTool) -> dict[str, Any]:
    listed = {"name": tool.tool, "input_schema": tool.parameters, "description": tool.description or None}
    if tool.read_only:
        listed["annotations"] = {"read_only": True}
    return {k: v for k, v in listed.items() if v is not None}


def output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as the chat messages a conversation continuing it holds: an assistant
    message (its reasoning, text and calls) per round, each MCP call's result after its message."""
    out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for item in items:
        kind = item["type"]
        if kind == "mcp_list_tools" or item.get("status") == "incomplete" and kind == "mcp_call":
            continue  # a call that never ran is not part of the conversation
        if item.get("approval_request_id"):
            continue  # an approved call: its call and its result are in the conversation already
        if kind not in ("mcp_call", "mcp_approval_request"):
            out += results
            results = []
        last = out[-1] if out and out[-1]["role"] == "assistant" else None
        if last is None or (kind in ("message", "reasoning") and last.get("tool_calls")):
            last = {"role": "assistant", "content": ""}
            out.append(last)
        if kind == "message":
            last["content"] += "".join(p["text"] for p in item["content"])
        elif kind == "reasoning":
            reasoning = "".join(p["text"] for p in item["content"])
            last["reasoning_content"] = last.get("reasoning_content", "") + reasoning
        else:
            last.setdefault("tool_calls", []).append(output_call(item))
            results += [mcp_result(item)] if kind == "mcp_call" else []
    said = [m for m in out if m["content"] or m.get("reasoning_content") or m.get("tool_calls")]
    return said + results


def output_call(item: dict[str, Any]) -> dict[str, Any]:
    if item["type"] in ("mcp_call", "mcp_approval_request"):
        name, call_id = f"{item['server_label']}_{item['name']}", item["id"]
    else:
        name, call_id = item["name"], item["call_id"]
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": item["arguments"]}}


def mcp_result(item: dict[str, Any]) -> dict[str, Any]:
    """The tool message an MCP call's result was to the model."""
    error = item.get("error")
    if error is None:
        return {"role": "tool", "tool_call_id": item["id"], "content": item.get("output") or ""}
    text = "\n".join(p["text"] for p in error["content"])
    return {"role": "tool", "tool_call_id": item["id"], "content": f"Error: {text}", "is_error": True}
