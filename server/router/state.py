"""One catalogue model's state in the router: its status, child process, users and load progress."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from server.router.catalogue import ModelEntry
from server.router.child import Child

UNLOADED, LOADING, LOADED, SLEEPING, FAILED = "unloaded", "loading", "loaded", "sleeping", "failed"
DOWNLOADING = "downloading"  # POST /models: its file is being fetched into the cache (no child yet)
RUNNING = (LOADED, SLEEPING)  # a child that answers requests (a sleeping one wakes on its own)


@dataclass
class ModelState:
    entry: ModelEntry
    status: str = UNLOADED
    child: Child | None = None  # from the start of a load until the process has ended
    in_flight: int = 0  # requests the router is forwarding to it now
    last_used: float = 0.0
    stopping: bool = False  # the router is stopping its child (unload or eviction)
    progress: dict[str, Any] | None = None  # the load's {stage, value}
    failure: dict[str, Any] | None = None  # a failed load or a crash: exit code and last log lines
    info: dict[str, Any] | None = None  # what the child said about its model once loaded
    loads: int = 0
    requests: int = 0  # requests forwarded to its child
    failures: int = 0  # failed loads and crashes
    evictions: int = 0  # stopped to make room for another model (--models-max)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def idle(self) -> bool:
        """Could be given up now: running, nobody using it, not already going."""
        return self.status in RUNNING and self.in_flight == 0 and not self.stopping

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def status_object(self) -> dict[str, Any]:
        """llama-server's `status` of a /models entry, plus the child's pid, progress and failure."""
        status: dict[str, Any] = {"value": self.status}
        if self.child is not None:
            status["args"] = list(self.child.args)
            status["pid"] = self.child.pid
        if self.status in (LOADING, DOWNLOADING) and self.progress:
            status["progress"] = self.progress
        if self.status == FAILED and self.failure:
            status |= {"failed": True, **self.failure}
        return status

    def listing(self) -> dict[str, Any]:
        """The model's entry in GET /models (and /v1/models)."""
        entry = self.entry
        item: dict[str, Any] = {"id": entry.id, "object": "model", "owned_by": "llamba", "created": 0}
        item |= {"aliases": list(entry.aliases), "source": entry.source, "path": entry.model}
        item["can_remove"] = entry.source in ("builtin", "cache")  # DELETE /models: only the caches' models
        item |= {"status": self.status_object(), "in_flight": self.in_flight, "loads": self.loads}
        if self.info is not None:
            item["meta"] = self.info
        return item
