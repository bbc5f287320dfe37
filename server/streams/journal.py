"""Stream journals (`--stream-journal DIR`): a resumable session's request and bytes on disk.

One file per session (`<digest of owner and conversation id>.journal`) in a folder of its own per model
(DIR/<model file>-<digest of its path>, locked by the running server: router children of different
models share DIR, and a second server on the same folder refuses to start). A file is a magic line and
then records, each `kind (1 byte) | length (u32) | crc32 (u32) | payload`:

- `H` the header (JSON): conversation id, owner (the API key's digest, as server/streams/sessions.py keys
  sessions), client, and the `Recipe`: route, the request body as received (it passed validation, so
  validating it again gives the same request), the reply's own ids (`ReplyIds`), whether decoding is
  deterministic, the model;
- `D` one chunk of SSE bytes, as the session's producer yielded it;
- `C` the journal's cap was reached (the session's ring size, `--stream-buffer-size`): no later chunk
  is recorded;
- `E` the end (JSON: wall-clock time it finished, its total bytes).

A reader keeps the whole records and stops at the first short or corrupt one: a process killed in the
middle of a write leaves a journal readable up to its last whole record (the file is cut there before
anything is appended to it again).

Durability (the fsync policy): one writer thread does every file operation in order, so the event loop
never touches the disk. It writes each chunk to the OS (an unbuffered `write`) as soon as it takes it
from its queue, normally well within a millisecond; a killed process (SIGKILL, OOM, a crash) loses only
chunks still in that queue, since what was written to the OS survives the process. It fsyncs a journal
when it is created (and its folder), when it ends, and otherwise at most once per `FSYNC_INTERVAL_S` while
chunks come: a power loss or kernel crash can lose about the last second of a live stream's bytes (and a
session created within that second). A deterministic session regenerates what was lost in either case.
An append costs the event loop about 4 us (framing, CRC, a queue put: 100k chunks of 227 bytes at a
machine load of 10); the thread writes each record with its own `write`.

Bounds: at most `--stream-buffer-size` bytes of chunks per journal and one journal per session, so
`--stream-max-sessions` journals; a journal is deleted with its session (TTL, DELETE, replacement,
eviction).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import queue
import struct
import threading
import time
import uuid
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import structlog

log = structlog.get_logger("server")

MAGIC = b"LLAMBA-STREAM-JOURNAL 1\n"
HEADER, DATA, CUT, END = b"H", b"D", b"C", b"E"
_RECORD = struct.Struct(">cII")  # kind, payload length, crc32 of the payload
FSYNC_INTERVAL_S = 1.0
SUFFIX = ".journal"


class JournalError(Exception):
    """The journal folder cannot be used (not a folder, not writable, in use by another server)."""


@dataclass(frozen=True)
class ReplyIds:
    """The values of a reply's bytes that are not decoded from the model: its id and creation time.
    A route builds its stream from these, so a regenerated stream carries the journaled ones."""

    reply_id: str
    created: int

    @classmethod
    def fresh(cls, prefix: str, sep: str = "-") -> ReplyIds:
        return cls(f"{prefix}{sep}{uuid.uuid4().hex[:24]}", int(time.time()))


@dataclass(frozen=True)
class Recipe:
    """What makes a session's bytes again: the route (a key of the app's regenerators), the request
    body as received, the reply's ids, whether decoding is deterministic (greedy, or seeded sampling:
    batch-invariant kernels make the same request give the same tokens), and the model."""

    route: str
    body: Any
    ids: ReplyIds
    deterministic: bool
    model: str


@dataclass(frozen=True)
class JournalHeader:
    conversation_id: str
    owner: str
    client: str
    recipe: Recipe

    def encode(self) -> bytes:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> JournalHeader:
        raw = json.loads(payload)
        recipe = dict(raw["recipe"])
        recipe["ids"] = ReplyIds(**recipe["ids"])
        return cls(raw["conversation_id"], raw["owner"], raw["client"], Recipe(**recipe))


@dataclass
class JournalContents:
    """What a journal file holds, read up to its last whole record."""

    path: Path
    header: JournalHeader
    chunks: list[bytes]
    cut: bool  # chunks past the cap were not recorded
    finished_at: float | None  # wall-clock seconds, when the end record is there
    whole_size: int  # the bytes of whole records (the file is cut to this before appending)

    @property
    def complete(self) -> bool:
        """Every byte of a finished stream is here: replayable as it is."""
        return self.finished_at is not None and not self.cut


def encode_record(kind: bytes, payload: bytes) -> bytes:
    return _RECORD.pack(kind, len(payload), zlib.crc32(payload)) + payload


def decode_records(data: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
    """The whole records after the magic line, and where the last one ends; a short or corrupt record
    (a write cut by a kill or a power loss) and what follows it are left out."""
    if not data.startswith(MAGIC):
        return [], 0
    records, pos = [], len(MAGIC)
    while pos + _RECORD.size <= len(data):
        kind, length, crc = _RECORD.unpack_from(data, pos)
        start, end = pos + _RECORD.size, pos + _RECORD.size + length
        if end > len(data) or zlib.crc32(data[start:end]) != crc or kind not in (HEADER, DATA, CUT, END):
            break
        records.append((kind, data[start:end]))
        pos = end
    return records, pos


def read_journal(path: Path) -> JournalContents | None:
    """A journal's contents; None when not even its header is whole (nothing worth restoring)."""
    records, size = decode_records(path.read_bytes())
    if not records or records[0][0] != HEADER:
        return None
    try:
        header = JournalHeader.decode(records[0][1])
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("stream.journal_unreadable", path=str(path), error=str(exc))
        return None
    contents = JournalContents(path, header, [], False, None, size)
    for kind, payload in records[1:]:
        if kind == DATA:
            contents.chunks.append(payload)
        elif kind == CUT:
            contents.cut = True
        elif kind == END:
            contents.finished_at = float(json.loads(payload)["finished_at"])
    return contents


