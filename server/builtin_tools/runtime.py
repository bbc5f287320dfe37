"""Where exec_shell_command runs: on this host, or (x-tool-runtime / --tools-runtime) in a running
docker or podman container, or over ssh. Values that could inject options into those commands are refused.

Llamba runs only the shell command in a runtime; the file tools act on the host's working directory and
refuse a runtime (llama-server also reads and writes files inside it).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from server.builtin_tools.workdir import BadContext

# A container id or name as docker and podman allow them; the first character is never `-`.
CONTAINER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SSH_TARGET = re.compile(r"^[A-Za-z0-9._@][A-Za-z0-9._@-]*$")
SSH_OPTIONS = (
    "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no",
    "-o", "KbdInteractiveAuthentication=no", "-o", "StrictHostKeyChecking=yes",
)  # fmt: skip
ENGINES = {"docker-container": "docker", "podman-container": "podman"}


@dataclass(frozen=True)
class Runtime:
    kind: str  # docker-container | podman-container | ssh
    target: str  # the container id, or the ssh destination

    @classmethod
    def parse(cls, value: str) -> Runtime:
        """`docker-container:<id>`, `podman-container:<id>` or `ssh:<target>`; BadContext otherwise."""
        kind, sep, target = value.partition(":")
        if not sep or kind not in (*ENGINES, "ssh"):
            raise BadContext(
                f"unknown tool runtime: {value} (expected docker-container:<id>, podman-container:<id> "
                "or ssh:<target>)"
            )
        if kind == "ssh" and not SSH_TARGET.match(target):
            raise BadContext(f"invalid ssh target: {target!r}")
        if kind != "ssh" and not CONTAINER_ID.match(target):
            raise BadContext(f"invalid container id: {target!r}")
        return cls(kind, target)

    def argv(self, command: str, cwd: str | None, timeout_s: float) -> list[str]:
        """The host command that runs `sh -c command` there (in `cwd` when given), killed inside after
        `timeout_s` too: killing the local docker or ssh client does not stop the remote process."""
        inner = ["timeout", "-s", "KILL", f"{max(timeout_s, 0.001):g}s", "sh", "-c", command]
        if self.kind == "ssh":
            line = shlex.join(inner)
            if cwd:
                line = f"cd -- {shlex.quote(cwd)} && {line}"
            return ["ssh", *SSH_OPTIONS, "-n", "--", self.target, line]
        workdir = ["-w", cwd] if cwd else []
        return [ENGINES[self.kind], "exec", *workdir, "--", self.target, *inner]
