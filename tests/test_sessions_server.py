"""Resumable stream sessions end to end: a real server, real clients, sockets dropped mid-stream."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.server_process import LIVENESS_S, REPO, ServerProcess, wait_until

# Liveness bounds, not speed checks (each is a bounded wait for the condition): a stopped or replaced
# generation frees its slot at its next decode step; after SIGTERM the server exits by itself (code 0),
# well before stop()'s SIGKILL fallback. The DELETE and replace tests also check by what the stream
# carried (no [DONE]) that the generation was cut short, not run to its end within the bound.
SLOT_FREED_S = SIGTERM_EXIT_S = LIVENESS_S

CONV = "X-Conversation-Id"
ODD_ID = "chat/42: resume test::SmolLM2 model"
KEY = {"X-Api-Key": "sekrit"}


def chat_body(content: str, max_tokens: int, **extra: object) -> dict:
    return {
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def sse_payloads(data: bytes) -> list[str]:
    """The `data:` payloads of a complete SSE byte stream (which must end on an event boundary)."""
    assert data.endswith(b"\n\n"), data[-200:]
    events = data[:-2].split(b"\n\n")
    assert all(e.startswith(b"data: ") for e in events), events
    return [e[6:].decode() for e in events]


def stream_text(payloads: list[str]) -> str:
    return "".join(
        c["delta"].get("content") or "" for p in payloads if p != "[DONE]" for c in json.loads(p)["choices"]
    )


def lookup(client: httpx.Client, *ids: str) -> list[dict]:
    reply = client.post("/v1/streams/lookup", json={"conversation_ids": list(ids)})
    assert reply.status_code == 200, reply.text
    return reply.json()


def wait_done(client: httpx.Client, conv_id: str, timeout: float = 120) -> dict:
    wait_until(lambda: all(i["is_done"] for i in lookup(client, conv_id)), timeout, f"{conv_id} done")
    [info] = lookup(client, conv_id)
    return info


def replay(client: httpx.Client, conv_id: str, offset: int | str = 0) -> httpx.Response:
    return client.get("/v1/stream", params={"conv_id": conv_id, "from": offset})


def busy_slots(client: httpx.Client) -> int:
    return sum(s["is_processing"] for s in client.get("/slots").json())


class RawChatStream:
    """A streaming POST over a bare socket: reads the chunked body byte-exactly, can drop mid-stream."""

    def __init__(self, port: int, body: dict, headers: dict[str, str]) -> None:
        payload = json.dumps(body).encode()
        lines = [
            "POST /v1/chat/completions HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Content-Type: application/json",
            f"Content-Length: {len(payload)}",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        self._raw = b""
        self.body = b""
        head = self._take_through(b"\r\n\r\n").decode("latin-1").lower()
        assert head.startswith("http/1.1 200"), head
        assert "transfer-encoding: chunked" in head, head

    def _take_through(self, marker: bytes) -> bytes:
        while marker not in self._raw:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("connection closed")
            self._raw += data
        head, _, self._raw = self._raw.partition(marker)
        return head

    def _take(self, n: int) -> bytes:
        while len(self._raw) < n:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("connection closed")
            self._raw += data
        out, self._raw = self._raw[:n], self._raw[n:]
        return out

    def read_until(self, done: Callable[[bytes], bool]) -> bytes:
        """Body bytes until `done(body)` or the end of the body."""
        while not done(self.body):
            size = int(self._take_through(b"\r\n").split(b";")[0], 16)
            chunk = self._take(size + 2)[:-2]
            if size == 0:
                break
            self.body += chunk
        return self.body

    def drop(self) -> None:
        """Close with a reset, as a killed browser tab would."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def content_chunks(n: int) -> Callable[[bytes], bool]:
    return lambda body: body.count(b'"delta":{"content":') >= n


# -- one server with default session limits ---------------------------------------------------------
@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", "smollm2", "-c", "1024", "-np", "2").wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture
def client(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.base_url, timeout=120) as c:
        yield c


