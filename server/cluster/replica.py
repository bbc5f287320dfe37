"""One replica: a Ray actor that starts and owns a `llamba-server` child on the node Ray placed it on.

The actor is the unit Ray schedules (its CPU threads / GPUs are the actor's Ray resources), watches and
restarts: the child is bound to the node's address (or `host`: loopback on a `ray:local` cluster, whose
router is on this machine) on a free port, dies with the actor (PR_SET_PDEATHSIG), and when the child
exits on its own the actor exits too (`os._exit`), so Ray sees the replica die and restarts it under
`max_restarts` by running this constructor again: a new child, a new port, a new incarnation id. The
router reaches the child over HTTP at the address `describe` reports; tokens never pass through Ray
(docs/scale-out.md says why).

This module is imported in Ray's worker processes as well as the router: it imports Ray only inside the
methods that run in the actor.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from typing import Any

PR_SET_PDEATHSIG = 1
STOP_TIMEOUT_S = 5.0


def _child_setup() -> None:
    """In the forked child before exec: SIGKILL when the actor's process goes, however it goes; and the
    normal CPU priority (Ray runs its workers at nice 15, and a server that inherits it starved behind
    every other process on a busy machine: 15% of a core under a load of 20)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    with contextlib.suppress(OSError):  # lowering niceness needs privilege (CAP_SYS_NICE)
        os.setpriority(os.PRIO_PROCESS, 0, 0)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ReplicaServer:
    """The actor's class (`ray.remote` is applied by `server/cluster/main.py`)."""

    def __init__(self, args: list[str], env: dict[str, str], host: str | None = None) -> None:
        import ray

        context = ray.get_runtime_context()
        self.node_ip = host or ray.util.get_node_ip_address()
        self.port = free_port(self.node_ip)
        self.incarnation = uuid.uuid4().hex[:12]
        self.restarted = bool(context.was_current_actor_reconstructed)
        self.node_id = context.get_node_id()
        self._stopping = False
        cmd = [sys.executable, "-m", "server", *args, "--host", self.node_ip, "--port", str(self.port)]
        # The child's log goes to this worker's stdout, which Ray keeps in its session's log folder.
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            preexec_fn=_child_setup,
        )
        threading.Thread(target=self._watch, name="replica-watch", daemon=True).start()

    def _watch(self) -> None:
        """The child ended: unless the router stopped it, end the actor so that Ray restarts it."""
        code = self.proc.wait()
        if not self._stopping:
            print(f"llamba replica: child exited with {code}; ending the actor (Ray restarts it)", flush=True)
            os._exit(1)

    def describe(self) -> dict[str, Any]:
        return {
            "url": f"http://{self.node_ip}:{self.port}",
            "pid": self.proc.pid,
            "incarnation": self.incarnation,
            "node_ip": self.node_ip,
            "node_id": self.node_id,
            "restarted": self.restarted,
            "exit_code": self.proc.poll(),
        }

    def stop(self) -> int | None:
        """SIGTERM the child (it drains), SIGKILL after STOP_TIMEOUT_S; its exit code."""
        self._stopping = True
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()
