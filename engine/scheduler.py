"""Continuous batching: admission in arrival order, and one mixed batch per step.

Every step takes one decode token from each generating sequence first, then fills the rest of the token
budget with prompt chunks. Which cells a request starts from is the slot pool's business
(engine/slots.py); what a sampled token means is the Sequence's (engine/sequence.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from engine import slot_log
from engine.api import ControlResult, EmbeddingRequest, GenerationRequest, Timings, TokenEvent
from engine.batch import Batch, BatchPart, WantLogits
from engine.choices import Choices
from engine.embedding import EmbeddingSequence, Pooler
from engine.grammar import prefetch_masks
from engine.media.chunks import PartMedia, part_media
from engine.memory.context_shift import discard_count, keep_count
from engine.sampling import DryVocabulary
from engine.sequence import Emit, Sequence, start_sequence
from engine.slots import Slot, SlotPool
from engine.speculative import Speculation
from engine.speculative.batching import StepDrafts
from engine.text.reasoning import end_before_start
from engine.text.tokenizer import Tokenizer

ShiftKV = Callable[[int, int, int, int], None]
Request = GenerationRequest | EmbeddingRequest
CONTEXT_EXCEEDED = "Context size has been exceeded."  # llama-server's words when its KV cache is full
# llama-server's words for a generation on a model without memory (an encoder), and for an encoder's input
# longer than one batch (it must be evaluated whole).
NO_LOGITS = "the current context does not support logits computation. skipping"
TOO_LARGE = (
    "input ({n} tokens) is too large to process. increase the physical batch size (current batch size: {b})"
)


def unified_overflow(
    pool: SlotPool, taken: list[tuple[Sequence | EmbeddingSequence, list[int]]], cells: int
) -> bool:
    """Whether the step would make the busy slots hold more than the unified cache's `cells`."""
    held = sum(len(slot.tokens) for slot in pool.busy())
    return held + sum(len(chunk) + len(seq.drafts) for seq, chunk in taken) > cells


