"""Anthropic's content blocks built from token events: the stream's block events as they come, and the
whole message's content at the end (the same blocks, so a stream and a whole reply agree).

Blocks follow each other as the generation's parts do: a `thinking` block while reasoning streams, a
`text` block for the answer, a `tool_use` block per call. One block is open at a time; a part of
another kind closes it and opens the next, as Anthropic's streams do. In a server-side tool loop (the
MCP connector's `mcp_servers`), a call of an MCP tool is an `mcp_tool_use` block (the server's own tool
name, its `server_name`) and its result an `mcp_tool_result` block, told whole once the call ran.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine.api import TokenEvent, ToolCallDelta
from server.agents.loop import ToolExecuted

StreamEvent = tuple[str, dict[str, Any]]  # (the SSE event name, its payload)


class ContentBlocks:
    """The blocks of one message, fed token events in order."""

    def __init__(self, mcp_tools: Mapping[str, Any] | None = None) -> None:
        self.mcp_tools = mcp_tools or {}  # a tool loop's MCP tools, by the name the model calls them
        self.blocks: list[dict[str, Any]] = []
        self._open: int | None = None  # the index of the open block
        self._arguments: dict[int, str] = {}  # a tool_use block's input as JSON text so far
        self._call_blocks: dict[int, int] = {}  # tool-call index -> its block index

    def feed(self, event: TokenEvent) -> list[StreamEvent]:
        """The stream events one token event makes: reasoning, text, then tool-call steps."""
        out: list[StreamEvent] = []
        if event.reasoning_text:
            out += self._text("thinking", event.reasoning_text)
        if event.text:
            out += self._text("text", event.text)
        for step in event.tool_calls:
            out += self._tool_step(step)
        return out

    def close(self) -> list[StreamEvent]:
        """Close the open block (the end of the message)."""
        if self._open is None:
            return []
        index, self._open = self._open, None
        out: list[StreamEvent] = []
        if self.blocks[index]["type"] == "thinking":  # Anthropic ends a thinking block with its signature
            out.append(_delta(index, {"type": "signature_delta", "signature": ""}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        return out

    def content(self) -> list[dict[str, Any]]:
        """The whole message's blocks, tool inputs parsed (a broken input is an empty object, as in
        llama-server's replies)."""
        blocks = [dict(block) for block in self.blocks]
        for index, text in self._arguments.items():
            try:
                parsed = json.loads(text) if text else {}
            except json.JSONDecodeError:
                parsed = {}
            blocks[index]["input"] = parsed if isinstance(parsed, dict) else {}
        return blocks

    @property
    def has_tool_use(self) -> bool:
        """Whether the message ends with calls for the client to answer (not the MCP calls run here)."""
        return any(self.blocks[i]["type"] == "tool_use" for i in self._call_blocks.values())

    def tool_result(self, executed: ToolExecuted) -> list[StreamEvent]:
        """An MCP call's result, as an `mcp_tool_result` block told whole."""
        text = executed.content.removeprefix("Error: ") if executed.is_error else executed.content
        block = {"type": "mcp_tool_result", "tool_use_id": executed.call.id, "is_error": executed.is_error,
                 "content": [{"type": "text", "text": text}]}  # fmt: skip
        return [*self._start(block), *self.close()]

    def _start(self, block: dict[str, Any]) -> list[StreamEvent]:
        out = self.close()
        self.blocks.append(block)
        self._open = len(self.blocks) - 1
        start = {"type": "content_block_start", "index": self._open, "content_block": dict(block)}
        return [*out, ("content_block_start", start)]

    def _text(self, kind: str, text: str) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if self._open is None or self.blocks[self._open]["type"] != kind:
            empty = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {}
            out += self._start(empty or {"type": "text", "text": ""})
        index = self._open
        assert index is not None
        self.blocks[index][kind] += text
        delta_type = "thinking_delta" if kind == "thinking" else "text_delta"
        return [*out, _delta(index, {"type": delta_type, kind: text})]

    def _tool_step(self, step: ToolCallDelta) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if step.index not in self._call_blocks:
            tool = self.mcp_tools.get(step.name or "")
            if tool is not None:
                block = {
                    "type": "mcp_tool_use",
                    "id": step.id or "",
                    "name": tool.tool,
                    "server_name": tool.server,
                }
            else:
                block = {"type": "tool_use", "id": step.id or "", "name": step.name or ""}
            out += self._start(block | {"input": {}})
            self._call_blocks[step.index] = len(self.blocks) - 1
            self._arguments[len(self.blocks) - 1] = ""
        index = self._call_blocks[step.index]
        if step.arguments:
            self._arguments[index] += step.arguments
            out.append(_delta(index, {"type": "input_json_delta", "partial_json": step.arguments}))
        return out


def _delta(index: int, delta: dict[str, Any]) -> StreamEvent:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
