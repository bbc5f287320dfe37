"""`n` choices in the engine (engine/choices.py): the prompt runs once, and each choice is bitwise the
request with its seed run alone. The routes' side is tests/test_choices_server.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from engine.api import GenerationRequest, TokenEvent
from engine.engine import Engine, EngineConfig
from engine.llm import LLM
from engine.sampling import SamplingParams


async def _tokens(handles: list) -> list[tuple[list[int], TokenEvent]]:
    async def one(handle) -> tuple[list[int], TokenEvent]:  # type: ignore[no-untyped-def]
        tokens = []
        async for event in handle:
            if event.token is not None:
                tokens.append(event.token)
            final = event
        return tokens, final

    return list(await asyncio.gather(*(one(h) for h in handles)))


def test_choices_share_one_prompt_evaluation(smollm2_llm: LLM) -> None:
    engine = Engine(smollm2_llm, EngineConfig(n_slots=4, n_ctx=2048, cache_ram_mib=0))
    engine.start(warm_up=False)
    prompt = smollm2_llm.tokenizer.encode("Once upon a time, in a land far away,", True, True)
    base = GenerationRequest(prompt, SamplingParams(temperature=1.0, seed=7), n_predict=12)
    seeded = [replace(base, sampling=replace(base.sampling, seed=7 + i)) for i in range(4)]
    try:

        async def run() -> tuple[list, list]:
            together = await _tokens(engine.submit_choices(seeded))
            # Read between two steps (the last step counts its tokens after emitting its events).
            steps_tokens = await asyncio.wrap_future(engine.call(lambda: engine._n_tokens))
            alone = [(await _tokens([engine.submit(replace(r, cache_prompt=False))]))[0] for r in seeded]
            return together, [steps_tokens, alone]

        together, (n_processed, alone) = asyncio.run(run())
    finally:
        engine.stop()
    assert [t for t, _ in together] == [t for t, _ in alone]  # bitwise the same picks as alone
    assert len({tuple(t) for t, _ in together}) > 1  # the seeds differ, so do the choices
    # The prompt ran once: its tokens, then each choice's fed picks (the last pick is never fed).
    assert n_processed == len(prompt) + sum(len(t) - 1 for t, _ in together)
    timings = [final.timings for _, final in together]
    assert timings[0].prompt_n == len(prompt) and timings[0].cache_n == 0
    assert all(t.prompt_n == 0 and t.cache_n == len(prompt) for t in timings[1:])


def test_cancelling_the_choices_frees_every_slot(smollm2_llm: LLM) -> None:
    engine = Engine(smollm2_llm, EngineConfig(n_slots=3, n_ctx=3072, cache_ram_mib=0))
    engine.start(warm_up=False)
    prompt = smollm2_llm.tokenizer.encode("word " * 600, True, True)  # two prompt chunks: time to cancel
    requests = [GenerationRequest(prompt, n_predict=8) for _ in range(3)]
    try:

        async def run() -> list[str | None]:
            handles = engine.submit_choices(requests)
            handles[0].cancel()  # the leader, before its prompt is in: the held choices end with it
            finals = await _tokens(handles)
            return [final.finish_reason for _, final in finals]

        reasons = asyncio.run(run())
        for _ in range(100):
            if not any(s.is_processing for s in engine.snapshot.slots):
                break
            time.sleep(0.02)
    finally:
        engine.stop()
    assert reasons == ["cancelled"] * 3
    assert not any(s.is_processing for s in engine.snapshot.slots)
    assert not engine.scheduler.choices.waiting
