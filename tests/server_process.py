"""A real llamba-server process on 127.0.0.1 for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
# The suite's one bound on liveness: how long something that must happen (a slot freed after a cancel, a
# server gone after SIGTERM, a call answered once its timeout fired, a cancel reaching an MCP server) may
# take before the test fails. Not a speed check: sized for a 2-core runner loaded by the suite and by other
# jobs, where a step that takes 50 ms idle can take seconds. Where the wrong behaviour would also end on
# its own (a generation running to its last token, a tool finishing its sleep), the test makes that take
# well past this bound or counts that it was cut short, so that a fast machine cannot hide a regression.
# Bounds on work (a model load, a whole generation, Ray's start) are larger and say what they wait for.
LIVENESS_S = 20.0


def wait_until(condition: Callable[[], bool], within_s: float, what: str) -> float:
    """Poll `condition` until it holds, failing the test after `within_s` seconds; the seconds it took.

    For liveness bounds (LIVENESS_S: a slot is freed, a process ends) and work bounds (a generation ends):
    behaviour that must happen within a generous time, not a speed check (the benchmarks measure speed).
    """
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < within_s, f"{what}: not within {within_s} s"
        time.sleep(0.02)
    return time.monotonic() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


class ServerProcess:
    """`python -m server ARGS` on a free port, its output in a log file. Whatever way the test session
    ends, the session's reaper (tests/reaper.py) kills it and whatever it started, if stop() did not."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"llamba-server-{self.port}.log"
        self._log = self.log_path.open("wb")
        self.killed = False  # stop() had to SIGKILL it
        cmd = [sys.executable, "-m", "server", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )

    def wait_healthy(
        self, timeout: float = 120.0, path: str = "/health", poll_s: float = 0.2, **client: Any
    ) -> ServerProcess:
        """Until `path` answers 200, asked every `poll_s` seconds (`client`: httpx's options, e.g. `verify`
        for HTTPS)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base_url + path, timeout=1.0, **client).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
        raise TimeoutError(f"server not healthy after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, timeout: float = LIVENESS_S) -> float:
        """SIGTERM, wait up to `timeout` seconds, then SIGKILL (and set `killed`); the seconds it took."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return time.monotonic() - start

    def exited_cleanly(self) -> bool:
        """Whether the stopped process ended by itself with code 0, not by stop()'s SIGKILL."""
        return not self.killed and self.proc.returncode == 0


def slow_client(port: int, path: str, fields: dict[str, Any]) -> socket.socket:
    """A connection that has sent a JSON POST to `path` (Connection: close) with a 4 KiB receive window:
    a client that reads at its own pace (or not at all) while the server's bytes pile up."""
    body = json.dumps(fields).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", port))
    sock.sendall(head + body)
    return sock
