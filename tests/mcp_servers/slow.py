"""A `sleep` tool that answers late (or never, for the call's purposes), next to a prompt `echo`.

`wait` answers after 3 s (no arguments: a model cannot make it longer or shorter). `hang` never
answers; `hanging` lists the request ids of the `hang` calls received, so a test can wait for a call to
be under way. `cancelled` lists the request ids the client cancelled (notifications/cancelled), so a test
can see a stopped call reach the server.
`--hang-init` never answers `initialize` (start-up must skip it within the warm-up timeout).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _base import FixtureServer, Tool, echo_tools  # noqa: E402


class SlowServer(FixtureServer):
    cancelled: list[Any] = []
    hanging: list[Any] = []

    def answer(self, message: dict[str, Any]) -> None:
        if message.get("method") == "initialize" and "--hang-init" in sys.argv:
            return
        super().answer(message)

    def after_line(self, message: dict[str, Any]) -> None:
        if message.get("method") == "notifications/cancelled":
            self.cancelled.append((message.get("params") or {}).get("requestId"))


def sleep(_: FixtureServer, args: dict[str, Any], __: Any) -> Any:
    time.sleep(float(args.get("seconds", 60)))
    return "slept"


def hang(_: FixtureServer, __: dict[str, Any], request_id: Any) -> Any:
    SlowServer.hanging.append(request_id)
    time.sleep(3600)


def main() -> None:
    tools = echo_tools()
    tools["sleep"] = Tool("Sleep, then answer.", sleep, {"seconds": {"type": "number"}})
    tools["wait"] = Tool("Wait a moment, then say so.", lambda *_: time.sleep(3) or "done waiting")
    tools["hang"] = Tool("Never answer.", hang)
    tools["hanging"] = Tool("Request ids of the hang calls.", lambda *_: json.dumps(SlowServer.hanging))
    tools["cancelled"] = Tool("Cancelled request ids.", lambda *_: json.dumps(SlowServer.cancelled))
    SlowServer("slow", tools).run()


if __name__ == "__main__":
    main()
