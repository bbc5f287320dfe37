"""Durable resumable streams (--stream-journal): a real server SIGKILLed mid-generation, restarted on the
same folder, and its streams resumed byte for byte.

In `make test`: the SIGKILL and restart, the restored streams' checks and the start-up refusal of a bad
journal path. The two SmolLM2 starts are the cost, not the streams' ~700 tokens (a greedy-only variant
took as long), so every case rides along. Slow: the SIGTERM, TTL and tampered-journal test (a third
start, a TTL to wait out).

"Identical" here: the resumed stream's bytes from offset 0 equal an uninterrupted run of the same
request in every byte but the numbers inside `timings` (how long this run took), once the
uninterrupted run's own reply id and `created` are replaced by the journaled ones (the ids the
restarted server reused). The bytes the client read before the kill are compared as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from server.streams.journal import (
    DATA,
    HEADER,
    MAGIC,
    JournalContents,
    encode_record,
    journal_name,
    read_journal,
)
from server.streams.resume import DIVERGED, NOT_RESUMABLE
from tests.server_process import LIVENESS_S, REPO, ServerProcess, wait_until

CONV = "X-Conversation-Id"
KEY1, KEY2 = {"Authorization": "Bearer k1"}, {"Authorization": "Bearer k2"}
N_TOKENS = 96  # with ignore_eos: enough that the kill lands mid-generation
READ_BEFORE_KILL = 4  # content events each stream's client reads before the kill
TTL = 3  # seconds: the last restart's --stream-ttl
ERROR_EVENT = b'data: {"error":'  # a chat stream's closing error event (server/http/sse.py)


def server(journal: Path, *extra: str) -> ServerProcess:
    args = ("-m", "smollm2", "-c", "1024", "-np", "4", "--api-key", "k1,k2", "--stream-journal", str(journal))
    return ServerProcess(*args, *extra).wait_healthy()


def chat(content: str, **sampling: object) -> dict:
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": N_TOKENS,
        "ignore_eos": True,
        "cache_prompt": False,  # every run evaluates the whole prompt: the same cache counts in usage
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling,
    }


GREEDY = chat("Write a poem about the sea.", temperature=0)
SEEDED = chat("Tell me about the mountains.", temperature=1, seed=42)
RANDOM = chat("Describe a city at night.", temperature=1)  # no seed: cannot be regenerated
MESSAGES = {
    "model": "smollm2",
    "max_tokens": N_TOKENS,
    "messages": [{"role": "user", "content": "Write a story about a fox."}],
    "temperature": 0,
    "ignore_eos": True,
    "cache_prompt": False,
    "stream": True,
}
ROUTES = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}
CASES = {"greedy": ("chat", GREEDY), "seeded": ("chat", SEEDED), "messages": ("messages", MESSAGES)}


def content_events(body: bytes) -> int:
    return body.count(b'"delta":{"content":') + body.count(b'"type":"text_delta"')


def reply_ids(stream: bytes) -> list[bytes]:
    """The values of a reply's bytes that are not decoded: its id and creation time."""
    found = re.search(rb'"id":"((?:chatcmpl-|msg_)[0-9a-f]+)"', stream)
    assert found, stream[:300]
    created = re.search(rb'"created":(\d+)', stream)
    return [found.group(1), *([created.group(1)] if created else [])]


def normalized(stream: bytes, ids_from: bytes, ids_to: bytes) -> bytes:
    for old, new in zip(reply_ids(ids_from), reply_ids(ids_to), strict=True):
        stream = stream.replace(old, new)
    return re.sub(rb'"timings":\{[^{}]*\}', b'"timings":{}', stream)


def replay(client: httpx.Client, conv: str, offset: int = 0, headers: dict | None = None) -> httpx.Response:
    return client.get("/v1/stream", params={"conv_id": conv, "from": offset}, headers=headers)


def lookup(client: httpx.Client, *ids: str) -> list[dict]:
    return client.post("/v1/streams/lookup", json={"conversation_ids": list(ids)}).json()


def wait_done(client: httpx.Client, *ids: str) -> None:
    def done() -> bool:
        infos = lookup(client, *ids)
        return len(infos) == len(ids) and all(i["is_done"] for i in infos)

    wait_until(done, 300, f"{ids} done")


