"""Continuous batching: slots, admission with prefix reuse, and one mixed batch per step.

Each slot owns one sequence of the KV cache and remembers which tokens its cells hold, so a new
request that shares a prefix with them processes only the rest. Every step takes one decode token
from each generating sequence first, then fills the rest of the token budget with prompt chunks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.batch import Batch, BatchPart
from engine.context_shift import discard_count
from engine.kv import KVCache
from engine.prompt_cache import PromptCache
from engine.request import GenerationRequest, PromptProgress, Timings, TokenEvent
from engine.sampling import Sampler
from engine.text.reasoning import ControlResult, ReasoningState, Split
from engine.text.stop import StopMatcher
from engine.text.tokenizer import IncrementalDecoder, Tokenizer

Emit = Callable[[TokenEvent], None]
ShiftKV = Callable[[int, int, int, int], None]

# A conversation's next turn discards at most a re-tokenized tail of the slot's cells; a request that
# discards more is another conversation (or an edit), so the slot's state goes to the host cache first.
# (A share-of-the-slot rule would never save conversations that share a long system prompt.)
SAVE_TAIL = 4


@dataclass
class Sequence:
    request: GenerationRequest
    emit: Emit
    sampler: Sampler
    decoder: IncrementalDecoder
    stopper: StopMatcher
    pending: list[int] = field(
        default_factory=list
    )  # tokens to feed next: the prompt's rest, then the last pick
    n_cached: int = 0
    n_generated: int = 0
    t_start: float = field(default_factory=time.perf_counter)
    t_prompt_done: float = 0.0
    truncated: bool = False  # the prompt was cut or the context shifted
    reasoning: ReasoningState | None = None
    # Tokens to feed instead of sampling (a reasoning block's forced end), taken one per step.
    forced: deque[int] = field(default_factory=deque)

    @property
    def generating(self) -> bool:
        return self.t_prompt_done > 0


@dataclass
class Slot:
    id: int
    tokens: list[int] = field(default_factory=list)  # what the slot's KV cells hold, position by position
    seq: Sequence | None = None
    last_used: float = 0.0
    id_task: int = -1

    @property
    def busy(self) -> bool:
        return self.seq is not None


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


class Scheduler:
    def __init__(
        self,
        kv: KVCache,
        tokenizer: Tokenizer,
        n_ubatch: int,
        slot_similarity: float = 0.1,
        prompt_cache: PromptCache | None = None,
        shift_kv: ShiftKV | None = None,
        n_keep: int = 0,
    ) -> None:
        # Context shift (None: off): moves a sequence's cells (seq, start, end, delta) in every layer.
        self.shift_kv = shift_kv
        self.n_keep = n_keep
        self.kv = kv
        self.prompt_cache = prompt_cache if prompt_cache is not None and prompt_cache.enabled else None
        self.tokenizer = tokenizer
        self.n_ubatch = n_ubatch
        self.slot_similarity = slot_similarity
        self.slots = [Slot(i) for i in range(kv.n_seq)]
        self.waiting: deque[tuple[GenerationRequest, Emit]] = deque()
        self._prefilling: list[Slot] = []  # slots with a prompt chunk in the batch in flight
        self._next_task = 0
        self._end_on_start: set[str] = set()  # reasoning_end asked for before the request got a slot

    @property
    def n_ctx_slot(self) -> int:
        return self.kv.n_ctx

    def has_work(self) -> bool:
        return bool(self.waiting) or any(s.busy for s in self.slots)

    # -- admission -------------------------------------------------------------------------------
    def admit(self) -> None:
        """Move waiting requests into free slots, in arrival order (a pinned slot that is busy waits)."""
        still_waiting: deque[tuple[GenerationRequest, Emit]] = deque()
        while self.waiting:
            request, emit = self.waiting.popleft()
            slot = self._choose_slot(request)
            if slot is None:
                still_waiting.append((request, emit))
            else:
                self._start(slot, request, emit)
        self.waiting = still_waiting

    def _choose_slot(self, request: GenerationRequest) -> Slot | None:
        if request.id_slot >= 0:
            slot = self.slots[request.id_slot]
            return None if slot.busy else slot
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        prompt = request.prompt_tokens

        def similarity(s: Slot) -> float:
            return common_prefix(s.tokens, prompt) / len(s.tokens) if s.tokens else 0.0

        best = max(idle, key=similarity)
        if request.cache_prompt and similarity(best) > self.slot_similarity:
            return best
        return min(idle, key=lambda s: s.last_used)

    def _start(self, slot: Slot, request: GenerationRequest, emit: Emit) -> None:
        prompt = request.prompt_tokens
        reuse = common_prefix(slot.tokens, prompt) if request.cache_prompt else 0
        if self.prompt_cache is not None:
            self._save_replaced(slot, reuse)
            if request.cache_prompt:
                reuse = self._load_cached(slot, prompt, reuse)
        reuse = min(reuse, len(prompt) - 1)  # at least one token is evaluated, to produce logits
        self.kv.truncate(slot.id, reuse)
        slot.tokens = prompt[:reuse]
        sampler = Sampler(request.sampling, self.tokenizer.n_vocab)
        for token in prompt:
            sampler.accept(token)
        seq = slot.seq = Sequence(
            request,
            emit,
            sampler,
            IncrementalDecoder(self.tokenizer),
            StopMatcher(list(request.stop)),
            pending=prompt[reuse:],
            n_cached=reuse,
            reasoning=self._reasoning_state(request),
            truncated=request.truncated,
        )
        if request.request_id in self._end_on_start:
            self._end_on_start.discard(request.request_id)
            self._end_reasoning(seq)
        slot.id_task = self._next_task
        self._next_task += 1

    def _save_replaced(self, slot: Slot, reuse: int) -> None:
        """Keep the slot's state in the host cache when this request discards more than a tail of it."""
        held = min(len(slot.tokens), int(self.kv.lengths[slot.id]))
        if held - reuse > SAVE_TAIL and self.prompt_cache is not None:
            k, v = self.kv.read_cells(slot.id, held)
            self.prompt_cache.save(slot.tokens[:held], k, v)

    def _load_cached(self, slot: Slot, prompt: list[int], reuse: int) -> int:
        """Load the host cache's best prefix of `prompt` into the slot if it beats the slot's own."""
        hit = self.prompt_cache.best(prompt) if self.prompt_cache is not None else None
        if hit is None or hit.n_keep <= reuse:
            return reuse
        n = hit.n_keep
        self.kv.write_cells(slot.id, hit.entry.k[:, :, :n], hit.entry.v[:, :, :n])
        slot.tokens = list(hit.entry.tokens[:n])
        return n

    # -- one step ----------------------------------------------------------------------------------
    def build_batch(self) -> tuple[Batch, list[Slot]] | None:
        """The next batch and, in output-row order, the slots whose logits it returns."""
        active = [s for s in self.slots if s.busy]
        active.sort(key=lambda s: (not s.seq.generating, s.seq.t_start))  # type: ignore[union-attr]
        budget = self.n_ubatch
        parts, outputs = [], []
        self._prefilling = [s for s in active if not s.seq.generating]  # type: ignore[union-attr]
        for slot in active:
            seq = slot.seq
            assert seq is not None
            if budget <= 0:
                break
            chunk = seq.pending[:budget]
            budget -= len(chunk)
            seq.pending = seq.pending[len(chunk) :]
            parts.append(BatchPart(slot.id, len(slot.tokens), chunk, "none" if seq.pending else "last"))
            slot.tokens.extend(chunk)
            if not seq.pending:
                outputs.append(slot)
        if not parts:
            return None
        return Batch.of(parts), outputs

    def apply(self, logits: np.ndarray, outputs: list[Slot]) -> None:
        """Sample the next token of every slot that got logits, emit it, and finish what is done."""
        now = time.perf_counter()
        self._report_progress(now)
        for row, slot in zip(logits, outputs, strict=True):
            seq = slot.seq
            assert seq is not None
            if not seq.generating:
                seq.t_prompt_done = now
            self._advance(slot, seq, row)

    def _report_progress(self, now: float) -> None:
        """One progress event per prompt chunk just processed, for requests that asked for them."""
        for slot in self._prefilling:
            seq = slot.seq
            if seq is None or not seq.request.return_progress:
                continue
            total = len(seq.request.prompt_tokens)
            processed = total - len(seq.pending)
            progress = PromptProgress(total, seq.n_cached, processed, 1e3 * (now - seq.t_start))
            seq.emit(TokenEvent(text="", progress=progress, n_prompt=total, id_slot=slot.id))

    def _advance(self, slot: Slot, seq: Sequence, logits: np.ndarray) -> None:
        request = seq.request
        token, forced = self._next_token(seq, logits)
        seq.sampler.accept(token)
        seq.n_generated += 1
        n_probs = request.sampling.n_probs
        logprob = seq.sampler.token_logprob(logits, token) if n_probs else None
        top = tuple(seq.sampler.top_logprobs(logits, n_probs)) if n_probs else ()
        is_eog = token in self.tokenizer.eog_ids and not request.ignore_eos
        text, stop_word = ("", None) if is_eog else seq.stopper.push(seq.decoder.push(token))
        finish = None
        if is_eog or stop_word is not None:
            finish = "stop"
        elif self._out_of_budget(slot, seq):
            finish = "length"
        if finish and stop_word is None:
            text += seq.stopper.push(seq.decoder.flush())[0] + seq.stopper.flush()
        split = self._split(seq, text, forced, finish is not None)
        event = TokenEvent(
            text=split.content,
            reasoning_text=split.reasoning,
            token=token,
            logprob=logprob,
            top_logprobs=top,
            finish_reason=finish,
            stop_word=stop_word,
            timings=self._timings(seq) if finish or request.timings_per_token else None,
            n_prompt=len(request.prompt_tokens),
            n_generated=seq.n_generated,
            id_slot=slot.id,
            truncated=seq.truncated,
        )
        seq.emit(event)
        if finish:
            self._release(slot)
        else:
            seq.pending = [token]

    @staticmethod
    def _next_token(seq: Sequence, logits: np.ndarray) -> tuple[int, bool]:
        """The token to feed next and whether it was forced rather than sampled."""
        if seq.reasoning is not None and not seq.forced:
            seq.forced.extend(seq.reasoning.budget_tokens())
        if seq.forced:
            return seq.forced.popleft(), True
        return seq.sampler.sample(logits), False

    @staticmethod
    def _split(seq: Sequence, text: str, forced: bool, final: bool) -> Split:
        if seq.reasoning is None:
            return Split(content=text)
        split = seq.reasoning.push(text, forced)
        return split + seq.reasoning.flush() if final else split

    def _reasoning_state(self, request: GenerationRequest) -> ReasoningState | None:
        if request.reasoning is None:
            return None
        return ReasoningState(request.reasoning, lambda text: self.tokenizer.encode(text, False, True))

    def _out_of_budget(self, slot: Slot, seq: Sequence) -> bool:
        """Whether generation must stop for length; a full context is first shifted when that is on."""
        n_predict = seq.request.n_predict
        if 0 <= n_predict <= seq.n_generated:
            return True
        if len(slot.tokens) + 1 < self.n_ctx_slot:
            return False
        if self.shift_kv is None:
            return True
        self._shift_context(slot, seq)
        return False

    def _shift_context(self, slot: Slot, seq: Sequence) -> None:
        n_past = len(slot.tokens)
        n_keep = min(self.n_keep, n_past - 2)
        n_discard = discard_count(n_past, n_keep)
        assert self.shift_kv is not None
        self.shift_kv(slot.id, n_keep + n_discard, n_past, -n_discard)
        slot.tokens = slot.tokens[:n_keep] + slot.tokens[n_keep + n_discard :]
        self.kv.truncate(slot.id, len(slot.tokens))
        seq.truncated = True

    def _timings(self, seq: Sequence) -> Timings:
        now = time.perf_counter()
        prompt_n = len(seq.request.prompt_tokens) - seq.n_cached
        return Timings(
            cache_n=seq.n_cached,
            prompt_n=prompt_n,
            prompt_ms=1e3 * (seq.t_prompt_done - seq.t_start) if seq.t_prompt_done else 0.0,
            predicted_n=seq.n_generated,
            predicted_ms=1e3 * (now - seq.t_prompt_done) if seq.t_prompt_done else 0.0,
        )

    def _release(self, slot: Slot) -> None:
        slot.seq = None
        slot.last_used = time.perf_counter()

    # -- control ---------------------------------------------------------------------------------
    def control(self, request_id: str, action: str) -> ControlResult:
        """Act on a running request (only `reasoning_end` exists): its reasoning block ends next step."""
        if action != "reasoning_end":
            return ControlResult(False, f"unknown action {action!r}")
        for slot in self.slots:
            if slot.seq is not None and slot.seq.request.request_id == request_id:
                return self._end_reasoning(slot.seq)
        for request, _ in self.waiting:
            if request.request_id == request_id:
                return self._end_on_admission(request)
        return ControlResult(False, f"no running completion with id {request_id!r}")

    def _end_reasoning(self, seq: Sequence) -> ControlResult:
        if seq.reasoning is None:
            return ControlResult(False, "the completion was not started with reasoning_control")
        result, tokens = seq.reasoning.end_now()
        seq.forced.extend(tokens)
        return result

    def _end_on_admission(self, request: GenerationRequest) -> ControlResult:
        spec = request.reasoning
        if spec is None or not spec.controllable:
            return ControlResult(False, "the completion was not started with reasoning_control")
        if not spec.starts_open:
            return ControlResult(False, "the completion is not in a reasoning block")
        self._end_on_start.add(request.request_id)
        return ControlResult(True)

    # -- cancellation ----------------------------------------------------------------------------
    def cancel(self, request_id: str, reason: str = "cancelled") -> None:
        self._end_on_start.discard(request_id)
        for slot in self.slots:
            if slot.seq is not None and slot.seq.request.request_id == request_id:
                self._finish_early(slot.seq, reason, slot.id)
                self._release(slot)
        for item in [w for w in self.waiting if w[0].request_id == request_id]:
            self.waiting.remove(item)
            item[1](TokenEvent(text="", finish_reason=reason))

    def cancel_all(self, reason: str) -> None:
        for request, _ in list(self.waiting):
            self.cancel(request.request_id, reason)
        for slot in self.slots:
            if slot.seq is not None:
                self.cancel(slot.seq.request.request_id, reason)

    def _finish_early(self, seq: Sequence, reason: str, slot_id: int) -> None:
        seq.emit(TokenEvent(text="", finish_reason=reason, timings=self._timings(seq), id_slot=slot_id))