def test_resume_after_a_dropped_socket_is_byte_identical_to_the_full_replay(
    srv: ServerProcess, client: httpx.Client
) -> None:
    body = chat_body("Write a short poem about the sea.", 48, cache_prompt=False)
    with client.stream("POST", "/v1/chat/completions", json=body) as plain:
        uninterrupted = stream_text(sse_payloads(plain.read()))

    raw = RawChatStream(srv.port, body, {CONV: ODD_ID})
    seen = raw.read_until(content_chunks(3))
    raw.drop()
    assert b"[DONE]" not in seen, "the generation ended before the drop; nothing to resume"
    n = len(seen)

    info = wait_done(client, ODD_ID)
    full = replay(client, ODD_ID, 0)
    resumed = replay(client, ODD_ID, n)
    assert full.status_code == resumed.status_code == 200
    assert full.headers["content-type"].startswith("text/event-stream")
    assert info["total_bytes"] == len(full.content)
    assert full.content[:n] == seen, "the client saw bytes the session did not keep"
    assert resumed.content == full.content[n:]
    assert replay(client, ODD_ID, n + 7).content == full.content[n + 7 :]  # any byte offset, mid-event too
    assert replay(client, ODD_ID, len(full.content)).content == b""

    payloads = sse_payloads(full.content)
    assert payloads[-1] == "[DONE]"
    usage = json.loads(payloads[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 3
    assert json.loads(payloads[-3])["choices"][0]["finish_reason"] in ("stop", "length")
    assert stream_text(payloads) == uninterrupted, "the generation did not run on after the drop"


def test_delete_stops_the_generation_and_frees_the_slot(client: httpx.Client) -> None:
    conv = "stop me/please: now"
    body = chat_body("Tell me a very long story about dragons.", 2000)
    with client.stream("POST", "/v1/chat/completions", json=body, headers={CONV: conv}) as resp:
        lines = resp.iter_lines()
        next(line for line in lines if '"content":"' in line)
        assert busy_slots(client) == 1
        assert client.delete("/v1/stream", params={"conv_id": conv}).status_code == 204
        wait_until(lambda: busy_slots(client) == 0, SLOT_FREED_S, "slot freed after DELETE")
        rest = list(lines)  # the original response ends too, without a [DONE]
        assert "data: [DONE]" not in rest
    assert client.delete("/v1/stream", params={"conv_id": conv}).status_code == 204
    gone = replay(client, conv)
    assert gone.status_code == 404 and gone.json()["error"]["message"] == "Stream not found or expired"
    assert lookup(client, conv) == []


def test_lookup_names_only_known_ids_and_bad_input_is_400(client: httpx.Client) -> None:
    ids = ["a/b/c", "x: y::z w"]
    for conv in ids:
        reply = client.post("/v1/chat/completions", json=chat_body("Hi", 3), headers={CONV: conv})
        assert reply.status_code == 200 and reply.text.endswith("data: [DONE]\n\n")
    not_streamed = client.post(
        "/v1/chat/completions", json={**chat_body("Hi", 2), "stream": False}, headers={CONV: "no stream"}
    )
    assert not_streamed.status_code == 200
    infos = lookup(client, "unknown", ids[1], ids[0], ids[1], "no stream")
    assert [i["conversation_id"] for i in infos] == [ids[1], ids[0]]
    for info in infos:
        assert info["is_done"] is True
        assert info["total_bytes"] == len(replay(client, info["conversation_id"]).content)
    assert lookup(client) == []

    def error_of(reply: httpx.Response) -> tuple[int, str]:
        return reply.status_code, reply.json()["error"]["type"]

    bad = "invalid_request_error"
    post = client.post
    assert error_of(post("/v1/streams/lookup", content=b"{not json")) == (400, bad)
    assert error_of(post("/v1/streams/lookup", json={"conversation_ids": "a/b/c"})) == (400, bad)
    assert error_of(post("/v1/streams/lookup", json=["a/b/c"])) == (400, bad)
    assert error_of(client.get("/v1/stream")) == (400, bad)
    assert error_of(client.delete("/v1/stream")) == (400, bad)
    for offset in ("abc", "-1", "1.5", "0x10"):
        assert error_of(replay(client, ids[0], offset)) == (400, bad)
    assert error_of(replay(client, "unknown")) == (404, "not_found_error")


def test_readers_attached_while_live_get_every_byte_once_in_order(srv: ServerProcess) -> None:
    conv = "live/readers: 1"
    body = chat_body("Describe a forest in spring.", 64)

    async def read_all(client: httpx.AsyncClient, offset: int) -> bytes:
        async with client.stream("GET", "/v1/stream", params={"conv_id": conv, "from": offset}) as resp:
            assert resp.status_code == 200
            return b"".join([chunk async for chunk in resp.aiter_raw()])

    async def scenario() -> tuple[bytes, list[bytes], bool]:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as client:
            async with client.stream("POST", "/v1/chat/completions", json=body, headers={CONV: conv}) as resp:
                chunks = resp.aiter_raw()
                posted = b""
                async for chunk in chunks:
                    posted += chunk
                    if b'"content":"' in posted:
                        break
                reply = await client.post("/v1/streams/lookup", json={"conversation_ids": [conv]})
                live = not reply.json()[0]["is_done"]
                readers = [asyncio.create_task(read_all(client, 0)) for _ in range(3)]
                async for chunk in chunks:
                    posted += chunk
            return posted, await asyncio.gather(*readers), live

    posted, read, was_live = asyncio.run(scenario())
    assert was_live, "the readers attached after the generation ended"
    with httpx.Client(base_url=srv.base_url, timeout=60) as client:
        full = replay(client, conv).content
    assert posted == full and all(r == full for r in read)
    assert sse_payloads(full)[-1] == "[DONE]"


def test_same_id_replaces_the_live_session(client: httpx.Client) -> None:
    conv = "replace::me"
    with client.stream(
        "POST", "/v1/chat/completions", json=chat_body("Tell me a long story.", 2000), headers={CONV: conv}
    ) as first:
        lines = first.iter_lines()
        next(line for line in lines if '"content":"' in line)
        second = client.post("/v1/chat/completions", json=chat_body("Say hi.", 4), headers={CONV: conv})
        assert "data: [DONE]" not in list(lines), "the replaced generation ran to its end"
    assert second.status_code == 200 and second.text.endswith("data: [DONE]\n\n")
    assert replay(client, conv).content == second.content
    wait_until(lambda: busy_slots(client) == 0, SLOT_FREED_S, "replaced generation's slot freed")


# -- one server with tiny limits and an API key -----------------------------------------------------
@pytest.fixture(scope="module")
def small() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "-m", "smollm2", "-c", "1024", "-np", "2", "--api-key", "sekrit",
        "--stream-buffer-size", "1024", "--stream-max-sessions", "8", "--stream-ttl", "2",
    ).wait_healthy()  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture
def small_client(small: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=small.base_url, timeout=120, headers=KEY) as c:
        yield c


def test_the_api_key_guards_the_stream_routes(small: ServerProcess) -> None:
    with httpx.Client(base_url=small.base_url, timeout=60) as anon:
        for reply in (
            anon.get("/v1/stream", params={"conv_id": "x"}),
            anon.delete("/v1/stream", params={"conv_id": "x"}),
            anon.post("/v1/streams/lookup", json={"conversation_ids": ["x"]}),
            anon.post("/v1/chat/completions", json=chat_body("Hi", 2), headers={CONV: "x"}),
        ):
            assert reply.status_code == 401 and reply.json()["error"]["type"] == "authentication_error"


def test_a_finished_session_is_gone_after_its_ttl(small_client: httpx.Client) -> None:
    conv = "ttl/test: 1"
    small_client.post("/v1/chat/completions", json=chat_body("Hi", 2), headers={CONV: conv})
    info = wait_done(small_client, conv)
    done_at = time.monotonic()
    assert replay(small_client, conv, info["total_bytes"] - 100).status_code == 200  # (the ring is 1 KiB)
    time.sleep(max(0.0, done_at + 2.3 - time.monotonic()))
    gone = replay(small_client, conv)
    assert gone.status_code == 404 and gone.json()["error"]["message"] == "Stream not found or expired"
    assert lookup(small_client, conv) == []


def test_memory_stays_bounded_over_100_sessions(small_client: httpx.Client) -> None:
    ids = [f"bounded/{i}: session" for i in range(100)]
    body = chat_body("Count to three.", 4)

    async def scenario(base_url: str) -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=120, headers=KEY) as client:

            async def one(conv: str) -> None:
                # The POST reader itself may fall behind a 1 KiB ring and be ended: that is fine here.
                await client.post("/v1/chat/completions", json=body, headers={CONV: conv})
                reply = await client.post("/v1/streams/lookup", json={"conversation_ids": ids})
                assert len(reply.json()) <= 8

            for pair in range(0, len(ids), 2):
                await asyncio.gather(*(one(conv) for conv in ids[pair : pair + 2]))

    asyncio.run(scenario(str(small_client.base_url)))
    last = wait_done(small_client, ids[-1])
    total = last["total_bytes"]
    assert total > 1024, "the stream must overflow the ring for this test to mean anything"
    dropped = replay(small_client, ids[-1], 0)
    assert dropped.status_code == 400 and dropped.json()["error"]["type"] == "invalid_request_error"
    tail = replay(small_client, ids[-1], total - 1024)
    assert tail.status_code == 200 and len(tail.content) == 1024
    assert tail.content.endswith(b"data: [DONE]\n\n")
    assert len(lookup(small_client, *ids)) <= 8


