"""Stream journals: the file format (a kill mid-write leaves a journal readable up to its last whole
record), the writer thread, and the check that a regenerated stream repeats the journaled bytes."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from server.http.errors import APIError
from server.streams.journal import (
    DATA,
    END,
    HEADER,
    MAGIC,
    JournalContents,
    JournalDir,
    JournalError,
    JournalHeader,
    Recipe,
    ReplyIds,
    decode_records,
    encode_record,
    journal_folder,
    journal_name,
    read_journal,
)
from server.streams.resume import (
    DIVERGED,
    Diverged,
    Regenerator,
    RestoreContext,
    continuation,
    restore_sessions,
    resumed,
    same_event,
)
from server.streams.sessions import SessionLimits, SessionStore

HEADER_VALUE = JournalHeader(
    "conv/1: x",
    "owner-digest",
    "addr:127.0.0.1",
    Recipe("chat", {"messages": [{"role": "user", "content": "hi"}]}, ReplyIds("chatcmpl-1", 7), True, "m"),
)


def journal_bytes(*chunks: bytes, end: bool = False, header: JournalHeader = HEADER_VALUE) -> bytes:
    data = MAGIC + encode_record(HEADER, header.encode())
    data += b"".join(encode_record(DATA, c) for c in chunks)
    return data + (encode_record(END, json.dumps({"finished_at": 5.0}).encode()) if end else b"")


def test_records_round_trip_and_a_cut_last_record_is_left_out(tmp_path: Path) -> None:
    whole = journal_bytes(b"data: a\n\n", b"data: bb\n\n")
    records, size = decode_records(whole)
    assert [k for k, _ in records] == [HEADER, DATA, DATA] and size == len(whole)
    for cut in range(1, len(encode_record(DATA, b"data: bb\n\n"))):
        records, size = decode_records(whole[:-cut])
        assert [p for _, p in records[1:]] == [b"data: a\n\n"]
        assert size == len(journal_bytes(b"data: a\n\n"))
    path = tmp_path / "j.journal"
    path.write_bytes(whole[:-3])
    contents = read_journal(path)
    assert contents is not None
    assert contents.header == HEADER_VALUE
    assert contents.chunks == [b"data: a\n\n"] and contents.finished_at is None and not contents.complete


def test_a_corrupt_record_ends_the_journal_there() -> None:
    whole = journal_bytes(b"data: a\n\n", b"data: bb\n\n", end=True)
    flipped = bytearray(whole)
    flipped[len(journal_bytes(b"data: a\n\n")) + 12] ^= 0xFF  # a payload byte of the second chunk
    records, _ = decode_records(bytes(flipped))
    assert [p for k, p in records if k == DATA] == [b"data: a\n\n"]
    assert decode_records(b"not a journal")[0] == []


def test_a_journal_without_a_whole_header_reads_as_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j.journal"
    path.write_bytes(journal_bytes()[:-1])
    assert read_journal(path) is None


def test_the_writer_records_ends_caps_reopens_and_removes(tmp_path: Path) -> None:
    journals = JournalDir(tmp_path, "/models/a.gguf", cap=20)
    journals.start()
    journal = journals.create(HEADER_VALUE)
    for chunk in (b"data: 123456\n\n", b"x", b"data: too long now\n\n", b"y"):
        journal.append(chunk)
    journal.end(15)
    other = journals.create(JournalHeader("conv 2", "", "c", HEADER_VALUE.recipe))
    other.append(b"data: live\n\n")
    journals.writer.close()  # every operation done
    found = {c.header.conversation_id: c for c in journals.read_all()}
    first, second = found["conv/1: x"], found["conv 2"]
    assert first.chunks == [b"data: 123456\n\n", b"x"] and first.cut and first.finished_at is not None
    assert not first.complete, "a journal past its cap cannot be replayed as it is"
    assert second.chunks == [b"data: live\n\n"] and second.finished_at is None

    # A kill mid-write: a torn record at the end is cut off before the journal is appended to again.
    with second.path.open("ab") as f:
        f.write(encode_record(DATA, b"data: torn\n\n")[:-4])
    journals.writer = type(journals.writer)()
    journals.start()
    torn = read_journal(second.path)
    assert torn is not None and torn.chunks == [b"data: live\n\n"]
    reopened = journals.reopen(torn)
    reopened.append(b"m")  # (12 + 1 bytes: within the cap)
    first_journal = journals.ended(first)
    first_journal.remove()
    journals.close()
    [only] = journals.read_all()
    assert only.chunks == [b"data: live\n\n", b"m"]
    assert not first.path.exists()


def test_one_server_per_journal_folder(tmp_path: Path) -> None:
    journals = JournalDir(tmp_path, "/models/a.gguf", cap=100)
    with pytest.raises(JournalError, match="in use by another server"):
        JournalDir(tmp_path, "/models/a.gguf", cap=100)
    other_model = JournalDir(tmp_path, "/models/b.gguf", cap=100)  # a router's other child
    assert other_model.folder != journals.folder
    journals.close()
    other_model.close()
    JournalDir(tmp_path, "/models/a.gguf", cap=100).close()  # free again


def chunk(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def regenerate(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def rest_of(journaled: list[bytes], fresh: list[bytes]) -> list[bytes]:
    async def run() -> list[bytes]:
        return [c async for c in continuation(journaled, regenerate(fresh))]

    return asyncio.run(run())


ROLE = chunk({"id": "x", "choices": [{"delta": {"role": "assistant"}}]})
A, B, C = (chunk({"id": "x", "choices": [{"delta": {"content": t}}]}) for t in "abc")
# A chat prompt-progress chunk: llama-server's role delta with prompt_progress (journals written before
# it had no choices: those are progress events too).
PROGRESS = chunk({"id": "x", "choices": [{"delta": {"role": "assistant"}}], "prompt_progress": {"total": 9}})
OLD_PROGRESS = chunk({"id": "x", "choices": [], "prompt_progress": {"total": 9, "processed": 3}})


def test_the_regenerated_stream_goes_on_after_the_journaled_chunks() -> None:
    assert rest_of([ROLE, A], [ROLE, A, B, C]) == [B, C]
    assert rest_of([], [ROLE, A]) == [ROLE, A]
    assert rest_of([ROLE, A, B, C], [ROLE, A, B, C]) == []


def test_progress_events_are_aligned_loosely() -> None:
    assert rest_of([PROGRESS, PROGRESS, ROLE], [PROGRESS, ROLE, A]) == [A]
    assert rest_of([PROGRESS, ROLE, A], [PROGRESS, PROGRESS, PROGRESS, ROLE, A, B]) == [B]
    assert rest_of([PROGRESS], [PROGRESS, PROGRESS, ROLE]) == [PROGRESS, ROLE]
    assert rest_of([OLD_PROGRESS, ROLE], [PROGRESS, PROGRESS, ROLE, A]) == [A]


def test_only_measurements_may_differ() -> None:
    timed = {"id": "x", "choices": [{"delta": {}, "finish_reason": "length"}]}
    fast, slow = ({"timings": {"prompt_ms": ms}} for ms in (1.5, 9))
    assert same_event(chunk(timed | fast), chunk(timed | slow))
    usage = {"completion_tokens": 8, "prompt_tokens": 20}
    cold = chunk({"choices": [], "usage": usage | {"prompt_tokens_details": {"cached_tokens": 0}}})
    warm = chunk({"choices": [], "usage": usage | {"prompt_tokens_details": {"cached_tokens": 19}}})
    assert same_event(cold, warm)
    assert not same_event(cold, chunk({"choices": [], "usage": usage | {"completion_tokens": 9}}))

    # Anthropic's message_start holds the prompt cache's share in its message's usage
    def start(message_id: str, **counts: int) -> bytes:
        message = {"id": message_id, "usage": {"output_tokens": 0, **counts}}
        return b"event: message_start\n" + chunk({"type": "message_start", "message": message})

    warm_start = start("m", cache_read_input_tokens=19, input_tokens=1)
    assert same_event(warm_start, start("m", cache_read_input_tokens=0, input_tokens=20))
    assert not same_event(warm_start, start("other", cache_read_input_tokens=19, input_tokens=1))
    assert not same_event(A, B)
    ping = b"event: ping\ndata: {}\n\n"
    assert same_event(ping, ping) and not same_event(b"data: [DONE]\n\n", b"data: [DONE]\n")


def test_a_regenerated_stream_that_differs_raises() -> None:
    with pytest.raises(Diverged):
        rest_of([ROLE, A, B], [ROLE, A, C, C])
    with pytest.raises(Diverged, match="shorter"):
        rest_of([ROLE, A, B], [ROLE, A])


def test_a_resumed_session_ends_with_the_routes_error_event_when_it_diverges(tmp_path: Path) -> None:
    closed = []

    async def fresh(chunks: list[bytes]) -> AsyncIterator[bytes]:
        try:
            for c in chunks:
                yield c
        finally:
            closed.append(True)  # the engine request is cancelled with it

    async def stream(recipe: Recipe) -> AsyncIterator[bytes]:
        assert recipe == HEADER_VALUE.recipe
        return fresh([ROLE, A, C, C, C])

    regenerator = Regenerator(stream, lambda error: b"error: " + error.message.encode() + b"\n\n")
    contents = JournalContents(tmp_path / "j", HEADER_VALUE, [ROLE, A, B], False, None, 0)

    async def run() -> list[bytes]:
        ready = asyncio.get_running_loop().create_future()
        ready.set_result(None)
        return [c async for c in resumed(contents, regenerator, ready)]

    assert asyncio.run(run()) == [f"error: {DIVERGED}\n\n".encode()]
    assert closed == [True]


@pytest.mark.parametrize(
    "failure", [RuntimeError("a bug"), APIError(503, "the engine stopped", "unavailable")]
)
def test_a_restored_session_whose_regenerated_stream_fails_ends_with_the_routes_error(
    tmp_path: Path, failure: Exception
) -> None:
    """The regenerated producer fails after the journaled chunks: its readers get the route's error frame
    (here a recognisable one), as a live session's would, not the session's last-resort error."""
    before = JournalDir(tmp_path, "m", 1 << 20)  # the server before its restart
    before.start()
    before.create(HEADER_VALUE).append(ROLE)
    before.close()

    async def failing() -> AsyncIterator[bytes]:
        yield ROLE
        yield A
        raise failure

    async def stream(recipe: Recipe) -> AsyncIterator[bytes]:
        return failing()

    regenerator = Regenerator(stream, lambda error: b"route-error: " + error.message.encode() + b"\n\n")

    async def run() -> bytes:
        journals = JournalDir(tmp_path, "m", 1 << 20)
        journals.start()
        store = SessionStore(SessionLimits(), journals=journals)
        ready = asyncio.get_running_loop().create_future()
        ready.set_result(None)
        assert restore_sessions(RestoreContext(store, journals, {"chat": regenerator}, "m", ready)) == 1
        session = store.get(HEADER_VALUE.conversation_id, HEADER_VALUE.owner)
        assert session is not None
        out = b"".join([c async for c in session.follow(0)])
        journals.close()
        return out

    out = asyncio.run(run())
    assert out.startswith(ROLE + A + b"route-error: ") and str(failure) in out.decode()


def test_restored_sessions_meet_the_per_client_cap(tmp_path: Path) -> None:
    """Journals beyond a client's cap (lowered since they were written) are deleted at start-up, the
    newest kept, as the cap keeps a new session out; another client's are untouched."""
    ages = {"a-old": 30, "a-mid": 20, "a-new": 10, "b-one": 40}
    for name, age in ages.items():
        header = JournalHeader(name, "owner", f"addr:{name[0]}", HEADER_VALUE.recipe)
        path = journal_folder(tmp_path, "m") / journal_name("owner", name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(journal_bytes(ROLE, header=header))
        os.utime(path, (time.time() - age, time.time() - age))

    async def run() -> tuple[int, list[str]]:
        journals = JournalDir(tmp_path, "m", 1 << 20)
        journals.start()
        store = SessionStore(SessionLimits(max_per_client=2), journals=journals)
        ready = asyncio.get_running_loop().create_future()
        ready.set_result(None)
        restored = restore_sessions(RestoreContext(store, journals, {}, "m", ready))
        kept = sorted(name for name in ages if store.get(name, "owner") is not None)
        await store.close()
        journals.close()
        return restored, kept

    assert asyncio.run(run()) == (3, ["a-mid", "a-new", "b-one"])
    left = {p.name for p in journal_folder(tmp_path, "m").glob("*.journal")}
    assert left == {journal_name("owner", name) for name in ("a-mid", "a-new", "b-one")}
