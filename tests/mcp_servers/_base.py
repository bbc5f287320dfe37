"""A minimal MCP stdio server for the fixtures: one thread per request, so replies can come out of order.

Each fixture script builds a FixtureServer with its tools and hooks and calls run(). The server exits
at once when its stdin closes, like a well-behaved MCP server.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Handler = Callable[["FixtureServer", dict[str, Any], Any], Any]


@dataclass
class Tool:
    description: str
    handler: Handler
    properties: dict[str, Any] = field(default_factory=dict)

    def definition(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "description": self.description,
            # Closed objects: a tiny model forced to call a tool writes only the arguments it has.
            "inputSchema": {"type": "object", "properties": self.properties, "additionalProperties": False},
        }


def text(value: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": str(value)}], "isError": False}


class FixtureServer:
    def __init__(self, name: str, tools: dict[str, Tool]) -> None:
        self.name = name
        # `--only NAME[,NAME...]` offers just those tools (a model then has nothing else to pick).
        args = sys.argv[1:]
        only = next((v for flag, v in zip(args, args[1:], strict=False) if flag == "--only"), None)
        self.tools = {n: t for n, t in tools.items() if only is None or n in only.split(",")}
        self._lock = threading.Lock()
        self._out = sys.stdout.buffer

    def write_raw(self, data: bytes) -> None:
        """Exactly these bytes, in one write (the framing tests depend on it)."""
        with self._lock:
            self._out.write(data)
            self._out.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.write_raw(json.dumps(message).encode() + b"\n")

    def reply_bytes(self, request_id: Any, result: Any) -> bytes:
        return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode() + b"\n"

    def answer(self, message: dict[str, Any]) -> None:
        method, request_id = message.get("method"), message.get("id")
        if method == "initialize":
            result: Any = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": self.name, "version": "0"},
            }
        elif method == "tools/list":
            result = {"tools": [tool.definition(n) for n, tool in self.tools.items()]}
        elif method == "tools/call":
            name = message["params"]["name"]
            if name not in self.tools:
                self.send(
                    {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": "no tool"}}
                )
                return
            try:
                result = self.tools[name].handler(self, message["params"].get("arguments") or {}, request_id)
            except Exception as exc:  # a tool-level failure, reported the MCP way
                result = {
                    "content": [{"type": "text", "text": f"{type(exc).__name__}: {exc}"}],
                    "isError": True,
                }
            if result is None:  # the handler answered by itself
                return
            result = text(result) if not isinstance(result, dict) else result
        else:
            self.send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "no method"}})
            return
        self.write_raw(self.reply_bytes(request_id, result))

    def after_line(self, message: dict[str, Any]) -> None:
        """Runs on the reading thread after each message: a fixture may stop reading here."""

    def run(self) -> None:
        for line in sys.stdin.buffer:
            message = json.loads(line)
            if "id" in message and "method" in message:
                threading.Thread(target=self.answer, args=(message,), daemon=True).start()
            self.after_line(message)
        os._exit(0)  # stdin closed: leave now, whatever is still sleeping


def echo_tools() -> dict[str, Tool]:
    """echo / add / fail / pid: the tools most fixtures share."""
    import time

    def echo(_: FixtureServer, args: dict[str, Any], __: Any) -> Any:
        time.sleep(float(args.get("delay", 0)))
        return args.get("text", "")

    return {
        "echo": Tool(
            "Echo the text back (after an optional delay).",
            echo,
            {"text": {"type": "string"}, "delay": {"type": "number"}},
        ),  # fmt: skip
        "add": Tool(
            "Add two numbers.",
            lambda _, a, __: a["a"] + a["b"],
            {"a": {"type": "number"}, "b": {"type": "number"}},
        ),  # fmt: skip
        "fail": Tool(
            "Always reports an error.",
            lambda *_: {"content": [{"type": "text", "text": "it went wrong"}], "isError": True},
        ),  # fmt: skip
        "pid": Tool("The server's process id.", lambda *_: os.getpid()),
    }