def test_the_session_cap_refuses_new_sessions_when_all_are_live(
    small: ServerProcess, small_client: httpx.Client
) -> None:
    live = [f"cap {i}" for i in range(8)]
    for conv in live:
        raw = RawChatStream(small.port, chat_body("Write a long essay.", 400), {CONV: conv, **KEY})
        raw.read_until(lambda body: len(body) > 0)
        raw.drop()
    assert len(lookup(small_client, *live)) == 8
    refused = small_client.post("/v1/chat/completions", json=chat_body("Hi", 2), headers={CONV: "one more"})
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "unavailable_error"
    for conv in live:
        assert small_client.delete("/v1/stream", params={"conv_id": conv}).status_code == 204
    wait_until(lambda: busy_slots(small_client) == 0, SLOT_FREED_S, "slots freed after DELETEs")
    accepted = small_client.post("/v1/chat/completions", json=chat_body("Hi", 2), headers={CONV: "one more"})
    assert accepted.status_code == 200  # (its own reader may fall behind the 1 KiB ring: look it up)
    tail = replay(small_client, "one more", wait_done(small_client, "one more")["total_bytes"] - 20)
    assert tail.content.endswith(b"data: [DONE]\n\n")


def test_sigterm_with_a_live_session_exits_promptly(small: ServerProcess) -> None:
    raw = RawChatStream(small.port, chat_body("Write a long essay.", 400), {CONV: "shutdown", **KEY})
    raw.read_until(content_chunks(1))
    raw.drop()
    small.stop(timeout=SIGTERM_EXIT_S)
    assert small.exited_cleanly(), f"SIGTERM: no clean exit within {SIGTERM_EXIT_S} s\n{small.log()}"


@pytest.mark.parametrize(
    "args", [["--stream-buffer-size", "0"], ["--stream-ttl", "-1"], ["--stream-max-sessions", "0"]]
)
def test_bad_session_limits_exit_non_zero(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and args[0] in result.stderr
