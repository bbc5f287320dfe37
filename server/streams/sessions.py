"""Resumable stream sessions: a generation's SSE bytes kept by conversation id, replayable from any offset.

A session owns a producer task that drives the SSE byte source (the chat stream, and through it the engine
request) into a ring buffer. HTTP responses are only readers of that buffer, so a client that goes away
does not stop the generation; cancelling the producer (DELETE, replacement, shutdown) does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import structlog

from server.http import errors, sse
from server.streams.journal import Journal, JournalDir, JournalHeader, Recipe

log = structlog.get_logger("server")

CONVERSATION_HEADER = "X-Conversation-Id"
# Finished sessions are also expired on access, so the sweep only bounds how long their memory lingers.
GC_INTERVAL_MAX = 60.0
CANCEL_WAIT = 2.0


class OffsetDropped(Exception):
    """The asked offset lies in the part of the ring buffer already overwritten."""

    def __init__(self, offset: int, start: int) -> None:
        super().__init__(f"offset {offset} is below the oldest byte still buffered ({start})")
        self.offset = offset
        self.start = start


class ByteRing:
    """The last `limit` bytes of an append-only byte stream, addressed by absolute offsets.

    The storage grows on demand up to `limit` and then wraps, so an append costs its own length (no
    front deletions that move the whole buffer) and a short stream never holds a full `limit` of memory.
    Logical offset o lives at physical index o % limit.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the ring buffer limit must be >= 1 byte")
        self.limit = limit
        self._buf = bytearray()
        self.end = 0  # total bytes ever appended

    @property
    def start(self) -> int:
        """The oldest offset still readable."""
        return max(0, self.end - self.limit)

    @property
    def retained(self) -> int:
        return len(self._buf)

    def append(self, data: bytes) -> None:
        if not data:
            return
        if len(data) >= self.limit:
            self._replace_with_tail(data)
            return
        pos = self.end % self.limit
        if len(self._buf) < self.limit:  # still growing: pos == len(self._buf)
            room = self.limit - len(self._buf)
            self._buf += data[:room]
            rest = data[room:]
            self._buf[: len(rest)] = rest
        else:
            first = min(len(data), self.limit - pos)
            self._buf[pos : pos + first] = data[:first]
            self._buf[: len(data) - first] = data[first:]
        self.end += len(data)

    def _replace_with_tail(self, data: bytes) -> None:
        self.end += len(data)
        tail = data[-self.limit :]
        split = self.start % self.limit
        self._buf = bytearray(self.limit)
        self._buf[split:] = tail[: self.limit - split]
        self._buf[:split] = tail[self.limit - split :]

    def read(self, offset: int) -> bytes:
        """The bytes from `offset` to the end (empty when `offset` is at or past the end)."""
        if offset < self.start:
            raise OffsetDropped(offset, self.start)
        if offset >= self.end:
            return b""
        length = self.end - offset
        pos = offset % self.limit
        if pos + length <= len(self._buf):
            return bytes(self._buf[pos : pos + length])
        return bytes(self._buf[pos:]) + bytes(self._buf[: length - (len(self._buf) - pos)])


@dataclass(frozen=True)
class SessionLimits:
    buffer_size: int = 4 * 1024 * 1024
    ttl: float = 300.0
    max_sessions: int = 256
    max_per_client: int = 64

    @property
    def gc_interval(self) -> float:
        return max(0.1, min(GC_INTERVAL_MAX, self.ttl / 2))


@dataclass(frozen=True)
class SessionInfo:
    """What /v1/streams/lookup reports about one session."""

    conversation_id: str
    is_done: bool
    total_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(eq=False)