def journal_name(owner: str, conversation_id: str) -> str:
    """A session's journal file name: conversation ids are opaque (any characters, any length)."""
    return hashlib.sha256(f"{owner}\0{conversation_id}".encode()).hexdigest()[:40] + SUFFIX


def journal_folder(root: Path, model: str) -> Path:
    """The model's own folder under --stream-journal DIR."""
    digest = hashlib.sha256(model.encode()).hexdigest()[:12]
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in Path(model).name)[:64]
    return root / f"{name}-{digest}"


@dataclass
class _Open:
    file: BinaryIO
    dirty_since: float | None = None


class JournalWriter:
    """The one thread that touches journal files: every operation in the order it was asked for."""

    def __init__(self) -> None:
        self._ops: queue.SimpleQueue[tuple[str, Path, bytes] | None] = queue.SimpleQueue()
        self._files: dict[Path, _Open] = {}
        self._thread = threading.Thread(target=self._run, name="stream-journal", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, op: str, path: Path, data: bytes = b"") -> None:
        self._ops.put((op, path, data))

    def close(self) -> None:
        """Finish every pending operation, fsync and close (server shutdown)."""
        if self._thread.is_alive():
            self._ops.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            try:
                op = self._ops.get(timeout=self._next_sync_in())
            except queue.Empty:
                op = ()  # type: ignore[assignment]
            if op is None:
                break
            if op:
                self._apply(*op)
            self._sync_due()
        for path in list(self._files):
            self._close(path)

    def _next_sync_in(self) -> float | None:
        dirty = [f.dirty_since for f in self._files.values() if f.dirty_since is not None]
        return None if not dirty else max(0.0, min(dirty) + FSYNC_INTERVAL_S - time.monotonic())

    def _sync_due(self) -> None:
        now = time.monotonic()
        for path, f in list(self._files.items()):
            if f.dirty_since is not None and now - f.dirty_since >= FSYNC_INTERVAL_S:
                self._guard(path, lambda f=f: _fsync(f))

    def _apply(self, op: str, path: Path, data: bytes) -> None:
        actions = {
            "create": lambda: self._create(path, data),
            "reopen": lambda: self._reopen(path, int(data)),
            "append": lambda: self._write(path, data),
            "end": lambda: (self._write(path, data), self._close(path)),
            "close": lambda: self._close(path),
            "remove": lambda: (self._close(path), path.unlink(missing_ok=True)),
        }
        self._guard(path, actions[op])

    def _guard(self, path: Path, action: Any) -> None:
        try:
            action()
        except OSError as exc:  # a journal that fails is dropped; its session goes on in memory
            log.error("stream.journal_write_failed", path=str(path), error=str(exc))
            dropped = self._files.pop(path, None)
            if dropped is not None:
                with contextlib.suppress(OSError):
                    dropped.file.close()

    def _create(self, path: Path, header: bytes) -> None:
        self._close(path)
        f = _Open(path.open("wb", buffering=0))
        self._files[path] = f
        f.file.write(MAGIC + header)
        _fsync(f)
        _fsync_dir(path.parent)

    def _reopen(self, path: Path, whole_size: int) -> None:
        f = _Open(path.open("r+b", buffering=0))
        f.file.truncate(whole_size)
        f.file.seek(whole_size)
        self._files[path] = f

    def _write(self, path: Path, data: bytes) -> None:
        f = self._files.get(path)
        if f is None:  # dropped after a failure, or closed by a shutdown's detach
            return
        f.file.write(data)
        if f.dirty_since is None:
            f.dirty_since = time.monotonic()

    def _close(self, path: Path) -> None:
        f = self._files.pop(path, None)
        if f is not None:
            try:
                if f.dirty_since is not None:
                    _fsync(f)
            finally:
                f.file.close()


