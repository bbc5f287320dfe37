"""JSON log lines stay whole while other threads log: a router parses its children's lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# The engine thread logs load progress while hypercorn (stdlib logging) announces itself on the same stream.
RACE = """
import logging, sys, threading
import structlog
from server.http import logs
logs.configure("json")
hypercorn = logging.getLogger("hypercorn.error")
def progress():
    for i in range(5000):
        structlog.get_logger().info("model.load_progress", stage="read", value=i)
worker = threading.Thread(target=progress)
worker.start()
for i in range(5000):
    hypercorn.warning("Running on http://127.0.0.1:8080 (CTRL + C to quit) %d", i)
worker.join()
"""


def test_json_lines_stay_whole_while_other_threads_log() -> None:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", RACE], cwd=root, capture_output=True, text=True, check=True)
    lines = out.stderr.splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(events) == 5000 and all("{" not in line for line in lines if not line.startswith("{"))
    assert [e["value"] for e in events] == list(range(5000))
