"""The Engine: the engine thread and its command queue, around the model, KV cache and scheduler.

Its public surface (`submit`, `cancel`, `call` and what is built on it, `snapshot`, `start`, `stop`) is
thread-safe; everything else runs on the engine thread, the only thread that calls the (parallel)
kernels. Events reach asyncio through `loop.call_soon_threadsafe`, so the event loop never blocks and
never polls; the engine's state is published as an immutable snapshot after every step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numba
import structlog

from engine.api import ControlResult, EmbeddingRequest, EngineSnapshot, GenerationRequest
from engine.batch import Batch, BatchPart
from engine.handle import RequestHandle
from engine.llm import LLM
from engine.lora import lora_context
from engine.memory.base import SequenceMemory
from engine.memory.checkpoints import DEFAULT_MAX_COUNT
from engine.memory.hybrid import DEFAULT_MIN_STEP, HybridMemory
from engine.memory.kv import CacheTypes
from engine.memory.kv_types import cache_type
from engine.memory.prompt_cache import PromptCache, mib_to_bytes
from engine.memory.slot_files import ModelIdentity, slot_action
from engine.scheduler import Scheduler
from engine.slots import SlotPool
from engine.speculative import Speculation
from engine.speculative.draft import DraftModel
from engine.speculative.setup import speculation
from engine.threads import tuner_for

log = structlog.get_logger("engine")
T = TypeVar("T")


class EngineStopped(RuntimeError):
    """The engine thread is not running, so a call can't be answered."""


class ForwardFailed(RuntimeError):
    """The model's forward pass raised (a kernel failure): the slots' requests end, waiting ones still run."""


