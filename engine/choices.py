"""`n` choices of one prompt (OpenAI's `n`, llama-server's `n_cmpl`): the prompt is evaluated once.

The first choice (the leader) is admitted like any request, and only when there is an idle slot for
every other choice as well (llama-server defers such a task the same way). Those slots get held
sequences: in no batch, their prompt cells empty. When the leader's prompt is done, its cells are
copied to each held slot (`memory.copy`, through the host) and each choice samples its first
token from its own copy of the leader's last logits row; from there on they are independent sequences.
Since a sequence's outputs do not depend on its batch, a choice is bitwise what the same request
(with its seed) gives alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from engine.api import GenerationRequest, TokenEvent
from engine.sampling import DryVocabulary
from engine.sequence import Emit, Sequence, start_sequence
from engine.slots import Slot, SlotPool
from engine.text.tokenizer import Tokenizer


@dataclass
class Choices:
    """The other choices of leaders not yet admitted, by leader request id, and their forking."""

    pool: SlotPool
    tokenizer: Tokenizer
    dry: DryVocabulary
    waiting: dict[str, list[tuple[GenerationRequest, Emit]]] = field(default_factory=dict)

    def add(self, leader: GenerationRequest, others: list[tuple[GenerationRequest, Emit]]) -> None:
        if others:
            self.waiting[leader.request_id] = others

    def room_for(self, request_id: str) -> bool:
        """Whether a leader's other choices find idle slots (beside the leader's own)."""
        others = self.waiting.get(request_id, [])
        return not others or sum(not s.busy for s in self.pool.slots) >= len(others) + 1

    def start(self, leader: Sequence) -> None:
        """Give each other choice of `leader` (just admitted) an idle slot, held until the prompt is in."""
        for request, emit in self.waiting.pop(leader.request.request_id, []):
            slot = min((s for s in self.pool.slots if not s.busy), key=lambda s: s.last_used)
            self.pool.claim(slot, replace(request, cache_prompt=False))  # empty: the cells come later
            n = len(request.prompt_tokens)
            slot.seq = start_sequence(request, emit, slot.id, self.tokenizer, n, self.dry)
            slot.seq.held = True
            leader.forks.append(slot.id)

    def release(self, leader_slot: Slot) -> list[Slot]:
        """The leader's prompt is in: copy its cells to its held choices; the slots now ready to sample."""
        seq = leader_slot.seq
        assert isinstance(seq, Sequence)
        ready = []
        for slot_id in seq.forks:
            slot = self.pool[slot_id]
            if not isinstance(slot.seq, Sequence) or not slot.seq.held:
                continue  # cancelled meanwhile
            n = len(leader_slot.tokens)
            self.pool.memory.copy(leader_slot.id, slot.id, n)
            slot.tokens = list(leader_slot.tokens)
            slot.lora, slot.lora_from = leader_slot.lora, leader_slot.lora_from
            slot.seq.held = False
            ready.append(slot)
        seq.forks = []
        return ready

    def drop_held(self, leader: Sequence, reason: str) -> list[Slot]:
        """A leader ended before its prompt was in: its held choices end too (their slots to release)."""
        dropped = []
        for slot_id in leader.forks:
            slot = self.pool[slot_id]
            if isinstance(slot.seq, Sequence) and slot.seq.held:
                slot.seq.emit(slot.seq.finished_early(reason))
                dropped.append(slot)
        leader.forks = []
        return dropped

    def cancel_waiting(self, request_id: str, reason: str) -> None:
        """Cancel a choice whose leader is not admitted yet (or every choice of a cancelled leader)."""
        for leader_id, others in list(self.waiting.items()):
            for item in [o for o in others if o[0].request_id == request_id or leader_id == request_id]:
                others.remove(item)
                item[1](TokenEvent(text="", finish_reason=reason))
            if not others:
                del self.waiting[leader_id]
