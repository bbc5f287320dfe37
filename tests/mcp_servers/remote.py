"""A remote MCP server for the tests: the `mcp` SDK's FastMCP (`MCPServer` in mcp 2) over Streamable
HTTP or HTTP+SSE on 127.0.0.1, behind a check of the `Authorization` header.

    python remote.py --transport streamable-http|sse [--token SECRET] [--port N]

It binds the port itself (0: any free one) and prints one line `PORT <n>` once it listens, so a test
never races another process for a port. A request without `Authorization: Bearer <token>` is a 401
(and counted: `/stats` tells how many requests came and how many were refused, as JSON).
`/hop?to=URL` answers every method with a 307 to URL (before any token check): a redirect elsewhere.

Tools: `echo` (text), `add` (a, b), `pid`, `sleep` (seconds), `hang` (never answers; `/stats` counts
the calls hanging: a test kills the server once one is), `junk`
(its tools/call is answered with a body that is not JSON-RPC: garbage on the wire), and `grow`, which
adds the tool `late_tool` at run time and announces it (`notifications/tools/list_changed` on
handshake-era sessions, the subscription bus on 2026 ones).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from typing import Any
from urllib.parse import parse_qs

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

STATS = {"requests": 0, "refused": 0, "authorized": 0, "hanging": 0}


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

    @server.tool(description="Never answers (a call to kill the server in).")
    async def hang() -> str:
        STATS["hanging"] += 1
        await asyncio.Event().wait()
        return "never"

    @server.tool(description="Answered with garbage (by the HTTP layer, before this runs).")
    def junk() -> str:
        return "not garbage: the guard did not catch the call"

    @server.tool(description="Add the tool late_tool, and say so.")
    async def grow(ctx: Context) -> str:
        if "late_tool" not in {t.name for t in await server.list_tools()}:
            server.add_tool(lambda: "late and here", name="late_tool", description="Added at run time.")
            closed(server)
        await ctx.notify_tools_changed()  # 2026 sessions: their subscriptions/listen stream
        try:
            await ctx.session.send_tool_list_changed()  # handshake-era sessions
        except Exception as exc:  # a modern session has no such channel: the bus above carried it
            sys.stderr.write(f"remote: send_tool_list_changed: {exc}\n")
        return "grown"

    closed(server)
    return server


def closed(server: MCPServer) -> None:
    """Every tool's input schema closed (`additionalProperties: false`), as the stdio fixtures' are: a
    tiny model forced to call a tool then writes only the arguments it has. (FastMCP has no switch for
    it; its tool registry is read here.)"""
    for tool in server._tool_manager.list_tools():
        tool.parameters["additionalProperties"] = False


class Guard:
    """ASGI: every HTTP request needs the bearer token (when one is set); `/stats` is open; a call of
    `junk` is answered with garbage: over Streamable HTTP its POST gets a body that is not JSON-RPC,
    over SSE the event stream gets a line that is not JSON and then a reply whose result is a string."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app, self.token = app, token
        self.sse_send: Any = None  # the open SSE stream's `send` (the SSE transport's replies go there)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] == "/stats":
            return await respond(send, 200, json.dumps(STATS).encode())
        if scope["path"] == "/hop":
            target = parse_qs(scope["query_string"].decode()).get("to", [""])[0].encode()
            return await respond(send, 307, b"", ((b"location", target),))
        STATS["requests"] += 1
        headers = dict(scope["headers"])
        if self.token is not None and headers.get(b"authorization") != f"Bearer {self.token}".encode():
            STATS["refused"] += 1
            return await respond(send, 401, b'{"error": "a bearer token is required"}')
        STATS["authorized"] += 1
        body = b""
        if scope["method"] == "POST":  # read it here, to look for the garbage tool; the app reads it again
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            if b'"tools/call"' in body and b'"name":"junk"' in body.replace(b" ", b""):
                return await self.garbage(json.loads(body), send)
        elif scope["path"].endswith("/sse"):
            send = self.remember(send)
        return await self.app(scope, replay(body, receive), send)

    def remember(self, send: Any) -> Any:
        async def sse_send(message: dict[str, Any]) -> None:
            await send(message)

        self.sse_send = send
        return sse_send

    async def garbage(self, call: dict[str, Any], send: Any) -> None:
        if self.sse_send is None:  # Streamable HTTP: the reply is the POST's body
            return await respond(send, 200, b"this is not JSON-RPC {")
        reply = json.dumps({"jsonrpc": "2.0", "id": call["id"], "result": "not a tools/call result"})
        events = b"event: message\r\ndata: this is not JSON {\r\n\r\n"
        events += b"event: message\r\ndata: " + reply.encode() + b"\r\n\r\n"
        await self.sse_send({"type": "http.response.body", "body": events, "more_body": True})
        await respond(send, 202, b"Accepted")


def replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def again() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then the disconnect, when it comes

    return again


async def respond(send: Any, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *headers]})  # fmt: skip
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