class Scheduler:
    def __init__(
        self,
        pool: SlotPool,
        tokenizer: Tokenizer,
        n_ubatch: int,
        shift_kv: ShiftKV | None = None,
        n_keep: int = 0,
        speculation: Speculation | None = None,
        pooler: Pooler | None = None,
        unified_cells: int = 0,
    ) -> None:
        self.pool = pool
        self.pooler = pooler or Pooler()  # how embedding requests pool (the model's rerank classifier)
        self.whole_inputs = pool.memory.whole_inputs  # an encoder: inputs whole
        self.speculation = speculation
        self.drafts = StepDrafts(speculation, pool)  # the speculative part of each step
        self.tokenizer = tokenizer
        self.dry = DryVocabulary(tokenizer)  # DRY's breaker tables, built on first use, kept per set
        self.choices = Choices(pool, tokenizer, self.dry)  # `n` choices waiting for their leader
        self.n_ubatch = n_ubatch
        self.shift_kv = shift_kv  # context shift (None: off): cells (seq, start, end, delta) moved
        self.n_keep = n_keep  # a request's n_keep when it has none (--keep; -1: all its prompt)
        self.unified_cells = unified_cells  # > 0: the busy slots' cells together (--kv-unified)
        self.waiting: deque[tuple[Request, Emit]] = deque()
        self._prefilling: list[Sequence | EmbeddingSequence] = []  # with a prompt chunk in the batch
        self._embedding: list[tuple[Slot, int]] = []  # embedding sequences in the batch, chunk sizes
        self._end_on_start: set[str] = set()  # reasoning_end asked for before the request got a slot

    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.pool.busy())

    def admit(self) -> None:
        """Move waiting requests into free slots, in arrival order (a pinned slot that is busy waits)."""
        still_waiting: deque[tuple[Request, Emit]] = deque()
        for request, emit in self.waiting:
            if self.whole_inputs and encoder_refused(request, emit, self.n_ubatch):
                continue
            slot = self.pool.choose(request)
            if slot is None or not self.choices.room_for(request.request_id):
                still_waiting.append((request, emit))
                continue
            reuse = self.pool.claim(slot, request)
            n_keep = _keep_asked(request, self.n_keep)
            slot_log.launched(slot, self.pool.memory.n_ctx, n_keep, len(request.prompt_tokens), reuse)
            if isinstance(request, EmbeddingRequest):
                slot.seq = EmbeddingSequence.start(request, emit, slot.id, self.pooler, self.whole_inputs)
                continue
            slot.seq = start_sequence(request, emit, slot.id, self.tokenizer, reuse, self.dry)
            slot.text = slot.seq.text_pieces
            if request.return_progress:  # llama-server's 0% update: the request has started
                slot.seq.emit(slot.seq.progress())
            if request.request_id in self._end_on_start:
                self._end_on_start.discard(request.request_id)
                slot.seq.end_reasoning()
            self.choices.start(slot.seq)
        self.waiting = still_waiting

    # -- one step ----------------------------------------------------------------------------------
    def build_batch(self) -> tuple[Batch, list[Slot]] | None:
        """The next batch and, in output-row order, the slots whose logits it returns: decode tokens
        first, then prompt chunks, then the drafts worth verifying in what budget is left."""
        active = [s.seq for s in self.pool.busy() if s.seq is not None and not s.seq.held]
        active.sort(key=lambda seq: (not seq.generating, seq.t_start))
        budget, taken = self.n_ubatch, []
        for seq in active:
            if budget <= 0:
                break
            chunk = seq.take(budget if seq.generating else self.pool.prompt_room(seq.slot_id, budget))
            if chunk or seq.generating:  # an encoder's input, or a medium, waits for room for all of it
                budget -= len(chunk)
                taken.append((seq, chunk))
        self._prefilling = [seq for seq, _ in taken if not seq.generating]
        self._embedding, parts, outputs = [], [], []
        self.drafts.add(taken, budget)
        if self.unified_cells and unified_overflow(self.pool, taken, self.unified_cells):
            for slot in self.pool.busy():  # as llama-server: the whole pool fails, nothing was written
                if slot.seq is not None:
                    self.cancel(slot.seq.request.request_id, "error", CONTEXT_EXCEEDED)
            return None
        n_batch = 0  # the batch's tokens so far (llama-server's batch.n_tokens in its prompt lines)
        for seq, chunk in taken:
            slot = self.pool[seq.slot_id]
            n_batch += len(chunk) + len(seq.drafts)  # an embedding's drafts: none
            media = part_media(chunk, len(slot.tokens), seq.request.media, slot.tokens)  # None: no media
            if isinstance(seq, EmbeddingSequence):  # every hidden row wanted, no logits
                parts.append(BatchPart(slot.id, len(slot.tokens), chunk, "none", True, media))
                slot.tokens.extend(chunk)
                self._embedding.append((slot, len(chunk)))
                slot_log.prompt_chunk(slot, seq, n_batch)
                continue
            want = "all" if seq.drafts else ("none" if seq.pending else "last")
            parts.append(_generation_part(slot, seq, chunk, want, media))
            slot.tokens.extend(chunk + seq.drafts)
            if not seq.generating:
                slot_log.prompt_chunk(slot, seq, n_batch)
            if not seq.pending:
                outputs.append(slot)
        return (Batch.of(parts), outputs) if parts else None

    def apply(self, logits: np.ndarray, outputs: list[Slot], hidden: np.ndarray | None = None) -> None:
        """Advance every sequence that got logits; release the finished, shift the full. `hidden`: the
        batch's hidden rows, for its embedding sequences."""
        for seq in self._prefilling:
            self.pool.paused(self.pool[seq.slot_id])  # a checkpoint where its prompt paused for one
            if seq.request.return_progress and isinstance(seq, Sequence):
                seq.emit(seq.progress())
        self._apply_hidden(hidden)
        row = 0
        for slot in outputs:
            seq = slot.seq
            assert isinstance(seq, Sequence)
            rows, row = logits[row : row + 1 + len(seq.drafts)], row + 1 + len(seq.drafts)
            if seq.forks:  # its `n` choices start from copies of its prompt cells and logits
                for fork in self.choices.release(slot):
                    self._advance(fork, rows.copy())
            self._advance(slot, rows)
        # The next masks are computed on a worker thread while the next batch runs (GIL released).
        prefetch_masks(s.seq.grammar for s in outputs if s.seq is not None and s.seq.grammar is not None)

    def _advance(self, slot: Slot, rows: np.ndarray) -> None:
        seq = slot.seq
        assert isinstance(seq, Sequence)
        full = len(slot.tokens) + 1 >= self.pool.memory.n_ctx  # never with drafts: they leave room
        events = seq.verify(rows, room=not full or self.shift_kv is not None)
        self.drafts.settle(slot, seq)
        for event in events:
            if event.finish_reason is not None:  # what the next request may reuse (the last pick is not fed)
                event = replace(event, n_cells=len(slot.tokens))
            seq.emit(event)
        if events[-1].finish_reason is not None:
            self._finish(slot, seq.timings())
        elif full:
            self._shift_context(slot, seq)

    def _apply_hidden(self, hidden: np.ndarray | None) -> None:
        """Hand each embedding sequence its rows; answer and release those whose prompt is done."""
        start = 0
        for slot, n in self._embedding:
            assert isinstance(slot.seq, EmbeddingSequence) and hidden is not None
            event, start = slot.seq.add_rows(hidden[start : start + n]), start + n
            if event is not None:
                slot.seq.emit(event)
                self._finish(slot)

    def _finish(self, slot: Slot, timings: Timings | None = None) -> None:
        """Release the slot (`timings`: a generation that ended by itself, which logs them)."""
        if slot.seq is not None:
            self.drafts.forget(slot.seq.request.request_id)
            slot_log.finished(slot, slot.seq, timings)
        if isinstance(slot.seq, Sequence) and slot.seq.forks:
            for held in self.choices.drop_held(slot.seq, "cancelled"):
                self.pool.release(held)
        self.pool.release(slot)

    def _shift_context(self, slot: Slot, seq: Sequence) -> None:
        n_past = len(slot.tokens)
        n_keep = min(
            _shift_keep(seq.request, self.n_keep, self.tokenizer.add_bos, self.pool.memory.n_ctx), n_past - 2
        )
        n_discard = discard_count(n_past, n_keep, seq.request.n_discard)
        assert self.shift_kv is not None
        self.shift_kv(slot.id, n_keep + n_discard, n_past, -n_discard)
        _drop_cells(slot, n_keep, n_discard)
        self.pool.memory.truncate(slot.id, len(slot.tokens))
        seq.truncated = True

    # -- control and cancellation ----------------------------------------------------------------
    def control(self, request_id: str, action: str) -> ControlResult:
        """Act on a request (only `reasoning_end` exists): its reasoning block ends at the next step."""
        if action != "reasoning_end":
            return ControlResult(False, f"unknown action {action!r}")
        for slot in self.pool.busy():
            if isinstance(slot.seq, Sequence) and slot.seq.request.request_id == request_id:
                return slot.seq.end_reasoning()
        for request, _ in self.waiting:
            if isinstance(request, GenerationRequest) and request.request_id == request_id:
                result = end_before_start(request.reasoning)
                if result.success:
                    self._end_on_start.add(request_id)
                return result
        return ControlResult(False, f"no running completion with id {request_id!r}")

    def cancel(self, request_id: str, reason: str = "cancelled", error: str | None = None) -> None:
        self._end_on_start.discard(request_id)
        self.choices.cancel_waiting(request_id, reason)
        for slot in self.pool.busy():
            if slot.seq is not None and slot.seq.request.request_id == request_id:
                slot.seq.emit(slot.seq.finished_early(reason, error))
                self._finish(slot)
        for item in [w for w in self.waiting if w[0].request_id == request_id]:
            self.waiting.remove(item)
            item[1](TokenEvent(text="", finish_reason=reason, error=error))

    def cancel_all(self, reason: str, error: str | None = None) -> None:
        for request, _ in list(self.waiting):
            self.cancel(request.request_id, reason, error)
        for slot in self.pool.busy():
            if slot.seq is not None:
                self.cancel(slot.seq.request.request_id, reason, error)


