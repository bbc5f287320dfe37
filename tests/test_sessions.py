"""Stream sessions without a server: the ring buffer, readers, producers, and the store's bounds."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from server.http.errors import APIError
from server.streams.sessions import ByteRing, OffsetDropped, Session, SessionLimits, SessionStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeClock:
    """A clock the test moves by hand: a stand-in on purpose, so TTLs expire at exact instants instead of
    after real sleeps (test_sessions_server checks a real TTL on a real server)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Source:
    """An SSE byte source that sends what the test pushes, and records whether its cleanup ran: a stand-in
    for a generation on purpose, so each test decides exactly when bytes arrive and when the producer
    ends. Real generations through the same store: tests/test_sessions_server.py."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = False

    def push(self, *chunks: bytes | None) -> None:
        for chunk in chunks:
            self.queue.put_nowait(chunk)

    async def stream(self) -> AsyncIterator[bytes]:
        try:
            while (chunk := await self.queue.get()) is not None:
                yield chunk
        finally:
            self.closed = True


async def drain(reader: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in reader])


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# -- ByteRing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("limit", [1, 7, 64, 1000])
def test_ring_matches_the_tail_of_everything_appended(limit: int) -> None:
    rng = random.Random(limit)
    ring, everything = ByteRing(limit), b""
    for _ in range(300):
        chunk = rng.randbytes(rng.choice([0, 1, 3, limit - 1, limit, limit + 5, rng.randint(0, 2 * limit)]))
        ring.append(chunk)
        everything += chunk
        assert ring.end == len(everything)
        assert ring.start == max(0, len(everything) - limit)
        assert ring.retained <= limit
        for offset in {ring.start, (ring.start + ring.end) // 2, ring.end, ring.end + 3}:
            assert ring.read(offset) == everything[offset:]
        if ring.start > 0:
            with pytest.raises(OffsetDropped):
                ring.read(ring.start - 1)


def test_ring_grows_only_as_needed() -> None:
    ring = ByteRing(4 * 1024 * 1024)
    ring.append(b"x" * 100)
    assert ring.retained == 100


# -- Session ----------------------------------------------------------------------------------------
async def test_readers_get_every_byte_once_in_order_and_the_producer_outlives_them() -> None:
    src = Source()
    session = Session("c", ByteRing(1 << 16))
    session.start(src.stream())
    early = session.follow(0)
    src.push(b"a1", b"b22")
    assert await anext(early) == b"a1b22"
    late = asyncio.create_task(drain(session.follow(0)))
    quitter = session.follow(0)
    assert await anext(quitter) == b"a1b22"
    await quitter.aclose()  # a client going away must not stop the producer
    src.push(b"c333", b"d", None)
    rest = await drain(early)
    assert b"a1b22" + rest == b"a1b22c333d" == await late
    await settle()
    assert session.is_done and src.closed and session.info().total_bytes == 10


async def test_cancel_runs_the_source_cleanup_and_ends_readers() -> None:
    src = Source()
    session = Session("c", ByteRing(1024))
    session.start(src.stream())
    src.push(b"data: 1\n\n")
    reader = asyncio.create_task(drain(session.follow(0)))
    await settle()
    await session.cancel()
    assert src.closed and session.is_done
    assert await asyncio.wait_for(reader, 1) == b"data: 1\n\n"


async def test_cancel_before_the_producer_ran_still_finishes() -> None:
    session = Session("c", ByteRing(1024))
    session.start(Source().stream())
    reader = asyncio.create_task(drain(session.follow(0)))
    await session.cancel()
    assert session.is_done and await asyncio.wait_for(reader, 1) == b""


async def test_a_failing_source_ends_with_an_error_event() -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        raise RuntimeError("boom")

    session = Session("c", ByteRing(1024))
    session.start(broken())
    out = await asyncio.wait_for(drain(session.follow(0)), 1)
    assert out.startswith(b'data: 1\n\ndata: {"error":') and b"boom" in out and session.is_done


async def test_a_reader_overtaken_by_the_ring_ends_without_a_gap() -> None:
    src = Source()
    session = Session("c", ByteRing(8))
    session.start(src.stream())
    reader = session.follow(0)
    src.push(b"abcd")
    assert await anext(reader) == b"abcd"
    src.push(b"efghijklmn", None)  # offset 4 is overwritten before the reader comes back
    await settle()
    assert await drain(reader) == b""
    with pytest.raises(OffsetDropped):
        session.check_offset(4)


# -- SessionStore -----------------------------------------------------------------------------------
async def test_same_id_replaces_and_cancels_the_old_session() -> None:
    store = SessionStore(SessionLimits(1024, 300, 4))
    first, second = Source(), Source()
    old = await store.open("a/b: c", first.stream())
    first.push(b"old")
    await settle()
    new = await store.open("a/b: c", second.stream())
    assert first.closed and old.is_done and store.get("a/b: c") is new and len(store) == 1
    await store.close()
    assert second.closed


async def test_ttl_expires_finished_sessions_only() -> None:
    clock = FakeClock()
    store = SessionStore(SessionLimits(1024, 5.0, 4), clock)
    done_src, live_src = Source(), Source()
    await store.open("done", done_src.stream())
    await store.open("live", live_src.stream())
    done_src.push(b"x", None)
    await settle()
    clock.now += 4.9
    assert [i.conversation_id for i in store.lookup(["done", "live"])] == ["done", "live"]
    clock.now += 0.2
    assert store.get("done") is None
    clock.now += 1000
    store.sweep()
    assert [i.conversation_id for i in store.lookup(["done", "live", "nope"])] == ["live"]
    await store.close()


async def test_cap_evicts_the_oldest_finished_and_refuses_when_all_are_live() -> None:
    clock = FakeClock()
    store = SessionStore(SessionLimits(1024, 300, 2), clock)
    sources = {name: Source() for name in ("a", "b", "c", "d")}
    await store.open("a", sources["a"].stream())
    await store.open("b", sources["b"].stream())
    sources["a"].push(None)
    await settle()
    await store.open("c", sources["c"].stream())  # evicts "a", the only finished one
    assert store.get("a") is None and store.get("b") and store.get("c")
    with pytest.raises(APIError) as refused:
        await store.open("d", sources["d"].stream())
    assert refused.value.status == 503
    await store.close()
    assert sources["b"].closed and sources["c"].closed


async def test_memory_stays_bounded_over_100_sessions() -> None:
    limits = SessionLimits(buffer_size=512, ttl=300, max_sessions=10)
    store = SessionStore(limits)
    for i in range(100):
        src = Source()
        await store.open(f"conv {i}", src.stream())
        src.push(*[b"data: " + bytes(40) + b"\n\n"] * 50, None)  # 2.4 KB each, far over the buffer
        await settle()
        assert len(store) <= limits.max_sessions
        assert store.retained_bytes <= limits.max_sessions * limits.buffer_size
    infos = store.lookup([f"conv {i}" for i in range(100)])
    assert [i.conversation_id for i in infos] == [f"conv {i}" for i in range(90, 100)]
    assert all(i.is_done and i.total_bytes == 2400 for i in infos)
    await store.close()


async def test_gc_task_sweeps_and_stops_promptly() -> None:
    clock = FakeClock()
    store = SessionStore(SessionLimits(1024, 0.1, 4), clock)
    src = Source()
    await store.open("x", src.stream())
    src.push(None)
    store.start_gc()
    await settle()
    clock.now += 1
    await asyncio.sleep(0.3)
    assert len(store) == 0
    await asyncio.wait_for(store.close(), 1)


async def test_each_owner_has_its_own_conversation_ids() -> None:
    store = SessionStore(SessionLimits(1024, 300, 8))
    alice, bob = Source(), Source()
    mine = await store.open("chat", alice.stream(), owner="alice", client="alice")
    theirs = await store.open("chat", bob.stream(), owner="bob", client="bob")  # replaces nothing
    await settle()
    assert not mine.is_done and store.get("chat", "alice") is mine and store.get("chat", "bob") is theirs
    assert store.get("chat") is None and store.lookup(["chat"], "eve") == []
    await store.delete("chat", "eve")  # someone else's id: nothing happens
    assert not alice.closed and not bob.closed
    await store.delete("chat", "bob")
    assert bob.closed and not alice.closed
    await store.close()


async def test_the_per_client_cap_evicts_the_clients_own_then_refuses_with_429() -> None:
    store = SessionStore(SessionLimits(1024, 300, max_sessions=8, max_per_client=2), FakeClock())
    sources = [Source() for _ in range(5)]
    await store.open("a", sources[0].stream(), client="greedy")
    await store.open("b", sources[1].stream(), client="greedy")
    await store.open("x", sources[2].stream(), client="other")
    sources[0].push(None)
    await settle()
    await store.open("c", sources[3].stream(), client="greedy")  # evicts the client's finished "a"
    assert store.get("a") is None and store.get("b") and store.get("c")
    with pytest.raises(APIError) as refused:
        await store.open("d", sources[4].stream(), client="greedy")
    assert refused.value.status == 429 and store.get("x") is not None  # the other client is untouched
    await store.close()
