"""The test session's reaper: kills every process the session started, however the session ends.

tests/conftest.py starts this program when pytest starts, with a pipe on its stdin, and adds a token
of its own to LLAMBA_TEST_SESSIONS in pytest's environment, which every process the tests start
inherits: servers, routers and their children, MCP servers, shell tools, Ray's processes, browsers,
nested pytest runs, whether started by Popen, subprocess.run or a server. When the pipe reaches its
end (pytest exited, raised, aborted or was SIGKILLed: the kernel closes a dead process's descriptors)
or this program's parent changes (pytest is gone though a forked child still holds the pipe), it
kills every process whose environment carries the token, round after round until none is left.

Why the environment: it is inherited through a new session or process group (MCP servers and the
router's children start their own), a double fork and an exec, and /proc/PID/environ shows it as
the process started, whatever the process does to its own os.environ. A process group misses
those that leave it; PR_SET_PDEATHSIG covers one generation, and fires when the forking thread
ends rather than the process. Only a child started with an environment built from scratch escapes;
no test does that (tests/test_suite_rules.py runs a pytest session and SIGKILLs it to check).

Run as `python reaper.py TOKEN`, in a session of its own (a Ctrl-C or a hang-up meant for pytest's
terminal does not stop it first). It writes one line to stderr for each process it kills.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

ENV = "LLAMBA_TEST_SESSIONS"  # the tokens of the sessions a process belongs to, space-separated
ROUNDS = 100  # kill rounds, 0.05 s apart: a process forked as its parent died shows up in the next


def carriers(token: str) -> dict[int, str]:
    """The processes (pid: command line) whose starting environment holds `token` in ENV, but this one."""
    prefix = f"{ENV}=".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                variables = f.read().split(b"\0")
            tokens = next((v[len(prefix) :].split() for v in variables if v.startswith(prefix)), [])
            if token.encode() in tokens:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    found[int(entry.name)] = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:  # gone since the listing, or another user's
            continue
    return found


def kill_all(token: str) -> int:
    """SIGKILL every carrier until a round finds none (a zombie's environ reads empty); how many."""
    killed = 0
    for _ in range(ROUNDS):
        found = carriers(token)
        if not found:
            break
        for pid, cmdline in found.items():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            killed += 1
            print(f"tests/reaper.py: killed {pid} left by the test session: {cmdline}", file=sys.stderr)
        time.sleep(0.05)
    return killed


def wait_for_the_session_to_end() -> None:
    """Until stdin's pipe reaches its end or the parent that started us is gone."""
    parent = os.getppid()
    while os.getppid() == parent:
        readable, _, _ = select.select([0], [], [], 0.5)
        if readable and not os.read(0, 4096):
            return


def main(token: str) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # meant for the session; this runs until the session ends
    wait_for_the_session_to_end()
    kill_all(token)


if __name__ == "__main__":
    main(sys.argv[1])
