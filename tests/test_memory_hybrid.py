"""The hybrid memory (KV cells + recurrent state + checkpoints) on its own, and the slot pool over it:
truncation restores the nearest checkpoint, the prompt cache and `n` choices carry recurrent state,
prompts pause where a checkpoint is worth having. The model that fills it is tests/test_qwen35.py's."""

from __future__ import annotations

import numpy as np
import pytest

from engine.api import GenerationRequest
from engine.backend import cpu_backend
from engine.memory.base import MemoryState
from engine.memory.hybrid import END_OFFSET, HybridMemory, checkpoint_positions
from engine.memory.kv import KVCache
from engine.memory.prompt_cache import PromptCache
from engine.memory.recurrent import RecurrentCache, RecurrentShape
from engine.sampling import SamplingParams
from engine.slots import SlotPool

EOT = 99
SHAPE = RecurrentShape(conv=(3, 8), ssm=(2, 4, 4))


def memory(n_seq: int = 2, n_ctx: int = 64, max_checkpoints: int = 32) -> HybridMemory:
    be = cpu_backend()
    return HybridMemory(
        KVCache(1, n_seq, n_ctx, 1, 32, be), RecurrentCache(3, n_seq, n_ctx, SHAPE, be), max_checkpoints
    )


def feed(mem: HybridMemory, seq: int, n: int) -> None:
    """n more tokens into `seq`: its state becomes a function of its length (what a model would do)."""
    start = int(mem.lengths[seq])
    positions = np.arange(start, start + n, dtype=np.int32)
    seq_ids = np.full(n, seq, dtype=np.int32)
    mem.check_batch(seq_ids, positions)
    mem.recurrent.conv[:, seq] = start + n
    mem.recurrent.ssm[:, seq] = -(start + n)
    for p in positions:
        mem.kv.k[:, seq, :, p] = p
    mem.commit(seq_ids, positions)


def state_length(mem: HybridMemory, seq: int) -> int:
    """Which length the recurrent state was left at by `feed` (its fingerprint)."""
    return int(mem.recurrent.conv[0, seq, 0, 0])


def test_truncate_restores_the_nearest_checkpoint_at_or_below() -> None:
    mem = memory()
    for n in (5, 5, 5):
        feed(mem, 0, n)
        mem.checkpoint(0)  # at 5, 10, 15
    feed(mem, 0, 5)
    assert mem.truncate(0, 20) == 20 and state_length(mem, 0) == 20  # covers the state: nothing to do
    assert mem.truncate(0, 13) == 10
    assert state_length(mem, 0) == 10 and int(mem.lengths[0]) == 10 and int(mem.kv.lengths[0]) == 10
    assert [c.n_tokens for c in mem.checkpoints[0].states] == [5, 10]  # 15 belonged to other tokens
    assert mem.truncate(0, 4) == 0 and state_length(mem, 0) == 0 and not mem.checkpoints[0].states


def test_a_batch_must_continue_the_state_exactly() -> None:
    mem = memory()
    feed(mem, 0, 4)
    with pytest.raises(ValueError, match="do not continue"):
        mem.check_batch(np.array([0], np.int32), np.array([3], np.int32))  # taken twice
    with pytest.raises(ValueError):
        mem.check_batch(np.array([0], np.int32), np.array([5], np.int32))  # a gap


def test_checkpoints_are_bounded_oldest_first() -> None:
    mem = memory(max_checkpoints=2)
    for _ in range(4):
        feed(mem, 0, 3)
        mem.checkpoint(0)
    assert [c.n_tokens for c in mem.checkpoints[0].states] == [9, 12]
    mem.limit_checkpoints(0)
    feed(mem, 1, 3)
    mem.checkpoint(1)
    assert mem.checkpoints[1].states == []


def test_read_write_carry_state_and_checkpoints_and_prefix_cuts_at_one() -> None:
    mem = memory()
    feed(mem, 0, 6)
    mem.checkpoint(0)
    feed(mem, 0, 4)
    state = mem.read(0, 10)
    assert state.recurrent and [c.n_tokens for c in state.checkpoints] == [6]
    assert state.restorable(10) == 10 and state.restorable(9) == 6 and state.restorable(5) == 0
    mem.write(1, state.prefix(6))
    assert state_length(mem, 1) == 6 and int(mem.lengths[1]) == 6
    np.testing.assert_array_equal(mem.kv.read_cells(1, 6)[0], mem.kv.read_cells(0, 6)[0])
    mem.copy(0, 1, 10)
    assert state_length(mem, 1) == 10 and [c.n_tokens for c in mem.checkpoints[1].states] == [6]
    with pytest.raises(ValueError):
        mem.read(0, 7)  # a recurrent state exists only at its length


def test_the_prompt_cache_hands_back_only_prefixes_it_can_restore() -> None:
    mem = memory()
    feed(mem, 0, 8)
    mem.checkpoint(0)
    feed(mem, 0, 8)
    tokens = list(range(16))
    cache = PromptCache(None)
    assert cache.save(tokens, mem.read(0, 16))
    hit = cache.best([*range(12), 77, 78])  # shares 12 tokens: the checkpoint at 8 is what it can give
    assert hit is not None and hit.entry.state.restorable(hit.n_keep) == 8
    assert not cache.save(tokens[:8], mem.read(0, 16).prefix(8))  # the entry gives these 8 already
    four = MemoryState(4, conv=np.zeros(1), ssm=np.zeros(1))
    assert cache.save(tokens[:4], four)  # the entry cannot give 4 tokens' state: kept beside it
    assert len(cache) == 2


def test_checkpoint_positions_follow_message_ends_and_the_prompt_end() -> None:
    prompt = [1, 2, EOT, 3, 4, 5, EOT, 6, 7, 8, EOT, 9, 10, 11, 12, 13]
    assert checkpoint_positions(prompt, 0, {EOT}, min_step=0) == [3, 7, 11, len(prompt) - END_OFFSET]
    # far apart only, the last message end always; nothing at or before where the slot starts
    assert checkpoint_positions(prompt, 0, {EOT}, min_step=5) == [3, 11, 12]
    assert checkpoint_positions(prompt, 7, {EOT}, min_step=0) == [11, 12]
    assert checkpoint_positions([1, 2, 3], 0, {EOT}) == []


def request(prompt: list[int], rid: str = "r") -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_tokens=prompt, sampling=SamplingParams(), n_predict=4)


def test_the_pool_pauses_prompts_for_checkpoints_and_restores_them() -> None:
    mem = memory(n_seq=1)
    pool = SlotPool(mem, 0.1, None, end_of_turn=frozenset({EOT}), checkpoint_min_step=0)
    first = [1, 2, 3, EOT, 5, 6, 7, EOT, 8, 9, 10, 11]
    slot = pool[0]
    assert pool.claim(slot, request(first)) == 0
    assert pool.pauses[0] == [4, 8]
    fed = []
    while len(slot.tokens) < len(first):  # what the scheduler does: chunks end at the pauses
        n = min(pool.prompt_room(0, 512), len(first) - len(slot.tokens))
        feed(mem, 0, n)
        slot.tokens.extend(first[len(slot.tokens) : len(slot.tokens) + n])
        pool.paused(slot)
        fed.append(n)
    assert fed == [4, 4, 4]
    assert [c.n_tokens for c in mem.checkpoints[0].states] == [4, 8]
    # The next turn re-renders the end of the history: the slot goes back to the checkpoint at 8.
    second = [*first[:9], 42, 43, 44, 45, 46]
    assert pool.claim(slot, request(second, "r2")) == 8
    assert state_length(mem, 0) == 8 and slot.tokens == second[:8]