def _fsync(f: _Open) -> None:
    os.fsync(f.file.fileno())
    f.dirty_since = None


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(eq=False)
class Journal:
    """One session's journal, as its session sees it (on the event loop): appends go to the writer
    thread's queue, up to `cap` bytes of chunks."""

    writer: JournalWriter
    path: Path
    cap: int
    size: int = 0
    cut: bool = False
    open: bool = True  # False once ended, removed or detached: nothing more is written

    def append(self, chunk: bytes) -> None:
        if not self.open or self.cut or not chunk:
            return
        if self.size + len(chunk) > self.cap:
            self.cut = True
            self.writer.put("append", self.path, encode_record(CUT, b""))
            return
        self.size += len(chunk)
        self.writer.put("append", self.path, encode_record(DATA, chunk))

    def end(self, total_bytes: int) -> None:
        if self.open:
            self.open = False
            payload = json.dumps({"finished_at": time.time(), "total_bytes": total_bytes}).encode()
            self.writer.put("end", self.path, encode_record(END, payload))

    def detach(self) -> None:
        """Stop recording and close the file, leaving the journal as it is (a shutdown: the next start
        resumes it)."""
        if self.open:
            self.open = False
            self.writer.put("close", self.path)

    def remove(self) -> None:
        self.open = False
        self.writer.put("remove", self.path)


class JournalDir:
    """The journals of one model's server: the folder (locked), the writer thread, reading at start."""

    def __init__(self, root: Path, model: str, cap: int) -> None:
        self.folder = journal_folder(root, model)
        self.cap = cap
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock = (self.folder / "lock").open("a")
        except OSError as exc:
            raise JournalError(f"--stream-journal: cannot use {self.folder}: {exc}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise JournalError(f"--stream-journal: {self.folder} is in use by another server") from None
        self.writer = JournalWriter()

    def path_for(self, owner: str, conversation_id: str) -> Path:
        return self.folder / journal_name(owner, conversation_id)

    def create(self, header: JournalHeader) -> Journal:
        path = self.path_for(header.owner, header.conversation_id)
        self.writer.put("create", path, encode_record(HEADER, header.encode()))
        return Journal(self.writer, path, self.cap)

    def reopen(self, contents: JournalContents) -> Journal:
        """A restored live session's journal, appended to after its last whole record."""
        self.writer.put("reopen", contents.path, str(contents.whole_size).encode())
        size = sum(len(c) for c in contents.chunks)
        return Journal(self.writer, contents.path, self.cap, size, contents.cut)

    def ended(self, contents: JournalContents) -> Journal:
        """A restored finished session's journal: only removed, when the session goes."""
        return Journal(self.writer, contents.path, self.cap, open=False)

    def read_all(self) -> list[JournalContents]:
        """Every readable journal, newest first; unreadable ones are removed."""
        found = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            try:
                contents = read_journal(path)
            except OSError as exc:
                log.warning("stream.journal_unreadable", path=str(path), error=str(exc))
                continue
            if contents is None:
                path.unlink(missing_ok=True)
                continue
            found.append((path.stat().st_mtime, contents))
        return [c for _, c in sorted(found, key=lambda item: item[0], reverse=True)]

    def start(self) -> None:
        """Start the writer thread (the app's lifespan)."""
        self.writer.start()

    def close(self) -> None:
        self.writer.close()
        self._lock.close()
