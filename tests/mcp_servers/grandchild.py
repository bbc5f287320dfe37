"""Spawns a grandchild that inherits stdin/stdout/stderr and sleeps, holding the pipes open.

`--exit-at-start`: spawn it, then exit before answering anything.
`--escape`: the grandchild leaves our process group (setsid), so a group kill cannot reach it.
The grandchild's pid is on the `grandchild_pid` tool and in its argv (`sleep 30` / `sleep 31`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _base import FixtureServer, Tool, echo_tools  # noqa: E402


def main() -> None:
    escape = "--escape" in sys.argv
    grandchild = subprocess.Popen(["sleep", "31" if escape else "30"], start_new_session=escape)
    if "--exit-at-start" in sys.argv:
        os._exit(0)
    tools = echo_tools()
    tools["grandchild_pid"] = Tool("The grandchild's pid.", lambda *_: grandchild.pid)
    FixtureServer("grandchild", tools).run()


if __name__ == "__main__":
    main()
