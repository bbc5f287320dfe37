"""Start the remote MCP fixture server (tests/mcp_servers/remote.py) as a process, for the tests."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REMOTE = Path(__file__).resolve().parent / "remote.py"
TOKEN = "s3cret-token"  # the bearer token the fixture checks


class RemoteServer:
    """A remote.py process: `url` is its MCP endpoint; `kill()` and `restart()` (same port) for faults."""

    def __init__(self, transport: str = "streamable-http", token: str | None = TOKEN, port: int = 0) -> None:
        self.transport, self.token = transport, token
        args = [sys.executable, str(REMOTE), "--transport", transport, "--port", str(port)]
        self.proc = subprocess.Popen([*args, *(["--token", token] if token else [])], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        line = _readline(self.proc, 60.0)
        assert line.startswith("PORT "), f"remote.py said {line!r}"
        self.port = int(line.split()[1])
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = self.base + ("/sse" if transport == "sse" else "/mcp")

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base + "/stats", timeout=10) as reply:
            return json.loads(reply.read())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def restart(self) -> RemoteServer:
        """A new process on the same port (the old one must be gone)."""
        self.kill()
        return RemoteServer(self.transport, self.token, self.port)

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *_: Any) -> None:
        self.kill()


def _readline(proc: subprocess.Popen[str], within_s: float) -> str:
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(proc.stdout.readline() if proc.stdout else ""))
    reader.daemon = True
    reader.start()
    reader.join(within_s)
    if not found:
        proc.kill()
        raise TimeoutError(f"remote.py did not listen within {within_s} s")
    return found[0].strip()


class Listener:
    """A TCP listener that counts the connections it is offered (and answers none): where a refused
    URL points, to show that no connection was made."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> int:
        """Stop listening; the connections it saw (after a moment for any in flight)."""
        time.sleep(0.2)
        self._stop = True
        self._thread.join(2)
        self.sock.close()
        return self.accepted