class Session:
    conversation_id: str
    buffer: ByteRing
    clock: Callable[[], float] = time.monotonic
    client: str = ""  # who it counts against for SessionLimits.max_per_client
    finished_at: float | None = None
    journal: Journal | None = None  # with --stream-journal: its bytes also go to disk
    _producer: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    # Replaced on every change; readers wait on the one they saw, so no wake-up is ever missed.
    _changed: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    @property
    def is_done(self) -> bool:
        return self.finished_at is not None

    def info(self) -> SessionInfo:
        return SessionInfo(self.conversation_id, self.is_done, self.buffer.end)

    def start(self, source: AsyncIterator[bytes]) -> None:
        self._producer = asyncio.get_running_loop().create_task(
            self._pump(source), name=f"stream-session:{self.conversation_id}"
        )

    async def _pump(self, source: AsyncIterator[bytes]) -> None:
        try:
            async for chunk in source:
                self._append(chunk)
        except asyncio.CancelledError:
            # Stopped, replaced or shut down: its journal gets no end (a shutdown's resumes next start).
            log.info("stream.session_cancelled", conversation_id=self.conversation_id)
            raise
        except Exception as exc:
            log.exception("stream.session_failed", conversation_id=self.conversation_id, error=str(exc))
            self._append(sse.error_event(errors.APIError(500, str(exc), "server_error").body()))
            self._end_journal()
        else:
            self._end_journal()
        finally:
            await sse.close_quietly(source)
            self._finish()

    def _append(self, chunk: bytes) -> None:
        self.buffer.append(chunk)
        if self.journal is not None:
            self.journal.append(chunk)
        self._notify()

    def _end_journal(self) -> None:
        if self.journal is not None:
            self.journal.end(self.buffer.end)

    def _finish(self) -> None:
        if self.finished_at is None:
            self.finished_at = self.clock()
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def cancel(self) -> None:
        """Stop the generation and wait (briefly) until its request is cancelled in the engine."""
        task = self._producer
        if task is None or task.done():
            self._finish()
            return
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_WAIT)
        # A task cancelled before its first step never runs _pump's cleanup: readers must still end.
        self._finish()

    def check_offset(self, offset: int) -> None:
        if offset < self.buffer.start:
            raise OffsetDropped(offset, self.buffer.start)

    async def follow(self, offset: int = 0) -> AsyncIterator[bytes]:
        """Bytes from `offset` on (an offset past the end waits for it), as they arrive, until the session
        is done. A reader that falls behind the ring (its bytes were overwritten before it read them) is
        ended, never handed a gap: its client resumes by offset, or learns with a 400 that it cannot."""
        pos = offset
        while True:
            changed = self._changed
            try:
                chunk = self.buffer.read(pos)
            except OffsetDropped as exc:
                log.warning("stream.reader_overrun", conversation_id=self.conversation_id, offset=exc.offset)
                return
            if chunk:
                pos += len(chunk)
                yield chunk
                continue
            if self.is_done:
                return
            await changed.wait()

    def expired(self, ttl: float) -> bool:
        return self.finished_at is not None and self.clock() - self.finished_at >= ttl


