"""Media chunks in the engine (engine/media/chunks.py) on the real Gemma 3 270M: an image's embeddings
enter at its marker positions unscaled, its tokens attend to each other both ways (Gemma 3's images, as
mtmd decodes them), a chunk is never split across steps, and the answer does not depend on what shared
the step or on whether the prefix came from the cache. The embeddings are random rows standing in for
a projector's output (the projector itself: tests/test_media_projector.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from engine.api import GenerationRequest, TokenEvent
from engine.batch import Batch, BatchPart
from engine.engine import Engine, EngineConfig
from engine.llm import LLM
from engine.media.chunks import MediaChunk, cut_before_media, marker_of, part_media
from engine.sampling import SamplingParams

N_IMAGE = 16


def image_chunk(llm: LLM, seed: int) -> MediaChunk:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((N_IMAGE, llm.model.hp.n_embd)).astype(np.float32)
    return MediaChunk(marker_of(f"image {seed}".encode()), rows, non_causal=True)


def prompt_with(llm: LLM, chunk: MediaChunk, question: str) -> list[int]:
    tok = llm.tokenizer
    before = tok.encode("<start_of_turn>user\n<start_of_image>", True, True)
    after = tok.encode(f"<end_of_image>{question}<end_of_turn>\n<start_of_turn>model\n", False, True)
    return before + [chunk.marker] * chunk.n_tokens + after


def last_logits(llm: LLM, parts: list[BatchPart], n_seq: int) -> np.ndarray:
    return llm.model.forward(Batch.of(parts), llm.new_cache(n_seq, 256))


def test_cut_before_media_and_part_media() -> None:
    a = MediaChunk(-5, np.arange(6, dtype=np.float32).reshape(3, 2), non_causal=True)
    tokens = [1, 2, -5, -5, -5, 7]
    assert [cut_before_media(tokens, n) for n in range(7)] == [0, 1, 2, 2, 2, 5, 6]
    media = part_media(tokens, 10, {-5: a})
    assert media is not None and media.rows.tolist() == [2, 3, 4]
    np.testing.assert_array_equal(media.embeddings, a.embeddings)
    assert media.limits.tolist() == [10, 11, 14, 14, 14, 15]
    assert part_media([1, 2], 0, {}) is None
    # a causal chunk may be cut anywhere, and a part that continues it takes the rows that follow
    b = MediaChunk(-6, np.arange(8, dtype=np.float32).reshape(4, 2))
    assert cut_before_media([1, -6, -6, -6, -6, 2], 3, {-6: b}) == 3
    assert cut_before_media(tokens, 3, {-5: a}) == 2
    rest = part_media([-6, -6, 2], 3, {-6: b}, before=[1, -6, -6])
    assert rest is not None and rest.rows.tolist() == [0, 1]
    np.testing.assert_array_equal(rest.embeddings, b.embeddings[2:])
    assert rest.limits.tolist() == [3, 4, 5]
    assert marker_of(b"x") == marker_of(b"x") < 0 and marker_of(b"x") != marker_of(b"y")


def test_an_image_chunk_is_non_causal(gemma3_llm: LLM) -> None:
    """When only the image's last row changes, its first row's state changes too (with causal attention
    it could not), and the text before the image does not."""
    chunk = image_chunk(gemma3_llm, 0)
    prompt = prompt_with(gemma3_llm, chunk, "What is it?")
    start = prompt.index(chunk.marker)
    image_rows = slice(start, start + N_IMAGE)

    def hidden_of(rows: np.ndarray) -> np.ndarray:
        c = MediaChunk(chunk.marker, rows, non_causal=True)
        part = BatchPart(0, 0, prompt, "none", want_hidden=True, media=part_media(prompt, 0, {c.marker: c}))
        return gemma3_llm.model.run(Batch.of([part]), gemma3_llm.new_cache(1, 256)).hidden

    base = hidden_of(chunk.embeddings)
    late = chunk.embeddings.copy()
    late[-1] += 1.0
    moved = hidden_of(late)
    first_image_row = image_rows.start
    assert not np.array_equal(base[first_image_row], moved[first_image_row])  # non-causal: row 0 saw it
    assert np.array_equal(base[:first_image_row], moved[:first_image_row])  # the text before did not


def test_media_rows_are_bitwise_the_same_whatever_shares_the_step(gemma3_llm: LLM) -> None:
    chunk = image_chunk(gemma3_llm, 1)
    prompt = prompt_with(gemma3_llm, chunk, "Describe the image.")
    other = gemma3_llm.tokenizer.encode("Hello there, how are you today?", True, True)
    media = {chunk.marker: chunk}
    alone = last_logits(gemma3_llm, [BatchPart(0, 0, prompt, media=part_media(prompt, 0, media))], 1)
    mixed = last_logits(
        gemma3_llm,
        [BatchPart(0, 0, other), BatchPart(1, 0, prompt, media=part_media(prompt, 0, media))],
        2,
    )
    np.testing.assert_array_equal(alone[0], mixed[1])


async def _answers(engine: Engine, requests: list[GenerationRequest]) -> list[list[TokenEvent]]:
    async def run(request: GenerationRequest) -> list[TokenEvent]:
        return [event async for event in engine.submit(request)]

    return list(await asyncio.gather(*(run(r) for r in requests)))


@pytest.fixture(scope="module")
def engine(gemma3_llm: LLM):  # type: ignore[no-untyped-def]
    # n_ubatch 24: the 16-row image never fits a step beside much else, so it waits for room, whole
    engine = Engine(gemma3_llm, EngineConfig(n_slots=2, n_ctx=2 * 256, n_ubatch=24, cache_ram_mib=0))
    engine.start(warm_up=False)
    yield engine
    engine.stop()


def test_the_engine_answers_an_image_prompt_as_alone_and_reuses_its_prefix(
    engine: Engine, gemma3_llm: LLM
) -> None:
    chunk = image_chunk(gemma3_llm, 2)
    prompt = prompt_with(gemma3_llm, chunk, "What colour is it?")
    greedy = SamplingParams(temperature=0.0)
    ask = GenerationRequest(prompt, greedy, n_predict=6, media={chunk.marker: chunk}, id_slot=0)
    text_only = GenerationRequest(gemma3_llm.tokenizer.encode("Count: one, two,", True, True), n_predict=6)
    (first, _) = asyncio.run(_answers(engine, [ask, text_only]))
    (again,) = asyncio.run(_answers(engine, [ask]))
    assert [e.token for e in first] == [e.token for e in again]
    assert first[-1].timings is not None and again[-1].timings is not None
    assert first[-1].timings.cache_n == 0
    # the whole image and the text before the last token come from the cache
    assert again[-1].timings.cache_n == len(prompt) - 1 and again[-1].timings.prompt_n == 1


def test_a_causal_chunk_fed_in_pieces_answers_as_in_one_step(gemma3_llm: LLM) -> None:
    """A causal medium (llava's images, audio) is split across steps as mtmd splits it into batches; each
    piece continues the chunk's rows: the greedy answer is the one-step answer."""
    rows = np.random.default_rng(3).standard_normal((N_IMAGE, gemma3_llm.model.hp.n_embd)).astype(np.float32)
    chunk = MediaChunk(marker_of(b"causal"), rows, non_causal=False)
    prompt = prompt_with(gemma3_llm, chunk, "And this?")
    greedy = SamplingParams(temperature=0.0)
    ask = GenerationRequest(prompt, greedy, n_predict=4, media={chunk.marker: chunk}, cache_prompt=False)
    whole = Engine(gemma3_llm, EngineConfig(n_slots=1, n_ctx=256, n_ubatch=64, cache_ram_mib=0))
    pieces = Engine(gemma3_llm, EngineConfig(n_slots=1, n_ctx=256, n_ubatch=6, cache_ram_mib=0))
    answers = []
    for engine in (whole, pieces):
        engine.start(warm_up=False)
        try:
            (events,) = asyncio.run(_answers(engine, [ask]))
        finally:
            engine.stop()
        answers.append([e.token for e in events])
        assert events[-1].timings is not None and events[-1].timings.prompt_n == len(prompt)
    assert answers[0] == answers[1]
