"""echo / add / fail / pid, plus env, cwd, stdin-closing and stderr-flooding tools, and `grow`, which
adds the tool `late` and sends `notifications/tools/list_changed`.

`--rename OLD=NEW` exposes a tool under another name (to build name collisions).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _base import FixtureServer, Tool, echo_tools  # noqa: E402


class EchoServer(FixtureServer):
    def after_line(self, message: dict[str, Any]) -> None:
        if message.get("method") == "tools/call" and message["params"]["name"] == "close_stdin":
            os.close(0)  # alive, but deaf: what we write next meets EPIPE
            time.sleep(3600)


def stderr_flood(_: FixtureServer, args: dict[str, Any], __: Any) -> Any:
    line = b"x" * 1000 + b"\n"
    for _i in range(int(args.get("kib", 1024))):  # far more than a pipe buffer holds
        os.write(2, line)
    return "flooded"


def grow(server: FixtureServer, _: dict[str, Any], __: Any) -> Any:
    server.tools["late"] = Tool("Added at run time.", lambda *_: "late and here")
    server.send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    return "grown"


def main() -> None:
    tools = echo_tools()
    tools["env"] = Tool("An environment variable.", lambda _, a, __: os.environ.get(a["name"], "<unset>"))
    tools["cwd"] = Tool("The working directory.", lambda *_: os.getcwd())
    tools["close_stdin"] = Tool("Close stdin and keep running.", lambda *_: "stdin closed")
    tools["stderr_flood"] = Tool("Write about a MiB to stderr.", stderr_flood)
    tools["grow"] = Tool("Add the tool late, and say so.", grow)
    args = sys.argv[1:]
    for flag, value in zip(args, args[1:], strict=False):
        if flag == "--rename":
            old, new = value.split("=", 1)
            tools[new] = tools.pop(old)
    EchoServer("echo", tools).run()


if __name__ == "__main__":
    main()
