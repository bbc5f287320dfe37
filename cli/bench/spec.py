"""llamba-bench's speculative tg tests: greedy generation through the engine, with or without drafts.

llama-bench has no such mode; the flags are llama-server's (--spec-type, --draft-max, --draft-min,
--spec-ngram-size-n, -md). Drafts need text to draft from, so each sequence gets a chat prompt
(llamba-bench-serve's workloads: `copy` asks to repeat a piece of code, `chat` an ordinary question),
rendered with the model's chat template. The prompts are run once untimed (cached in their slots), then
each repetition generates n tokens per sequence (ignore_eos) and is timed from submission to the last
token: the time is generation, prompt processing is one token per sequence. The engine (its draft policy,
its step-cost table) lives for the whole test, as in a server.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cli.bench.options import Instance
from cli.bench_serve import workload_prompts
from engine.api import GenerationRequest, TokenEvent
from engine.engine import Engine, EngineConfig
from engine.sampling import SamplingParams
from engine.speculative import SpecParams
from engine.text.chat import ChatTemplate

if TYPE_CHECKING:
    from engine.llm import LLM


@dataclass(frozen=True)
class SpecRun:
    samples_ns: list[int]
    draft_n: int  # draft tokens verified, per repetition (all sequences)
    draft_accepted: int  # of those, accepted


def prompts(llm: LLM, kind: str, n: int) -> list[list[int]]:
    """n distinct prompts of the workload, as chat turns in the model's template."""
    template = ChatTemplate.from_gguf_metadata(llm.gguf.metadata)
    texts = workload_prompts(kind, n)
    rendered = [template.render([{"role": "user", "content": t}], with_starts=False).text for t in texts]
    return [llm.tokenizer.encode(text, True, True) for text in rendered]


async def _generate(
    engine: Engine, prompts: list[list[int]], n: int, spec: SpecParams | None
) -> list[list[TokenEvent]]:
    async def one(prompt: list[int]) -> list[TokenEvent]:
        request = GenerationRequest(
            prompt, SamplingParams(temperature=0), n, ignore_eos=True, speculative=spec
        )
        return [event async for event in engine.submit(request)]

    return await asyncio.gather(*(one(p) for p in prompts))


def run_speculative(llm: LLM, draft: LLM | None, inst: Instance, reps: int, warmup: bool) -> SpecRun:
    """`reps` timed generations of inst.n_gen tokens on each of inst.n_seqs sequences."""
    tokens = prompts(llm, inst.spec_prompt, inst.n_seqs)
    n_ctx = max(len(t) for t in tokens) + inst.n_gen + 8
    config = EngineConfig(
        n_slots=inst.n_seqs,
        n_ctx=inst.n_seqs * n_ctx,
        n_ubatch=inst.n_ubatch,
        cache_ram_mib=0,
        cache_type_k=inst.type_k,
        cache_type_v=inst.type_v,
        n_threads=inst.n_threads,
    )
    engine = Engine(llm, config, draft=draft if inst.spec_type == "draft-simple" else None)
    engine.start(warm_up=False)  # the untimed prompt pass below compiles what is not cached
    spec = inst.spec
    try:
        asyncio.run(_generate(engine, tokens, 1, None))  # the prompts into their slots, untimed
        if warmup:
            asyncio.run(_generate(engine, tokens, min(16, inst.n_gen), spec))
        samples, drafted, accepted = [], 0, 0
        for _ in range(reps):
            start = time.perf_counter_ns()
            runs = asyncio.run(_generate(engine, tokens, inst.n_gen, spec))
            samples.append(time.perf_counter_ns() - start)
            finals = [events[-1].timings for events in runs]
            drafted += sum(t.draft_n for t in finals if t is not None)
            accepted += sum(t.draft_n_accepted for t in finals if t is not None)
    finally:
        engine.stop()
    return SpecRun(samples, drafted // reps, accepted // reps)