def _drop_cells(slot: Slot, n_keep: int, n_discard: int) -> None:
    """A context shift's slot: its tokens after n_keep + n_discard moved to n_keep, and an aLoRA's
    activation with its cells (one among the discarded: to n_keep)."""
    slot.tokens = slot.tokens[:n_keep] + slot.tokens[n_keep + n_discard :]
    if slot.lora_from > n_keep:
        slot.lora_from = max(n_keep, slot.lora_from - n_discard)


def _generation_part(
    slot: Slot, seq: Sequence, chunk: list[int], want: WantLogits, media: PartMedia | None
) -> BatchPart:
    """A generating sequence's part of a step: its chunk and drafts, under its request's LoRA adapters
    from the slot's activation position on (an aLoRA's; a context shift moves it with the cells)."""
    tokens = chunk + seq.drafts
    return BatchPart(
        slot.id, len(slot.tokens), tokens, want, media=media, lora=slot.lora, lora_from=slot.lora_from
    )


def encoder_refused(request: Request, emit: Emit, n_ubatch: int) -> bool:
    """Whether an encoder (engine/memory/stateless.py: each input whole in one step) refuses `request`,
    answering it with llama-server's error: it has no logits to generate from, and an input must fit
    one batch."""
    error = None
    if isinstance(request, GenerationRequest):
        error = NO_LOGITS
    elif len(request.prompt_tokens) > n_ubatch:
        error = TOO_LARGE.format(n=len(request.prompt_tokens), b=n_ubatch)
    if error is not None:
        emit(TokenEvent(text="", finish_reason="error", error=error))
    return error is not None


def _keep_asked(request: Request, default: int) -> int:
    """The request's n_keep as it asked (llama-server's task param), else the engine's `default`."""
    asked = request.n_keep if isinstance(request, GenerationRequest) else None
    return default if asked is None else asked


def _shift_keep(request: GenerationRequest, default: int, add_bos: bool, n_ctx: int) -> int:
    """The tokens a context shift keeps, as llama-server counts them (engine/memory/context_shift.py)."""
    return keep_count(_keep_asked(request, default), len(request.prompt_tokens), add_bos, n_ctx)
