"""Writes junk around every reply: non-JSON lines, blank and CRLF lines, JSON that is no message,
a reply to an id nobody asked for, the id as a string, and a flood of notifications.

`junk` answers with nothing but junk: its reply's result is a string, not a tools/call result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _base import FixtureServer, Tool, echo_tools  # noqa: E402

NOTIFICATIONS = 2000


class GarbageServer(FixtureServer):
    def write_raw(self, data: bytes) -> None:
        junk = [b"this is not json\n", b"\n", b"   \r\n", b"{broken json\n", b"42\n", b"[]\n", b"\xff\xfe\n",
                b'{"jsonrpc": "2.0", "id": 999999, "result": {"stale": true}}\n',
                b'{"jsonrpc": "2.0", "id": "0", "result": {"wrong": "string id"}}\n',
                b'{"jsonrpc": "2.0", "id": true, "result": {"wrong": "bool id"}}\n']  # fmt: skip
        sys.stderr.write("garbage: about to answer\n")
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}).encode()
        super().write_raw(b"".join(junk) + (note + b"\r\n") * NOTIFICATIONS + data.replace(b"\n", b"\r\n"))


def junk(server: FixtureServer, _: dict[str, Any], request_id: Any) -> Any:
    server.write_raw(server.reply_bytes(request_id, "\x00 not a result \ufffd"))
    return None


def main() -> None:
    tools = echo_tools()
    tools["junk"] = Tool("Answer with junk.", junk)
    GarbageServer("garbage", tools).run()


if __name__ == "__main__":
    main()