@dataclass(frozen=True)
class EngineConfig:
    n_slots: int = 1
    n_ctx: int = 4096  # total; each slot gets n_ctx / n_slots
    # llama.cpp's unified KV cache: each slot may grow to n_ctx, and the busy slots together hold at most
    # n_ctx cells (each slot's cells are still its own: n_slots x n_ctx of memory)
    kv_unified: bool = False
    # With kv_unified and a host prompt cache: a starting request moves every idle slot's cells there
    # and empties the slot (llama-server's --cache-idle-slots)
    cache_idle_slots: bool = True
    n_ubatch: int = 512  # tokens per step (prefill chunks + decode tokens)
    slot_similarity: float = 0.1
    cache_ram_mib: int = 8192  # host prompt cache: 0 off, -1 no limit
    context_shift: bool = False  # when a slot fills during generation, drop half of its context
    # Recurrent memory (engine/memory/hybrid.py): checkpoints per slot (--ctx-checkpoints) and the least
    # spacing of those taken at message ends (--checkpoint-min-step)
    ctx_checkpoints: int = DEFAULT_MAX_COUNT
    checkpoint_min_step: int = DEFAULT_MIN_STEP
    n_keep: int = 0  # tokens kept at the start by a context shift
    cache_type_k: str = "f16"  # -ctk: the keys' cell type (engine/memory/kv_types.py: f16, q8_0)
    cache_type_v: str = "f16"  # -ctv
    n_threads: int = 0  # compute threads of the engine thread (Numba's are per thread); 0: Numba's default
    adaptive_threads: bool = True  # fewer threads while other programs take the cores (engine/threads.py)
    # Fault injection for the error-path tests (LLAMBA_FAIL_FORWARD, read by server/model/loading.py): the
    # forward passes with these numbers (1 = the first after warm-up) raise as a failing kernel would.
    fail_forward: frozenset[int] = frozenset()

    @property
    def n_ctx_slot(self) -> int:
        return max(1, self.n_ctx // (1 if self.kv_unified else self.n_slots))

    @property
    def clear_idle_slots(self) -> bool:
        return self.kv_unified and self.cache_idle_slots


def end_failed(scheduler: Scheduler, cause: str, in_forward: bool) -> None:
    """After a failed step: the requests in the slots end with finish_reason "error" (their clients get
    an error naming `cause`) and their cells are dropped, since the step may have half written them. A
    failure outside the forward pass (admission, batching, a sequence's advance) may have left any
    request half updated, so the waiting ones end too; after a kernel failure they run as usual."""
    error = f"the engine failed while generating: {cause}"
    for slot in scheduler.pool.busy():
        slot.tokens.clear()
        scheduler.pool.memory.clear(slot.id)
        if slot.seq is not None:
            scheduler.cancel(slot.seq.request.request_id, "error", error)
    if not in_forward:
        scheduler.cancel_all("error", error)


def new_memory(llm: LLM, config: EngineConfig) -> SequenceMemory:
    """The model's memory for every slot, in the configured cell types and checkpoint bound."""
    types = CacheTypes(cache_type(config.cache_type_k), cache_type(config.cache_type_v))
    memory = llm.new_cache(config.n_slots, config.n_ctx_slot, types)
    if isinstance(memory, HybridMemory):
        memory.limit_checkpoints(config.ctx_checkpoints)
    return memory


def new_pool(memory: SequenceMemory, prompt_cache: PromptCache, llm: LLM, config: EngineConfig) -> SlotPool:
    """The slots over `memory`; checkpoints (recurrent memory) pause prompts after end-of-turn tokens."""
    return SlotPool(
        memory,
        config.slot_similarity,
        prompt_cache,
        config.clear_idle_slots,
        llm.tokenizer.eog_ids,
        config.checkpoint_min_step,
    )


def can_shift(config: EngineConfig, memory: SequenceMemory) -> bool:
    """--context-shift where the memory can move cells; recurrent memory cannot (one line says so)."""
    if config.context_shift and not memory.can_shift:
        log.warning("context_shift_unsupported", detail="the model's recurrent memory cannot shift: off")
    return config.context_shift and memory.can_shift


def can_speculate(memory: SequenceMemory, drafter: DraftModel | None, llm: LLM) -> bool:
    """Speculative decoding rolls rejected drafts back: a recurrent memory cannot, so a draft model is
    refused at start and requests' n-gram speculation is off (logged once)."""
    if memory.can_shift or memory.whole_inputs:  # an encoder never generates
        return True
    if drafter is not None:
        raise ValueError(
            f"speculative decoding is not supported on {llm.model.hp.arch}: its recurrent layers "
            "cannot roll back rejected drafts (start without the draft model)"
        )
    log.info("speculative_off", detail="the model's recurrent memory cannot roll back drafts")
    return False


def warm_up_batch(memory: SequenceMemory, bos: int) -> Batch:
    """Two tokens of slot 0; an encoder has no logits, so its warm-up asks for the hidden states."""
    encoder = memory.whole_inputs
    return Batch.of([BatchPart(0, 0, [bos] * 2, "none" if encoder else "last", want_hidden=encoder)])


class Engine:
    def __init__(self, llm: LLM, config: EngineConfig, draft: LLM | None = None) -> None:
        """`draft`: a draft model for `draft-simple` speculation (same vocabulary: checked by the caller)."""
        self.llm = llm
        self.config = config
        self.memory = new_memory(llm, config)
        self.prompt_cache = PromptCache(mib_to_bytes(config.cache_ram_mib))
        self.pool = new_pool(self.memory, self.prompt_cache, llm, config)
        shift = functools.partial(llm.model.shift_kv, self.memory) if can_shift(config, self.memory) else None
        drafter = DraftModel(draft, config.n_slots, self.memory.n_ctx) if draft is not None else None
        self.scheduler = Scheduler(
            self.pool,
            llm.tokenizer,
            config.n_ubatch,
            shift,
            config.n_keep,
            speculation(drafter) if can_speculate(self.memory, drafter, llm) else Speculation({}),
            llm.model.pooler,
            unified_cells=config.n_ctx if config.kv_unified else 0,
        )
        self.identity = ModelIdentity.of(self.memory, llm.tokenizer.n_vocab, llm.path.name)
        self.snapshot = EngineSnapshot(self.pool.snapshot())  # replaced whole by the engine thread
        self._cond = threading.Condition()
        self._commands: list[Callable[[], None]] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._ids = itertools.count()
        # Forward passes run, the tokens they processed, the busy slots at each (summed).
        self._n_steps = self._n_tokens = self._n_busy_slot_steps = 0
        self.threads = tuner_for(config.n_threads, config.adaptive_threads, llm.backend.name)

    @property
    def n_ctx_slot(self) -> int:
        return self.memory.n_ctx

    # -- thread-safe public surface ----------------------------------------------------------------
    def start(self, warm_up: bool = True) -> None:
        """Start the engine thread; returns once it is ready for requests (kernels compiled or loaded). The
        warm-up runs on the engine thread itself: OpenMP gives every thread that enters a parallel region its
        own worker team, and with two teams on two cores libgomp throttles its spin (4.7 -> 12 ms a step)."""
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
        self, request: GenerationRequest | EmbeddingRequest, loop: asyncio.AbstractEventLoop | None = None
    ) -> RequestHandle:
        if not request.request_id:
            request = replace(request, request_id=f"req-{next(self._ids)}")
        handle = RequestHandle(request.request_id, loop or asyncio.get_running_loop(), self.cancel)
        self._command(lambda: self.scheduler.waiting.append((request, handle.push)))
        return handle

    def submit_choices(
        self, requests: list[GenerationRequest], loop: asyncio.AbstractEventLoop | None = None
    ) -> list[RequestHandle]:
        """`n` choices of one prompt (engine/choices.py): the first request's prompt is evaluated once
        and its cells copied to the others'. One handle per request, in order."""
        leader_id = requests[0].request_id or f"req-{next(self._ids)}"
        requests = [
            replace(r, request_id=f"{leader_id}-{i}" if i else leader_id) for i, r in enumerate(requests)
        ]
        loop = loop or asyncio.get_running_loop()
        handles = [RequestHandle(r.request_id, loop, self.cancel) for r in requests]
        others = [(r, h.push) for r, h in zip(requests[1:], handles[1:], strict=True)]

        def enqueue() -> None:
            self.scheduler.choices.add(requests[0], others)
            self.scheduler.waiting.append((requests[0], handles[0].push))

        self._command(enqueue)
        return handles

    def cancel(self, request_id: str) -> None:
        self._command(lambda: self.scheduler.cancel(request_id))

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `fn` on the engine thread between two steps; the future holds its result or exception.
        A concurrent future: asyncio callers wrap it (`asyncio.wrap_future`) and never block the loop."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self._thread is None or not self._thread.is_alive():
            future.set_exception(EngineStopped("the engine is not running"))
            return future

        def run() -> None:
            # A caller that went away (its HTTP client left) cancelled the future: skip the call. Setting
            # a result on a cancelled future raises, and that used to end the engine thread.
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn()
            except Exception as exc:  # a failed call must reach its caller, not kill the thread
                future.set_exception(exc)
            else:
                future.set_result(result)

        self._command(run)
        return future

    def cached_prompts(self) -> concurrent.futures.Future[list[tuple[int, ...]]]:
        """The prompts whose cells the slots and the host prompt cache hold, read between two steps."""
        return self.call(self.scheduler.pool.cached_prompts)

    def control(self, request_id: str, action: str) -> concurrent.futures.Future[ControlResult]:
        """Act on a running or waiting request (CONTROL_ACTIONS) at the next step."""
        return self.call(lambda: self.scheduler.control(request_id, action))

    def slot_action(self, slot_id: int, action: str, path: Path | None) -> concurrent.futures.Future[dict]:
        """save/restore/erase a slot's cells (engine/memory/slot_files.py) at the next step."""
        memory, lora = self.memory, lora_context(self.llm.model)
        return self.call(lambda: slot_action(self.pool[slot_id], memory, self.identity, action, path, lora))

    # -- engine thread ------------------------------------------------------------------------------
    def _command(self, fn: Callable[[], None]) -> None:
        with self._cond:
            self._commands.append(fn)
            self._cond.notify()

    def _run(self, warm_up: bool, ready: threading.Event) -> None:
        try:
            if self.config.n_threads:
                numba.set_num_threads(min(self.config.n_threads, numba.config.NUMBA_NUM_THREADS))
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
                try:
                    fn()
                except Exception as exc:  # a failed command must not end the engine thread
                    log.exception("engine.command_failed", error=str(exc))
            if stopping:
                self.scheduler.cancel_all("cancelled")
                self._publish()
                return
            self._guarded_step()
            self._publish()

    def _guarded_step(self) -> None:
        """One step; an exception must not kill the engine thread and hang every client (end_failed)."""
        try:
            self._step()
        except Exception as exc:
            cause = exc.__cause__ or exc
            log.exception("engine.step_failed", error=str(cause), forward=isinstance(exc, ForwardFailed))
            end_failed(self.scheduler, f"{type(cause).__name__}: {cause}", isinstance(exc, ForwardFailed))

    def _step(self) -> None:
        """Admit, run one batch and advance its sequences. The snapshot is published before the forward pass
        too, so a client that holds a token of its request always finds the request's slot busy in /slots."""
        self.scheduler.admit()
        start = time.perf_counter()
        planned = self.scheduler.build_batch()
        self._publish()
        if planned is None:
            return
        batch, outputs = planned
        self._n_busy_slot_steps += len(self.pool.busy())  # before the step releases those it finishes
        try:
            if self._n_steps + 1 in self.config.fail_forward:
                self._n_steps += 1
                raise RuntimeError(f"injected failure of forward pass {self._n_steps} (LLAMBA_FAIL_FORWARD)")
            run = functools.partial(self.llm.model.run, batch, self.memory)
            out = run() if self.threads is None else self.threads.run(batch.n_tokens, run)
        except Exception as exc:
            raise ForwardFailed from exc
        self.scheduler.apply(out.logits, outputs, out.hidden)
        probe = self.threads is not None and self.threads.probing  # a step timing the count not chosen
        if len(batch.output_rows) == batch.n_tokens and not probe:  # what drafts cost: decode/draft steps
            self.scheduler.drafts.policy.costs.observe(batch.n_tokens, time.perf_counter() - start)
        self._n_steps += 1
        self._n_tokens += batch.n_tokens

    def _publish(self) -> None:
        counts = self._n_steps, self._n_tokens, self._n_busy_slot_steps
        self.snapshot = EngineSnapshot(self.pool.snapshot(), len(self.scheduler.waiting), *counts)

    def _warm_up(self) -> None:
        """Compile (or load from cache) every kernel with a tiny batch, so no request pays the JIT."""
        start = time.perf_counter()
        self.llm.model.forward(warm_up_batch(self.memory, self.llm.tokenizer.bos_id), self.memory)
        self.memory.clear(0)
        log.info("engine.warm", seconds=round(time.perf_counter() - start, 2))
