"""server/apis/responses/runs.py's run_events without a server: a response whose generation raises after its
first events ends as a failed response, with the Responses API's own events (numbered, `response.failed`
last) and stored as failed, not as a cut stream or a cancelled response. An engine failure (a failed
step) takes its own path and is tested over HTTP in tests/test_responses_server.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine.api import GenerationRequest, TokenEvent
from server.apis.responses import runs as response_runs
from server.apis.responses.runs import ResponseRun, ResponsesState, RunContext, RunEnd
from server.apis.responses.store import ResponseStore
from server.chat.job import ChatJob
from server.http import errors
from tests.test_responses_server import sse_events

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def failing_generation(exc: Exception) -> Any:
    """A generation that yields two tokens of text, then raises `exc`."""

    async def generation(ctx: RunContext, end: RunEnd) -> AsyncIterator[TokenEvent]:
        yield TokenEvent(text="Hello", token=1)
        yield TokenEvent(text=" there", token=2)
        raise exc

    return generation


def snapshot(response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "status": "in_progress", "output": [], "error": None}


async def run_failing(monkeypatch: pytest.MonkeyPatch, exc: Exception) -> tuple[list[dict], ResponsesState]:
    monkeypatch.setattr(response_runs, "generation", failing_generation(exc))
    state = ResponsesState(ResponseStore())
    job = ChatJob("Hi", 3, GenerationRequest(prompt_tokens=[1, 2, 3]))
    run = ResponseRun(snapshot("resp_1"), background=False)
    ctx = RunContext(model=None, state=state, job=job, conversation=[], store=True)  # type: ignore[arg-type]
    raw = b"".join([chunk async for chunk in response_runs.run_events(ctx, run)])
    return sse_events(raw), state


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (RuntimeError("a bug"), "internal error: a bug"),
        (errors.APIError(503, "the engine stopped", "unavailable_error"), "the engine stopped"),
    ],
)
async def test_a_generation_that_raises_ends_as_a_failed_response(
    monkeypatch: pytest.MonkeyPatch, exc: Exception, message: str
) -> None:
    events, state = await run_failing(monkeypatch, exc)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.failed"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {"code": "server_error", "message": message}
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "Hello there"  # what was generated before the failure stays in the output
    assert failed["output"][0]["content"][0]["text"] == "Hello there"
    stored = state.store.get("resp_1")
    assert stored is not None and stored.response["status"] == "failed"
