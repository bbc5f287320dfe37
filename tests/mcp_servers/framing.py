"""Framing edge cases: a notification and the reply in ONE write; a reply split over several writes;
a ping request from the server before the reply. `id: 0` (the client's first request) is answered too.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _base import FixtureServer, Tool, echo_tools, text  # noqa: E402


def notify_then_reply(server: FixtureServer, args: dict[str, Any], request_id: Any) -> Any:
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}}
    server.write_raw(json.dumps(note).encode() + b"\n" + server.reply_bytes(request_id, text(args["text"])))
    return None


def split_reply(server: FixtureServer, args: dict[str, Any], request_id: Any) -> Any:
    data = server.reply_bytes(request_id, text(args["text"]))
    for i in range(0, len(data), 7):  # many small reads on the other side
        server.write_raw(data[i : i + 7])
        time.sleep(0.01)
    return None


def ping_first(server: FixtureServer, args: dict[str, Any], request_id: Any) -> Any:
    server.send({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"})
    return args["text"]


class FramingServer(FixtureServer):
    def answer(self, message: dict[str, Any]) -> None:
        if message.get("method") == "initialize":
            # The notification and the reply to initialize (id 0) share one write.
            note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "starting"}}
            result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "framing", "version": "0"}}  # fmt: skip
            self.write_raw(json.dumps(note).encode() + b"\n" + self.reply_bytes(message["id"], result))
            return
        super().answer(message)


def main() -> None:
    tools = echo_tools()
    tools["notify_then_reply"] = Tool("A notification and the reply in one write.", notify_then_reply)
    tools["split_reply"] = Tool("The reply in 7-byte writes.", split_reply)
    tools["ping_first"] = Tool("Ping the client, then answer.", ping_first)
    FramingServer("framing", tools).run()


if __name__ == "__main__":
    main()
