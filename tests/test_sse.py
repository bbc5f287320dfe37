"""server/http/sse.py's errors_as_events without a server: a stream that fails after its first byte ends with
its route's closing error, whatever it raised (the SDKs' reactions on a real server are in
tests/test_engine_faults_server.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from server.apis.anthropic import routes as anthropic
from server.apis.openai import chunks as openai
from server.http import errors, sse

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Failing:
    """Two events, then `exc`; remembers whether it was closed (its cleanup cancels the engine request)."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.closed = False

    async def stream(self) -> AsyncIterator[bytes]:
        try:
            yield sse.event({"n": 1})
            yield sse.event({"n": 2})
            raise self.exc
        finally:
            self.closed = True


async def drain(source: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in source])


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


async def test_an_api_error_ends_the_stream_with_the_routes_frame() -> None:
    source = Failing(errors.APIError(503, "the engine stopped", "unavailable_error"))
    out = events(await drain(sse.errors_as_events(source.stream(), openai.chat_error_event)))
    assert out[:2] == [b'data: {"n":1}', b'data: {"n":2}'] and out[3] == b"data: [DONE]"
    error = json.loads(out[2].removeprefix(b"data: "))["error"]
    assert error["code"] == 503 and error["message"] == "the engine stopped" and source.closed


FRAMES = {"openai": openai.chat_error_event, "anthropic": anthropic.error_event, "native": sse.closing_error}


@pytest.mark.parametrize("route", list(FRAMES))
async def test_an_unexpected_exception_ends_the_stream_as_a_500_in_the_routes_shape(route: str) -> None:
    source = Failing(RuntimeError("a bug"))
    frames = {
        "openai": openai.chat_error_event,
        "anthropic": anthropic.error_event,
        "native": sse.closing_error,
    }
    out = events(await drain(sse.errors_as_events(source.stream(), frames[route])))
    assert len(out) == (4 if route == "openai" else 3) and source.closed
    if route == "anthropic":
        name, data = out[2].split(b"\n")
        assert name == b"event: error"
        body = json.loads(data.removeprefix(b"data: "))
        assert body["type"] == "error" and body["error"]["type"] == "api_error"
        assert "a bug" in body["error"]["message"]
        return
    error = json.loads(out[2].removeprefix(b"data: "))["error"]
    assert error["code"] == 500 and error["type"] == "server_error" and "a bug" in error["message"]
    assert out[3:] == ([b"data: [DONE]"] if route == "openai" else [])
