"""EngineClient: the narrow client of a loaded engine, the one object that hands it work.

A route (through server/chat/) submits generation requests and reads their events, asks for `n` choices
of one prompt, embeddings, control and slot actions, and reads the engine's published state. Every call
goes through the engine's thread-safe surface; nothing here renders or tokenizes (server/model/prompts.py
does). One client per load (server/model/loading.py makes it), handed the host's admission gate and
counters, which outlive it while the model sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from engine.api import (
    ControlResult,
    EmbeddingRequest,
    EngineSnapshot,
    GenerationRequest,
    Pooling,
    TokenEvent,
)
from engine.engine import Engine, EngineStopped
from engine.grammar import CompiledGrammar, GrammarCompiler, GrammarError, GrammarSpec
from engine.handle import RequestHandle
from engine.media.chunks import MediaChunk
from engine.memory.slot_files import SLOT_ACTIONS, SlotBusyError, SlotFileError, slot_path
from server.config.settings import Settings
from server.http import errors
from server.model.admission import Admission
from server.model.metrics import Counters, RequestTimer

# The engine answers calls between two steps; this only bounds the wait if it is stopping and never will.
CALL_TIMEOUT = 60.0
CONTROL_TIMEOUT = 10.0


@dataclass(frozen=True)
class Grammars:
    """The grammar engine's view of this model's vocabulary, and the server-wide constraint
    (--grammar/--grammar-file or -j/-jf) compiled with it at load: that of requests without one."""

    compiler: GrammarCompiler
    default: CompiledGrammar | None = None


class EngineClient:
    """The loaded engine's client: requests in, events out, and its published state."""

    def __init__(
        self,
        engine: Engine,
        grammars: Grammars,
        pooling: Pooling,
        settings: Settings,
        admission: Admission,
        counters: Counters,
    ) -> None:
        self._engine = engine
        self._grammars = grammars
        self.pooling = pooling  # what embedding requests pool (engine/embedding.py)
        self.settings = settings
        # Both outlive this client (the host's, kept while the model sleeps): --max-queue and the
        # SIGTERM drain, and what /metrics reports.
        self.admission = admission
        self.counters = counters

    @property
    def n_slots(self) -> int:
        return self._engine.config.n_slots

    @property
    def snapshot(self) -> EngineSnapshot:
        """The engine's state as its thread last published it (slots, queue, counts)."""
        return self._engine.snapshot

    # -- admission and grammars (while a request is prepared, before any byte of its reply) ----------
    def check_queue(self, wanted: int = 1) -> None:
        """503 with Retry-After when the server is shutting down or the queue for slots is full."""
        self.admission.check_open()
        self.admission.check(self.n_slots, wanted)

    @property
    def default_grammar(self) -> CompiledGrammar | None:
        return self._grammars.default

    async def compile_grammar(self, spec: GrammarSpec, field: str) -> CompiledGrammar:
        """`spec` compiled for this model (a worker thread; ~1-2 ms); 400 naming `field` if it can't be."""
        try:
            return await anyio.to_thread.run_sync(self._grammars.compiler.compile, spec)
        except GrammarError as exc:
            raise errors.invalid_request(f"'{field}': {exc}") from None

    # -- generation ------------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> RequestHandle:
        self.admission.check_open()
        self.counters.requests_total += 1
        handle = self._engine.submit(request, asyncio.get_running_loop())
        self.admission.track(handle)
        return handle

    def submit_choices(self, requests: list[GenerationRequest]) -> list[RequestHandle]:
        """`n` choices of one prompt: evaluated once, its cells copied to the other choices' slots."""
        self.admission.check_open()
        self.counters.requests_total += 1
        handles = self._engine.submit_choices(requests, asyncio.get_running_loop())
        self.admission.track(*handles)
        return handles

    async def events(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """The request's events; if the consumer goes away (client disconnect) the generation is cancelled."""
        timer = RequestTimer(self.counters.latency)
        handle = self.submit(request)
        try:
            async for event in handle:
                if event.finish_reason is not None:
                    self.counters.record(event)
                    timer.finish(event)
                else:
                    timer.see(event)
                yield event
        finally:
            handle.cancel()

    async def choice_events(self, requests: list[GenerationRequest]) -> AsyncIterator[tuple[int, TokenEvent]]:
        """Every choice's events as they come, with the choice's index; leaving early cancels them all."""
        timers = [RequestTimer(self.counters.latency) for _ in requests]
        handles = self.submit_choices(requests)
        queue: asyncio.Queue[tuple[int, TokenEvent]] = asyncio.Queue()

        async def pump(index: int) -> None:
            async for event in handles[index]:
                queue.put_nowait((index, event))

        tasks = [asyncio.create_task(pump(i)) for i in range(len(handles))]
        try:
            running = len(handles)
            while running:
                index, event = await queue.get()
                if event.finish_reason is not None:
                    self.counters.record(event)
                    timers[index].finish(event)
                    running -= 1
                else:
                    timers[index].see(event)
                yield index, event
        finally:
            for task in tasks:
                task.cancel()
            for handle in handles:
                handle.cancel()

    async def embed(
        self, prompts: list[list[int]], media: list[Mapping[int, MediaChunk]] | None = None
    ) -> list[TokenEvent]:
        """Each prompt's final event (its `embedding`), run as concurrent engine requests; cancelling
        the caller (a client gone) cancels every one still running. `media`: each prompt's media chunks."""
        loop = asyncio.get_running_loop()
        self.check_queue()  # one request, however many inputs: it is never refused for its size
        self.counters.requests_total += 1
        chunks = media or [{} for _ in prompts]
        requests = [EmbeddingRequest(p, self.pooling, media=m) for p, m in zip(prompts, chunks, strict=True)]
        handles = [self._engine.submit(request, loop) for request in requests]
        self.admission.track(*handles)
        try:
            events = [await _final_event(h) for h in handles]
        finally:
            for handle in handles:
                handle.cancel()  # a no-op for the finished ones
        for event in events:
            self.counters.record(event)  # /metrics: their prompt tokens
        return events

    # -- control, slots and cached prompts -------------------------------------------------------------
    async def control(self, request_id: str, action: str) -> ControlResult:
        try:
            future = self._engine.control(request_id, action)
            return await asyncio.wait_for(asyncio.wrap_future(future), CONTROL_TIMEOUT)
        except TimeoutError:
            return ControlResult(False, "the engine did not answer in time")
        except EngineStopped as exc:
            return ControlResult(False, str(exc))

    async def slot_action(self, slot_id: int, action: str, filename: object) -> dict[str, Any]:
        """llama-server's POST /slots/<id>?action=...; errors in its shapes."""
        save_dir = self.settings.slot_save_path
        if save_dir is None:
            raise errors.not_supported(
                "This server does not support slots action. Start it with `--slot-save-path`"
            )
        if not 0 <= slot_id < self.n_slots:
            raise errors.invalid_request(f"Invalid slot id {slot_id}: the server has {self.n_slots} slots")
        if action not in SLOT_ACTIONS:
            raise errors.invalid_request("Invalid action")
        try:
            path = None if action == "erase" else slot_path(Path(save_dir), filename)
            if action == "save":
                Path(save_dir).mkdir(parents=True, exist_ok=True)
            future = self._engine.slot_action(slot_id, action, path)
            return await asyncio.wait_for(asyncio.wrap_future(future), CALL_TIMEOUT)
        except SlotFileError as exc:
            raise errors.invalid_request(str(exc)) from None
        except (SlotBusyError, EngineStopped) as exc:
            raise errors.unavailable(str(exc)) from None
        except OSError as exc:  # the save directory is missing or not writable
            raise errors.APIError(500, f"failed to save slot: {exc.strerror}", "server_error") from None

    async def cached_prompts(self) -> list[tuple[int, ...]]:
        """The token sequences the engine holds cells for (slots and host cache)."""
        future = self._engine.cached_prompts()
        return await asyncio.wait_for(asyncio.wrap_future(future), CALL_TIMEOUT)


async def _final_event(handle: RequestHandle) -> TokenEvent:
    async for event in handle:
        if event.finish_reason is not None:
            if event.embedding is None:
                raise errors.APIError(500, f"the request ended: {event.finish_reason}", "server_error")
            return event
    raise errors.APIError(500, "the request ended without an answer", "server_error")
