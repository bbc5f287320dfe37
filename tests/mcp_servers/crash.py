"""`crash` answers, then the process dies at once (exit code 3). `pid` tells respawns apart.

`deafen_then_die` answers, stops reading stdin, and exits (code 3) a second later: a big request
written meanwhile fills the pipe and meets EPIPE.
`die` exits at once without answering (the call fails: the server crashed).
`--die-at-start` exits before reading anything (start-up must skip it).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _base import FixtureServer, Tool, echo_tools, text  # noqa: E402


def crash(server: FixtureServer, _: dict[str, Any], request_id: Any) -> Any:
    server.write_raw(server.reply_bytes(request_id, text("goodbye")))
    os._exit(3)


class CrashServer(FixtureServer):
    def after_line(self, message: dict[str, Any]) -> None:
        if message.get("method") == "tools/call" and message["params"]["name"] == "deafen_then_die":
            time.sleep(1.0)
            os._exit(3)


def main() -> None:
    if "--die-at-start" in sys.argv:
        sys.stderr.write("crash fixture: dying at start\n")
        sys.exit(5)
    tools = echo_tools()
    tools["crash"] = Tool("Answer, then exit.", crash)
    tools["die"] = Tool("Exit without answering.", lambda *_: os._exit(3))
    tools["deafen_then_die"] = Tool("Answer, stop reading, exit a second later.", lambda *_: "deaf")
    CrashServer("crash", tools).run()


if __name__ == "__main__":
    main()