def journal_files(journal: Path) -> list[Path]:
    return list(journal.glob("*/*.journal"))


async def uninterrupted(base_url: str) -> dict[str, bytes]:
    """Each case's request run whole, without a conversation id (all at once: batch invariance)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=300, headers=KEY1) as client:

        async def run(route: str, body: dict) -> bytes:
            reply = await client.post(ROUTES[route], json=body)
            assert reply.status_code == 200, reply.text
            return reply.content

        got = await asyncio.gather(*(run(route, body) for route, body in CASES.values()))
    return dict(zip(CASES, got, strict=True))


class Streams:
    """Streams started with a conversation id, each read a few events into, left open."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.stack = contextlib.ExitStack()
        self.seen: dict[str, bytes] = {}

    def start(self, conv: str, route: str, body: dict) -> None:
        reply = self.stack.enter_context(
            self.client.stream("POST", ROUTES[route], json=body, headers={CONV: conv})
        )
        assert reply.status_code == 200
        seen = b""
        chunks = reply.iter_raw()
        while content_events(seen) < READ_BEFORE_KILL:
            seen += next(chunks)
        self.seen[conv] = seen

    def close(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            self.stack.close()


def tampered_copy(contents: JournalContents, conv: str) -> bytes:
    """A copy of an unfinished journal under another conversation id and reply id (the engine knows a
    request by it), one journaled token changed (as if the model or its flags had changed since): what
    was sent can no longer be generated again."""
    old_id = contents.header.recipe.ids.reply_id
    new_id = old_id[:-6] + "000000"
    recipe = replace(contents.header.recipe, ids=replace(contents.header.recipe.ids, reply_id=new_id))
    header = replace(contents.header, conversation_id=conv, recipe=recipe)
    chunks = [c.replace(old_id.encode(), new_id.encode()) for c in contents.chunks]
    first = next(i for i, c in enumerate(chunks) if b'"content":"' in c)
    chunks[first] = chunks[first].replace(b'"content":"', b'"content":"~', 1)
    data = MAGIC + encode_record(HEADER, header.encode()) + b"".join(encode_record(DATA, c) for c in chunks)
    (contents.path.parent / journal_name(header.owner, conv)).write_bytes(data)
    return b"".join(chunks)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("journal") / "streams"  # created by the server


@pytest.fixture(scope="module")
def killed(journal: Path) -> Iterator[tuple[dict[str, bytes], dict[str, bytes]]]:
    """The uninterrupted runs, then the same requests (and an unseeded one) with conversation ids,
    read a few events into when the server is SIGKILLed: (uninterrupted, what each client read)."""
    srv = server(journal)
    try:
        reference = asyncio.run(uninterrupted(srv.base_url))
        with httpx.Client(base_url=srv.base_url, timeout=300, headers=KEY1) as client:
            streams = Streams(client)
            for name, (route, body) in [*CASES.items(), ("random", ("chat", RANDOM))]:
                streams.start(name, route, body)
            live = [i["conversation_id"] for i in lookup(client, *streams.seen) if not i["is_done"]]
            os.kill(srv.proc.pid, signal.SIGKILL)  # the real process, mid-generation
            srv.proc.wait()
            streams.close()
        assert sorted(live) == sorted(streams.seen), "a stream ended before the kill: nothing to resume"
        yield reference, streams.seen
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def restarted(journal: Path, killed: object) -> Iterator[ServerProcess]:
    srv = server(journal)
    yield srv
    srv.stop()


@pytest.fixture
def client(restarted: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=restarted.base_url, timeout=300, headers=KEY1) as c:
        yield c


@pytest.mark.parametrize("case", list(CASES))
def test_a_killed_stream_resumes_with_the_bytes_of_an_uninterrupted_run(
    case: str, killed: tuple[dict[str, bytes], dict[str, bytes]], client: httpx.Client
) -> None:
    reference, seen = killed[0][case], killed[1][case]
    wait_done(client, case)
    full = replay(client, case, 0)
    resumed = replay(client, case, len(seen))
    assert full.status_code == resumed.status_code == 200
    assert full.content[: len(seen)] == seen, "the bytes read before the kill changed"
    assert resumed.content == full.content[len(seen) :]
    assert reply_ids(full.content) == reply_ids(seen), "the restart did not keep the reply's ids"
    assert normalized(reference, reference, seen) == normalized(full.content, seen, seen)
    if case == "messages":
        assert full.content.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    else:
        assert full.content.endswith(b"data: [DONE]\n\n")
        assert b'"completion_tokens":96' in full.content


def test_another_key_cannot_read_a_restored_stream(client: httpx.Client) -> None:
    assert replay(client, "greedy").status_code == 200
    other = replay(client, "greedy", headers=KEY2)
    assert other.status_code == 404 and other.json()["error"]["message"] == "Stream not found or expired"
    assert lookup(client, "greedy")[0]["is_done"] is True
    assert client.post("/v1/streams/lookup", json={"conversation_ids": ["greedy"]}, headers=KEY2).json() == []


def test_an_unseeded_stream_ends_with_the_documented_error(
    killed: tuple[dict[str, bytes], dict[str, bytes]], client: httpx.Client
) -> None:
    seen = killed[1]["random"]
    wait_done(client, "random")
    full = replay(client, "random").content
    journaled, sep, error = full.partition(ERROR_EVENT)
    assert sep, full[-300:]
    assert journaled.startswith(seen) or seen.startswith(journaled)
    assert b'"content":"' in journaled, "the journal kept none of the stream"
    body, done = (sep + error).split(b"\n\n", 1)
    assert json.loads(body[6:]) == {"error": {"code": 500, "message": NOT_RESUMABLE, "type": "server_error"}}
    assert done == b"data: [DONE]\n\n"


@pytest.mark.slow
def test_a_sigtermed_stream_resumes_too_and_expired_journals_go(
    journal: Path, killed: tuple[dict[str, bytes], dict[str, bytes]], restarted: ServerProcess
) -> None:
    """SIGTERM cancels what runs, but leaves its journal unfinished: the next start resumes it (and a
    journal whose bytes the regeneration does not reproduce ends with the documented error). A restart
    with a TTL the finished journals are past deletes them; a session that expires later takes its
    journal with it."""
    with httpx.Client(base_url=restarted.base_url, timeout=300, headers=KEY1) as client:
        wait_done(client, *CASES, "random")
        streams = Streams(client)
        streams.start("sigterm", "chat", GREEDY)
        restarted.stop()
        streams.close()
    assert restarted.exited_cleanly(), restarted.log()
    assert len(journal_files(journal)) == 5
    found = {c.header.conversation_id: c for c in map(read_journal, journal_files(journal)) if c}
    sigterm = found["sigterm"]
    assert sigterm.finished_at is None
    tampered = tampered_copy(sigterm, "tampered")
    time.sleep(TTL + 0.1)  # past the next start's TTL for the finished ones
    srv = server(journal, "--stream-ttl", str(TTL))
    try:
        with httpx.Client(base_url=srv.base_url, timeout=300, headers=KEY1) as client:
            # First: it ends at its first regenerated token, and is gone TTL seconds later.
            journaled, sep, error = replay(client, "tampered").content.partition(ERROR_EVENT)
            assert journaled == tampered and sep
            assert json.loads((sep + error).split(b"\n\n")[0][6:])["error"]["message"] == DIVERGED
            assert error.endswith(b"\n\ndata: [DONE]\n\n")
            full = replay(client, "sigterm").content  # followed while it is regenerated
            reference = killed[0]["greedy"]
            assert normalized(reference, reference, full) == normalized(full, full, full)
            assert full.startswith(streams.seen["sigterm"])
            assert replay(client, "greedy").status_code == 404
            wait_until(lambda: not journal_files(journal), LIVENESS_S, "journals deleted after their TTL")
            second = subprocess.run(
                [sys.executable, "-m", "server", "-m", "smollm2", "--stream-journal", str(journal)],
                cwd=REPO, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert second.returncode == 2 and "in use by another server" in second.stderr
    finally:
        srv.stop()


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_journal_path_that_is_not_a_writable_folder_fails_at_start(tmp_path: Path, under: str) -> None:
    path = tmp_path / "a file"
    path.write_text("x")
    result = subprocess.run(
        [sys.executable, "-m", "server", "-m", "smollm2", "--stream-journal", str(path / under)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    [line] = [line for line in result.stderr.splitlines() if "error" in line]
    assert line.startswith("llamba-server: error: --stream-journal: ")
