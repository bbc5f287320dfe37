"""The Engine: owns the model, KV cache and scheduler, and runs the step loop in its own thread.

Its public surface (`submit`, `cancel`, `control`, `stats`, `start`, `stop`) is thread-safe; everything
else runs on the engine thread, the only thread that calls the (parallel) kernels. Events reach asyncio
through `loop.call_soon_threadsafe`, so the event loop never blocks and never polls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from engine.batch import Batch, BatchPart
from engine.llm import LLM
from engine.prompt_cache import PromptCache, mib_to_bytes
from engine.request import GenerationRequest, TokenEvent
from engine.scheduler import Scheduler
from engine.slot_files import ModelIdentity, SlotBusyError, SlotFileError, SlotState, read_slot, write_slot
from engine.text.reasoning import CONTROL_ACTIONS, ControlResult

log = structlog.get_logger("engine")


@dataclass(frozen=True)
class EngineConfig:
    n_slots: int = 1
    n_ctx: int = 4096  # total; each slot gets n_ctx / n_slots
    n_ubatch: int = 512  # tokens per step (prefill chunks + decode tokens)
    slot_similarity: float = 0.1
    cache_ram_mib: int = 8192  # host prompt cache: 0 off, -1 no limit
    context_shift: bool = False  # when a slot fills during generation, drop half of its context
    n_keep: int = 0  # tokens kept at the start by a context shift


class RequestHandle:
    """The asyncio side of one request: an async iterator of TokenEvents ending with a finish_reason."""

    def __init__(self, engine: Engine, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.request_id = request_id
        self._loop = loop
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.finished = False

    def push(self, event: TokenEvent) -> None:  # called on the engine thread
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        while not self.finished:
            event = await self._queue.get()
            self.finished = event.finish_reason is not None
            yield event

    def cancel(self) -> None:
        if not self.finished:
            self.engine.cancel(self.request_id)

    def control(self, action: str) -> concurrent.futures.Future[ControlResult]:
        return self.engine.control(self.request_id, action)


class Engine:
    def __init__(self, llm: LLM, config: EngineConfig) -> None:
        self.llm = llm
        self.config = config
        n_ctx_slot = max(1, config.n_ctx // config.n_slots)
        self.kv = llm.new_cache(config.n_slots, n_ctx_slot)
        self.prompt_cache = PromptCache(mib_to_bytes(config.cache_ram_mib))
        self.scheduler = Scheduler(
            self.kv,
            llm.tokenizer,
            config.n_ubatch,
            config.slot_similarity,
            self.prompt_cache,
            shift_kv=self._shift_kv if config.context_shift else None,
            n_keep=config.n_keep,
        )
        self._cond = threading.Condition()
        self._commands: list[Callable[[], None]] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._ids = itertools.count()
        self.n_steps = 0
        self.n_tokens_processed = 0

    def _shift_kv(self, seq: int, start: int, end: int, delta: int) -> None:
        self.llm.model.shift_kv(self.kv, seq, start, end, delta)

    @property
    def n_ctx_slot(self) -> int:
        return self.kv.n_ctx

    # -- thread-safe public surface ----------------------------------------------------------------
    def start(self, warm_up: bool = True) -> None:
        """Start the engine thread; returns once it is ready for requests (kernels compiled or loaded).

        The warm-up runs on the engine thread itself: OpenMP gives every thread that enters a parallel
        region its own worker team, and with two teams on two cores libgomp throttles its spinning
        (measured: decode 4.7 -> 12 ms a step).
        """
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(warm_up, ready), name="llamba-engine", daemon=True
        )
        self._thread.start()
        ready.wait()

    def stop(self, timeout: float = 2.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(
        self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None
    ) -> RequestHandle:
        request_id = request.request_id or f"req-{next(self._ids)}"
        if not request.request_id:
            request = GenerationRequest(**{**request.__dict__, "request_id": request_id})
        handle = RequestHandle(self, request_id, loop or asyncio.get_running_loop())
        self._command(lambda: self.scheduler.waiting.append((request, handle.push)))
        return handle

    def cancel(self, request_id: str) -> None:
        self._command(lambda: self.scheduler.cancel(request_id))

    def control(self, request_id: str, action: str) -> concurrent.futures.Future[ControlResult]:
        """Act on a running request (CONTROL_ACTIONS) at the next step; the future holds the outcome.

        It is a concurrent future, resolved on the engine thread: asyncio callers wrap it
        (`asyncio.wrap_future`) and never block the loop.
        """
        if action not in CONTROL_ACTIONS:
            raise ValueError(f"unknown control action {action!r}; known: {', '.join(CONTROL_ACTIONS)}")
        future: concurrent.futures.Future[ControlResult] = concurrent.futures.Future()
        if self._thread is None or not self._thread.is_alive():
            future.set_result(ControlResult(False, "the engine is not running"))
            return future

        def run() -> None:
            try:
                future.set_result(self.scheduler.control(request_id, action))
            except Exception as exc:  # a failed control must reach its caller, not kill the thread
                future.set_exception(exc)

        self._command(run)
        return future

    def slot_action(
        self, slot_id: int, action: str, path: Path | None = None
    ) -> concurrent.futures.Future[dict[str, Any]]:
        """save/restore/erase a slot's cache (`path`: the slot file) at the next step, on the engine thread.

        The future raises SlotFileError for a file that can't be used, SlotBusyError for a busy slot.
        """
        future: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        if self._thread is None or not self._thread.is_alive():
            future.set_exception(RuntimeError("the engine is not running"))
            return future

        def run() -> None:
            try:
                future.set_result(self._slot_action(slot_id, action, path))
            except Exception as exc:  # a failed action must reach its caller, not kill the thread
                future.set_exception(exc)

        self._command(run)
        return future

    def stats(self) -> list[dict]:
        """A snapshot of the slots (read without locking: fields are replaced atomically)."""
        return [
            {
                "id": slot.id,
                "id_task": slot.id_task,
                "n_ctx": self.n_ctx_slot,
                "is_processing": slot.busy,
                "n_cached": len(slot.tokens),
            }
            for slot in self.scheduler.slots
        ]

    @property
    def n_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # -- engine thread ------------------------------------------------------------------------------
    def _command(self, fn: Callable[[], None]) -> None:
        with self._cond:
            self._commands.append(fn)
            self._cond.notify()

    def _slot_action(self, slot_id: int, action: str, path: Path | None) -> dict[str, Any]:
        slot = self.scheduler.slots[slot_id]
        if slot.busy:
            raise SlotBusyError("Slot is busy")
        start = time.perf_counter()
        if action == "erase":
            n_erased = len(slot.tokens)
            slot.tokens = []
            self.kv.clear(slot.id)
            return {"id_slot": slot_id, "n_erased": n_erased}
        assert path is not None
        if action == "save":
            n = min(len(slot.tokens), int(self.kv.lengths[slot.id]))
            k, v = self.kv.read_cells(slot.id, n)
            n_written = write_slot(path, self._identity, SlotState(slot.tokens[:n], k, v))
            ms = 1e3 * (time.perf_counter() - start)
            return {
                "id_slot": slot_id,
                "filename": path.name,
                "n_saved": n,
                "n_written": n_written,
                "timings": {"save_ms": ms},
            }
        if action == "restore":
            # Read and check everything first: a bad file raises before the slot is touched.
            state, n_read = read_slot(path, self._identity, self.n_ctx_slot)
            self.kv.write_cells(slot.id, state.k, state.v)
            slot.tokens = state.tokens
            ms = 1e3 * (time.perf_counter() - start)
            return {
                "id_slot": slot_id,
                "filename": path.name,
                "n_restored": len(state.tokens),
                "n_read": n_read,
                "timings": {"restore_ms": ms},
            }
        raise SlotFileError(f"Invalid action {action!r}")

    @property
    def _identity(self) -> ModelIdentity:
        return ModelIdentity.of(tuple(self.kv.k.shape), self.llm.tokenizer.n_vocab, self.llm.path.name)

    def _run(self, warm_up: bool, ready: threading.Event) -> None:
        try:
            if warm_up:
                self._warm_up()
        finally:
            ready.set()
        while True:
            with self._cond:
                while not self._commands and not self._stopping and not self.scheduler.has_work():
                    self._cond.wait()
                commands, self._commands = self._commands, []
                stopping = self._stopping
            for fn in commands:
                fn()
            if stopping:
                self.scheduler.cancel_all("cancelled")
                return
            self._step()

    def _step(self) -> None:
        self.scheduler.admit()
        planned = self.scheduler.build_batch()
        if planned is None:
            return
        batch, outputs = planned
        try:
            logits = self.llm.model.forward(batch, self.kv)
        except Exception as exc:  # a kernel failure must not kill the thread or hang clients
            log.exception("engine.step_failed", error=str(exc))
            for slot in outputs:
                slot.tokens.clear()
                self.kv.clear(slot.id)
            self.scheduler.cancel_all("error")
            return
        self.n_steps += 1
        self.n_tokens_processed += batch.n_tokens
        self.scheduler.apply(logits, outputs)

    def _warm_up(self) -> None:
        """Compile (or load from cache) every kernel with a tiny batch, so no request pays the JIT."""
        start = time.perf_counter()
        self.llm.model.forward(Batch.of([BatchPart(0, 0, [self.llm.tokenizer.bos_id] * 2)]), self.kv)
        self.kv.clear(0)
        log.info("engine.warm", seconds=round(time.perf_counter() - start, 2))