class SessionStore:
    """All sessions by owner and conversation id: bounded in count (in all and per client), per-session
    bytes, and lifetime once done.

    The owner is whoever may read a session (the digest of the API key that created it, "" without
    keys): each owner has its own conversation ids, so no one reads, stops or replaces another's stream,
    or learns that it exists. The client (the owner, or the remote address without keys) is what the
    per-client cap counts.
    """

    def __init__(
        self,
        limits: SessionLimits,
        clock: Callable[[], float] = time.monotonic,
        journals: JournalDir | None = None,
    ) -> None:
        self.limits = limits
        self._clock = clock
        self.journals = journals  # --stream-journal: sessions opened with a recipe are journaled
        self._sessions: dict[tuple[str, str], Session] = {}
        self._gc: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def retained_bytes(self) -> int:
        return sum(s.buffer.retained for s in self._sessions.values())

    # -- lifecycle ----------------------------------------------------------------------------------
    def start_gc(self) -> None:
        self._gc = asyncio.get_running_loop().create_task(self._gc_loop(), name="stream-session-gc")

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.limits.gc_interval)
            self.sweep()

    async def close(self) -> None:
        """Stop the sweeper and every producer (server shutdown); live sessions' journals stay as they
        are, for the next start to resume."""
        if self._gc is not None:
            self._gc.cancel()
            await asyncio.wait({self._gc}, timeout=CANCEL_WAIT)
            self._gc = None
        self.detach_journals()
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.cancel() for s in sessions))

    def detach_journals(self) -> None:
        """Record nothing more (shutdown, before the engine stops and cancels what runs: the journals
        must not take those cancelled endings for the streams' own)."""
        for session in self._sessions.values():
            if session.journal is not None:
                session.journal.detach()

    # -- sessions -----------------------------------------------------------------------------------
    async def open(
        self,
        conversation_id: str,
        source: AsyncIterator[bytes],
        owner: str = "",
        client: str = "",
        recipe: Recipe | None = None,
    ) -> Session:
        """A new session driving `source`; the owner's session already under this id is cancelled and
        replaced. With a journal folder and a `recipe`, the session is journaled."""
        # A loop, not an if: a concurrent open of the same id may have slipped in while we awaited.
        while (old := self._sessions.pop((owner, conversation_id), None)) is not None:
            await old.cancel()
            _drop_journal(old)
        self._make_room(conversation_id, client)
        session = Session(conversation_id, ByteRing(self.limits.buffer_size), self._clock, client)
        if recipe is not None and self.journals is not None:
            session.journal = self.journals.create(JournalHeader(conversation_id, owner, client, recipe))
        self._sessions[owner, conversation_id] = session
        session.start(source)
        return session

    def adopt(self, owner: str, session: Session) -> None:
        """A session restored from its journal at start-up (server/streams/resume.py)."""
        self._sessions[owner, session.conversation_id] = session

    def _make_room(self, conversation_id: str, client: str) -> None:
        """Evict the oldest finished sessions until the new one fits under both caps: 429 when the
        client's own are all live, 503 when everyone's are."""
        self.sweep()
        per_client = self.limits.max_per_client
        while len(mine := [k for k, s in self._sessions.items() if s.client == client]) >= per_client:
            if not self._evict_oldest_finished(mine):
                log.warning("stream.client_session_cap", conversation_id=conversation_id, cap=per_client)
                message = f"too many live stream sessions for this client (the cap is {per_client})"
                raise errors.APIError(429, message, "rate_limit_error")
        while len(self._sessions) >= self.limits.max_sessions:
            if not self._evict_oldest_finished(list(self._sessions)):
                cap = self.limits.max_sessions
                log.warning("stream.session_cap", conversation_id=conversation_id, cap=cap)
                raise errors.unavailable(f"too many live stream sessions (the cap is {cap})")

    def _evict_oldest_finished(self, keys: list[tuple[str, str]]) -> bool:
        finished = [k for k in keys if self._sessions[k].is_done]
        if not finished:
            return False
        self._remove(min(finished, key=lambda k: self._sessions[k].finished_at or 0.0))
        return True

    def _remove(self, key: tuple[str, str]) -> Session | None:
        session = self._sessions.pop(key, None)
        if session is not None:
            _drop_journal(session)
        return session

    def get(self, conversation_id: str, owner: str = "") -> Session | None:
        session = self._sessions.get((owner, conversation_id))
        if session is not None and session.expired(self.limits.ttl):
            self._remove((owner, conversation_id))
            return None
        return session

    async def delete(self, conversation_id: str, owner: str = "") -> None:
        session = self._remove((owner, conversation_id))
        if session is not None:
            await session.cancel()

    def lookup(self, conversation_ids: list[str], owner: str = "") -> list[SessionInfo]:
        found = (self.get(cid, owner) for cid in dict.fromkeys(conversation_ids))
        return [s.info() for s in found if s is not None]

    def sweep(self) -> None:
        for key in [key for key, s in self._sessions.items() if s.expired(self.limits.ttl)]:
            self._remove(key)


def _drop_journal(session: Session) -> None:
    if session.journal is not None:
        session.journal.remove()
