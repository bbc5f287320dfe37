"""The slots: one memory sequence each, which tokens its memory holds, and prefix reuse.

A new request goes to the idle slot whose cells share the most of its prompt (or the least recently
used one), keeps that shared prefix, and processes only the rest. With a host prompt cache, the cells a
request would discard are saved there first, and a longer prefix found there is loaded back. This is
Llamba's block manager (nano-vllm's name): it decides which cells a sequence starts from.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from engine import slot_log
from engine.api import EmbeddingRequest, GenerationRequest, SlotProgress, SlotSnapshot
from engine.lora import shared_cells
from engine.media.chunks import cut_before_media
from engine.memory.base import SequenceMemory
from engine.memory.hybrid import DEFAULT_MIN_STEP, HybridMemory, checkpoint_positions
from engine.memory.prompt_cache import PromptCache, common_prefix

if TYPE_CHECKING:
    from engine.embedding import EmbeddingSequence
    from engine.sequence import Sequence

# A conversation's next turn discards at most a re-tokenized tail of the slot's cells; a request that
# discards more is another conversation (or an edit), so the slot's state goes to the host cache first.
# (A share-of-the-slot rule would never save conversations that share a long system prompt.)
SAVE_TAIL = 4
log = structlog.get_logger("engine")


@dataclass
class Slot:
    id: int
    tokens: list[int] = field(default_factory=list)  # what the slot's KV cells hold, position by position
    seq: Sequence | EmbeddingSequence | None = None
    last_used: float = 0.0
    id_task: int = -1
    params: Mapping[str, Any] = field(default_factory=dict)  # its last request's `slot_params`
    # its last request's prompt and generated text pieces (references, read by /slots' debug view)
    prompt: Sequence[int] = ()
    text: list[str] = field(default_factory=list)
    lora: tuple[tuple[int, float], ...] = ()  # the LoRA adapter set its cells were computed under
    lora_from: int = 0  # ... from this position on (an aLoRA's activation; the cells before: the base's)

    @property
    def busy(self) -> bool:
        return self.seq is not None


class SlotPool:
    def __init__(
        self,
        memory: SequenceMemory,
        slot_similarity: float,
        prompt_cache: PromptCache | None,
        clear_idle: bool = False,
        end_of_turn: frozenset[int] = frozenset(),
        checkpoint_min_step: int = DEFAULT_MIN_STEP,
    ) -> None:
        self.memory = memory
        self.end_of_turn = end_of_turn  # the tokenizer's end-of-generation ids: where messages end
        self.checkpoint_min_step = checkpoint_min_step
        self.slot_similarity = slot_similarity
        self.prompt_cache = prompt_cache if prompt_cache is not None and prompt_cache.enabled else None
        self.slots = [Slot(i) for i in range(memory.n_seq)]
        # Recurrent memory: where a prompt pauses for a checkpoint (engine/memory/hybrid.py), per slot.
        self.pauses: dict[int, list[int]] = {}
        # --kv-unified --cache-idle-slots (with a host cache): `claim` moves the idle slots there
        self.clear_idle = clear_idle and self.prompt_cache is not None
        if self.clear_idle:  # llama-server's debug line, which its own tests read
            log.debug("engine.cache_idle_slots", tag="__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")
        self._next_task = 0

    def __getitem__(self, slot_id: int) -> Slot:
        return self.slots[slot_id]

    def busy(self) -> list[Slot]:
        return [s for s in self.slots if s.busy]

    def snapshot(self) -> tuple[SlotSnapshot, ...]:
        n_ctx = self.memory.n_ctx
        return tuple(
            SlotSnapshot(
                s.id,
                s.id_task,
                n_ctx,
                s.busy,
                len(s.tokens),
                s.seq is not None and s.seq.drafting is not None,
                s.id_task >= 0,
                s.params,
                _progress(s.seq) if s.seq is not None else SlotProgress(),
                s.prompt,
                s.text,
            )
            for s in self.slots
        )

    def cached_prompts(self) -> list[tuple[int, ...]]:
        """Every token sequence whose cells a slot or the host prompt cache holds (on the engine thread)."""
        held = [tuple(s.tokens) for s in self.slots if s.tokens]
        return held + (self.prompt_cache.prompts() if self.prompt_cache is not None else [])

    def choose(self, request: GenerationRequest | EmbeddingRequest) -> Slot | None:
        """The slot for `request` (its pinned one, the most similar, or the least recently used)."""
        if request.id_slot >= 0:
            slot = self.slots[request.id_slot % len(self.slots)]  # llama-server wraps a slot id around
            if not slot.busy:
                slot_log.selected_by_id(slot)
            return None if slot.busy else slot
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        prompt = request.prompt_tokens

        def similarity(s: Slot) -> float:
            # cells computed under other adapters are no prefix of this request's
            return _reusable(s, request) / len(s.tokens) if s.tokens else 0.0

        best = max(idle, key=similarity)
        if request.cache_prompt and similarity(best) > self.slot_similarity:
            f_sim = common_prefix(best.tokens, prompt) / max(1, len(prompt))  # llama-server's f_sim_best
            slot_log.selected_by_similarity(best, f_sim, self.slot_similarity, similarity(best))
            return best
        lru = min(idle, key=lambda s: s.last_used)
        slot_log.selected_by_lru(lru)
        return lru

    def claim(self, slot: Slot, request: GenerationRequest | EmbeddingRequest) -> int:
        """Prepare `slot` for `request`: the prompt tokens whose cells it keeps (at least one is left)."""
        prompt, lora = request.prompt_tokens, _lora(request)
        reuse = _reusable(slot, request) if request.cache_prompt else 0
        if self.prompt_cache is not None:
            self._save_replaced(slot, reuse)
            if request.cache_prompt:
                log.debug("engine.prompt_cache", slot=slot.id, detail="updating prompt cache")
                reuse = self._load_cached(slot, prompt, reuse, lora)
        slot.lora, slot.lora_from = lora
        if self.clear_idle:
            self._clear_idle(slot)
        reuse = min(reuse, len(prompt) - 1)  # at least one token is evaluated, to produce logits
        reuse = cut_before_media(prompt, reuse)  # a medium's chunk is evaluated whole or not at all
        reuse = self.memory.truncate(slot.id, reuse)  # recurrent memory: its nearest checkpoint
        slot.tokens = prompt[:reuse]
        self.pauses[slot.id] = self._pauses(prompt, reuse, isinstance(request, GenerationRequest))
        slot.id_task, self._next_task = self._next_task, self._next_task + 1
        slot.params = request.slot_params if isinstance(request, GenerationRequest) else {}
        slot.prompt, slot.text = prompt, []
        return reuse

    def _pauses(self, prompt: list[int], start: int, completion: bool) -> list[int]:
        """Where the prompt's processing pauses for a checkpoint (completions on recurrent memory only)."""
        if not completion or not isinstance(self.memory, HybridMemory) or self.memory.max_checkpoints <= 0:
            return []
        return checkpoint_positions(prompt, start, self.end_of_turn, self.checkpoint_min_step)

    def prompt_room(self, slot_id: int, budget: int) -> int:
        """How many prompt tokens the slot may feed this step: the budget, up to its next pause."""
        held = len(self.slots[slot_id].tokens)
        ahead = [p for p in self.pauses.get(slot_id, []) if p > held]
        return min(budget, ahead[0] - held) if ahead else budget

    def paused(self, slot: Slot) -> None:
        """After a step: checkpoint the slot's memory if its prompt stopped at a pause."""
        pauses = self.pauses.get(slot.id, [])
        if len(slot.tokens) in pauses:
            self.memory.checkpoint(slot.id)
            pauses.remove(len(slot.tokens))

    def release(self, slot: Slot) -> None:
        slot.seq = None
        slot.last_used = time.perf_counter()

    def _clear_idle(self, claimed: Slot) -> None:
        """Every other idle slot's cells to the host cache, and the slot emptied (llama-server's
        --cache-idle-slots with a unified KV cache: the idle slots' room goes to the busy ones)."""
        assert self.prompt_cache is not None
        for slot in self.slots:
            held = min(len(slot.tokens), int(self.memory.lengths[slot.id]))
            if slot is claimed or slot.busy or held == 0:
                continue
            if self.prompt_cache.save(slot.tokens[:held], self.memory.read(slot.id, held), *_tag(slot)):
                # llama-server's debug line, its tests read it
                log.debug(
                    "engine.idle_slot_cached", slot=slot.id, n_tokens=held, tag="__TEST_TAG_CACHE_IDLE_SLOT__"
                )
            slot.tokens = []
            self.memory.clear(slot.id)

    def _save_replaced(self, slot: Slot, reuse: int) -> None:
        """Keep the slot's state in the host cache when this request discards more than a tail of it."""
        held = min(len(slot.tokens), int(self.memory.lengths[slot.id]))
        if held - reuse > SAVE_TAIL and self.prompt_cache is not None:
            self.prompt_cache.save(slot.tokens[:held], self.memory.read(slot.id, held), *_tag(slot))

    def _load_cached(
        self, slot: Slot, prompt: list[int], reuse: int, lora: tuple[tuple[tuple[int, float], ...], int]
    ) -> int:
        """Load the host cache's best prefix of `prompt` (computed as under LoRA set and position `lora`)
        into the slot if it beats the slot's own."""
        hit = self.prompt_cache.best(prompt, *lora) if self.prompt_cache is not None else None
        if hit is None:
            return reuse
        n = hit.entry.state.restorable(hit.n_keep)  # recurrent state: its whole length or a checkpoint
        if n <= reuse:
            return reuse
        self.memory.write(slot.id, hit.entry.state.prefix(n))
        slot.tokens = list(hit.entry.tokens[:n])
        return n


