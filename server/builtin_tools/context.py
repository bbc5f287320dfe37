"""The context one call of a built-in tool runs in: its working directory and runtime (from the
x-tool-cwd and x-tool-runtime headers, else the server's defaults), read_file's x-resp-type, and the
server's --tools-regex-timeout (the search tools' patterns)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from server.builtin_tools.runtime import Runtime
from server.builtin_tools.search import REGEX_TIMEOUT_S
from server.builtin_tools.workdir import BadContext, ToolError, Workdir


@dataclass(frozen=True)
class ToolContext:
    cwd: str | None  # the host working directory; with a runtime, the folder there (None: its default)
    runtime: Runtime | None = None
    resp_type: str | None = None
    regex_timeout: float = REGEX_TIMEOUT_S  # seconds one search call's pattern matching may take
    confined: bool = True  # the file tools refuse paths outside cwd (server/builtin_tools/workdir.py)

    @classmethod
    def of(
        cls, cwd: str | None, runtime: str | None, defaults: ToolContext, resp_type: str | None = None
    ) -> ToolContext:
        """The request's context (empty values are not given); BadContext when it is unusable."""
        run = Runtime.parse(runtime) if runtime else defaults.runtime
        if run is not None:  # the host's cwd means nothing in a container: only an explicit one is used
            if cwd and not PurePosixPath(cwd).is_absolute():
                raise BadContext(f"x-tool-cwd must be an absolute path in a runtime: {cwd}")
            return cls(cwd or None, run, resp_type, defaults.regex_timeout, defaults.confined)
        context = cls(cwd or defaults.cwd, None, resp_type, defaults.regex_timeout, defaults.confined)
        context.workdir()  # a missing or relative cwd is the request's fault: refused before any tool
        return context

    def workdir(self) -> Workdir:
        if self.cwd is None:
            raise BadContext("no working directory for the tools")
        return Workdir.open(self.cwd, self.confined)

    def host_workdir(self) -> Workdir:
        """The file tools' directory; they act on this host only (a ToolError in a runtime)."""
        if self.runtime is not None:
            raise ToolError(f"this tool is not available in a tool runtime ({self.runtime.kind}) in Llamba")
        return self.workdir()
