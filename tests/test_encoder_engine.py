"""An encoder in the engine: `StatelessMemory` (engine/memory/stateless.py) and the scheduler's whole
inputs. Inputs from several slots share a step, each one whole (never split across steps), and each
answer is bitwise the model's answer for that input alone; a generation, or an input longer than one
batch, is refused with llama-server's words. On the synthetic bge-style reranker
(tests/synthetic_encoders.py; the vocabulary comes from llama.cpp's reference files)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import numpy as np
import pytest

from engine.api import EmbeddingRequest, GenerationRequest, TokenEvent
from engine.batch import Batch, BatchPart
from engine.engine import Engine, EngineConfig
from engine.llm import LLM
from engine.memory.base import MemoryState
from engine.memory.stateless import StatelessMemory
from engine.reference_data import ReferenceDataError
from engine.scheduler import NO_LOGITS
from server.model.prompts import rerank_layout
from tests.conftest import require
from tests.synthetic_encoders import vocabularies, write_encoder


def test_stateless_memory_holds_nothing() -> None:
    memory = StatelessMemory(2, 16)
    memory.check_batch(np.array([0, 0, 1]), np.array([0, 1, 0]))
    memory.commit(np.array([0, 0, 1]), np.array([0, 1, 0]))
    assert memory.lengths.tolist() == [0, 0] and memory.truncate(0, 5) == 0 and memory.n_bytes == 0
    assert memory.read(0, 0) == MemoryState(0) and not memory.can_shift
    with pytest.raises(ValueError, match="whole"):
        memory.check_batch(np.array([0, 0]), np.array([3, 4]))  # a continuation: nothing to continue
    with pytest.raises(ValueError, match="context"):
        memory.check_batch(np.array([0]), np.array([16]))
    with pytest.raises(ValueError):
        memory.write(0, MemoryState(3))


@pytest.fixture(scope="module")
def bge(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    try:
        vocab = vocabularies()
    except ReferenceDataError as exc:
        require(f"llama.cpp's reference files could not be fetched: {exc}")
    path = write_encoder("bge-reranker", tmp_path_factory.mktemp("bge") / "bge.gguf", vocab)
    return LLM.load(str(path))


async def final_events(engine: Engine, requests: list, start: bool = False) -> list[TokenEvent]:
    """Each request's last event; `start`: the engine starts once all are queued (its first step sees
    them all)."""
    handles = [engine.submit(r) for r in requests]
    if start:
        engine.start()

    async def last(handle) -> TokenEvent:  # type: ignore[no-untyped-def]
        async for event in handle:
            final = event
        return final

    return list(await asyncio.gather(*(last(h) for h in handles)))


def alone(llm: LLM, tokens: list[int]) -> np.ndarray:
    batch = Batch.of([BatchPart(0, 0, tokens, "none", want_hidden=True)])
    return llm.model.pooler(llm.model.run(batch, llm.new_cache(1, 512)).hidden, "mean")


def test_whole_inputs_share_steps_and_answer_as_alone(bge: LLM) -> None:
    engine = Engine(bge, EngineConfig(n_slots=3, n_ctx=3 * 128, n_ubatch=64, cache_ram_mib=0))
    texts = ["a short one", "word " * 40, "another input, of medium length " * 2, "word " * 30, "x"]
    prompts = [bge.tokenizer.encode(t, True, True) for t in texts]
    try:
        events = asyncio.run(final_events(engine, [EmbeddingRequest(p, "mean") for p in prompts], start=True))
    finally:
        engine.stop()
    n_steps = engine._n_steps  # read once the thread is joined: a step counts itself after its events
    for prompt, event in zip(prompts, events, strict=True):
        assert event.finish_reason == "stop" and event.n_prompt == len(prompt)
        assert np.array_equal(event.embedding, alone(bge, prompt))  # bitwise, whatever shared its step
    # 64 tokens a step, three slots, no input split: 5 + 42 + 14 tokens, then 32 + 3
    assert [len(p) for p in prompts] == [5, 42, 14, 32, 3] and n_steps == 2


def test_an_encoder_refuses_generations_and_oversized_inputs(bge: LLM) -> None:
    engine = Engine(bge, EngineConfig(n_slots=1, n_ctx=128, n_ubatch=16, cache_ram_mib=0))
    engine.start()
    tokens = bge.tokenizer.encode("hello", True, True)
    try:
        generation, too_long = asyncio.run(
            final_events(engine, [GenerationRequest(tokens, n_predict=4), EmbeddingRequest(tokens * 8)])
        )
    finally:
        engine.stop()
    assert (generation.finish_reason, generation.error) == ("error", NO_LOGITS)
    assert too_long.finish_reason == "error" and "too large to process" in str(too_long.error)
    assert "current batch size: 16" in str(too_long.error)


def test_slot_files_are_refused(bge: LLM, tmp_path: Path) -> None:
    engine = Engine(bge, EngineConfig(n_slots=1, n_ctx=128, cache_ram_mib=0))
    engine.start(warm_up=False)
    try:
        future = engine.slot_action(0, "save", tmp_path / "slot.bin")
        with pytest.raises(ValueError, match="no memory"):
            future.result(timeout=30)
    finally:
        engine.stop()


def test_rerank_layout_is_llama_servers(bge: LLM) -> None:
    """format_prompt_rerank: [CLS] query EOS document EOS with the synthetic file's flags (add_eos, EOS
    102, no add_sep); a vocabulary that adds SEP gets it after the query's EOS, and one without EOS (as
    llama.cpp reads real WordPiece files) has SEP stand in for it."""
    tok = copy.copy(bge.tokenizer)
    query, doc = tok.encode("what do cats eat?", False, False), tok.encode("meat", False, False)
    assert rerank_layout(tok, "what do cats eat?", "meat") == [101, *query, 102, *doc, 102]
    tok.add_sep = True
    assert rerank_layout(tok, "what do cats eat?", "meat") == [101, *query, 102, 102, *doc, 102]
    tok.eos_id, tok.add_sep = -1, False
    assert rerank_layout(tok, "what do cats eat?", "meat") == [101, *query, 102, *doc, 102]
    tok.add_eos = False
    assert rerank_layout(tok, "what do cats eat?", "meat") == [101, *query, *doc]
