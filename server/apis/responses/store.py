"""Stored Responses API responses: what `GET /v1/responses/{id}` returns and what `previous_response_id`
continues.

A bounded store (the newest `limit` responses; the oldest is dropped first). It lives in memory; with
`--responses-dir` every response is also a JSON file there, written behind by one worker thread (in
order, so the event loop never waits on the disk), and read back at start, so stored responses survive
a restart. A response that was still running when the server stopped reads back as failed.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("server")

TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
INTERRUPTED = {"code": "server_error", "message": "the server stopped before this response finished"}


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the Response object as GET returns it
    messages: list[dict[str, Any]]  # the conversation as chat messages, output included (no instructions)


class ResponseStore:
    def __init__(self, limit: int = 1000, folder: Path | None = None) -> None:
        if limit < 1:
            raise ValueError("the responses store keeps at least one response")
        self.limit = limit
        self.folder = folder
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="responses-store")
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            self._load(folder)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def put(self, entry: StoredResponse) -> None:
        """Keep (or update) a response; the oldest goes when the store is full."""
        response_id = entry.response["id"]
        self._entries[response_id] = entry
        self._write(response_id, entry)
        while len(self._entries) > self.limit:
            oldest, _ = self._entries.popitem(last=False)
            self._remove(oldest)

    def delete(self, response_id: str) -> bool:
        if self._entries.pop(response_id, None) is None:
            return False
        self._remove(response_id)
        return True

    def close(self) -> None:
        """Finish the pending file writes (server shutdown)."""
        self._writer.shutdown(wait=True)

    # -- files --------------------------------------------------------------------------------------
    def _path(self, response_id: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{response_id}.json"  # ids are the server's own (resp_ and hex digits)

    def _write(self, response_id: str, entry: StoredResponse) -> None:
        if self.folder is None:
            return
        # Serialised now, on the loop: the entry's dicts may change after this call returns.
        data = json.dumps(asdict(entry), ensure_ascii=False)
        self._submit(_write_file, self._path(response_id), data)

    def _remove(self, response_id: str) -> None:
        if self.folder is not None:
            self._submit(_remove_file, self._path(response_id))

    def _submit(self, job: Any, *args: Any) -> None:
        try:
            self._writer.submit(job, *args)
        except RuntimeError:  # closed: a response that ends after the server's shutdown stays unwritten
            log.warning("responses.write_after_close", args=str(args[0]))

    def _load(self, folder: Path) -> None:
        entries = []
        for path in folder.glob("resp_*.json"):
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
                entries.append(StoredResponse(raw["response"], raw["messages"]))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("responses.unreadable", path=str(path), error=str(exc))
        entries.sort(key=lambda e: e.response.get("created_at", 0))
        for entry in entries:
            if entry.response.get("status") not in TERMINAL:
                entry.response |= {"status": "failed", "error": INTERRUPTED}
                self.put(entry)
            else:
                self._entries[entry.response["id"]] = entry
        while len(self._entries) > self.limit:
            oldest, _ = self._entries.popitem(last=False)
            self._remove(oldest)
        log.info("responses.loaded", count=len(self._entries), folder=str(folder))


def _remove_file(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.error("responses.remove_failed", path=str(path), error=str(exc))


def _write_file(path: Path, data: str) -> None:
    """Write whole or not at all: a temporary file renamed over the old one."""
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(data, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        log.error("responses.write_failed", path=str(path), error=str(exc))
