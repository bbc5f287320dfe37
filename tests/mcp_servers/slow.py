"""A `sleep` tool that answers late (or never, for the call's purposes), next to a prompt `echo`.

`--hang-init` never answers `initialize` (start-up must skip it within the warm-up timeout).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _base import FixtureServer, Tool, echo_tools  # noqa: E402


class SlowServer(FixtureServer):
    def answer(self, message: dict[str, Any]) -> None:
        if message.get("method") == "initialize" and "--hang-init" in sys.argv:
            return
        super().answer(message)


def sleep(_: FixtureServer, args: dict[str, Any], __: Any) -> Any:
    time.sleep(float(args.get("seconds", 60)))
    return "slept"


def main() -> None:
    tools = echo_tools()
    tools["sleep"] = Tool("Sleep, then answer.", sleep, {"seconds": {"type": "number"}})
    SlowServer("slow", tools).run()


if __name__ == "__main__":
    main()
