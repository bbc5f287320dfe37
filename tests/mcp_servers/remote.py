"""A remote MCP server for the tests: the `mcp` SDK's FastMCP (`MCPServer` in mcp 2) over Streamable
HTTP or HTTP+SSE on 127.0.0.1, behind a check of the `Authorization` header.

    python remote.py --transport streamable-http|sse [--token SECRET] [--port N]

It binds the port itself (0: any free one) and prints one line `PORT <n>` once it listens, so a test
never races another process for a port. A request without `Authorization: Bearer <token>` is a 401
(and counted: `/stats` tells how many requests came and how many were refused, as JSON).

Tools: `echo` (text), `add` (a, b), `pid`, `sleep` (seconds: a call to kill the server in), and
`grow`, which adds the tool `late_tool` at run time and announces it (`notifications/tools/list_changed`
on handshake-era sessions, the subscription bus on 2026 ones).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

STATS = {"requests": 0, "refused": 0, "authorized": 0}


def build(name: str) -> MCPServer:
    server = MCPServer(name, log_level="WARNING")

    @server.tool(description="Echo the text back.")
    def echo(text: str) -> str:
        return text

    @server.tool(description="Add two numbers.")
    def add(a: float, b: float) -> float:
        return a + b

    @server.tool(description="The server's process id.")
    def pid() -> int:
        return os.getpid()

    @server.tool(description="Sleep, then answer.")
    async def sleep(seconds: float = 60.0) -> str:
        await asyncio.sleep(seconds)
        return "slept"

    @server.tool(description="Add the tool late_tool, and say so.")
    async def grow(ctx: Context) -> str:
        if "late_tool" not in {t.name for t in await server.list_tools()}:
            server.add_tool(lambda: "late and here", name="late_tool", description="Added at run time.")
        await ctx.notify_tools_changed()  # 2026 sessions: their subscriptions/listen stream
        try:
            await ctx.session.send_tool_list_changed()  # handshake-era sessions
        except Exception as exc:  # a modern session has no such channel: the bus above carried it
            sys.stderr.write(f"remote: send_tool_list_changed: {exc}\n")
        return "grown"

    return server


class Guard:
    """ASGI: every HTTP request needs the bearer token (when one is set); `/stats` is open."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] == "/stats":
            return await respond(send, 200, json.dumps(STATS).encode())
        STATS["requests"] += 1
        headers = dict(scope["headers"])
        if self.token is not None and headers.get(b"authorization") != f"Bearer {self.token}".encode():
            STATS["refused"] += 1
            return await respond(send, 401, b'{"error": "a bearer token is required"}')
        STATS["authorized"] += 1
        return await self.app(scope, receive, send)


async def respond(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", choices=["streamable-http", "sse"], default="streamable-http")
    parser.add_argument("--token")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = build(f"remote-{args.transport}")
    app = server.streamable_http_app() if args.transport == "streamable-http" else server.sse_app()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    config = uvicorn.Config(Guard(app, args.token), log_level="warning", lifespan="on")
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