def _lora(request: GenerationRequest | EmbeddingRequest) -> tuple[tuple[tuple[int, float], ...], int]:
    """The LoRA adapter set a request's cells are computed under and the position it applies from (an
    embedding runs on the base)."""
    return (request.lora, request.lora_from) if isinstance(request, GenerationRequest) else ((), 0)


def _tag(slot: Slot) -> tuple[tuple[tuple[int, float], ...], int]:
    return slot.lora, slot.lora_from


def _reusable(slot: Slot, request: GenerationRequest | EmbeddingRequest) -> int:
    """How many of the slot's cells serve as `request`'s prefix: the common tokens computed alike."""
    alike = shared_cells(*_tag(slot), *_lora(request))
    return int(min(common_prefix(slot.tokens, request.prompt_tokens), alike))


def _progress(seq: Sequence | EmbeddingSequence) -> SlotProgress:
    """A running request's progress as llama-server counts it: prompt tokens evaluated so far (the
    chunk in this step's batch included, as llama-server counts at batch time), tokens generated."""
    n_prompt = len(seq.request.prompt_tokens)
    processed = n_prompt - seq.n_cached - (0 if seq.generating else len(seq.pending))
    n_decoded = getattr(seq, "n_generated", 0)  # an embedding generates none
    n_predict = getattr(seq.request, "n_predict", -1)
    n_remain = n_predict - n_decoded if n_predict >= 0 else -1
    new_line = getattr(seq, "has_new_line", False)
    return SlotProgress(processed, seq.n_cached, n_decoded, n_remain, True, new_line)
