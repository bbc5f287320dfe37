"""llamba-bench's speculative tg tests: greedy generation through the engine, with or without drafts.

llama-bench has no such mode; the flags are llama-server's (--spec-type, --draft-max, --draft-min,
--spec-ngram-size-n, -md). Drafts need text to draft from, so each sequence gets a chat prompt
(llamba-bench-serve's workloads: `copy` asks to repeat a piece of code, `repeat` a piece of prose, `chat`
an ordinary question), rendered with the model's chat template. The prompts are run once untimed (cached
in their slots), then each repetition generates n tokens per sequence (ignore_eos) and is timed from
submission to the last token: the time is generation, prompt processing is one token per sequence. The
engine (its draft policy, its step-cost table) lives for the whole test, as in a server.

Tests that differ only in their speculation type (`--spec-type none,ngram-simple`) run interleaved, one
repetition of each in turn, on one engine (the type is a request setting): this VM's speed drifts by ±10%
over a minute (Gemma 3, 16 streams, no drafts: 268-322 t/s in six 2-repetition runs), so back-to-back
blocks of repetitions compared the machine's moods more than the speculators. One engine, not one per
test: a second engine thread is a second OpenMP master, and libgomp cuts every worker's spin-wait to
~100 iterations once it manages more threads than there are CPUs (Gemma 3 one stream: 82-87 t/s alone,
52-67 with an idle second engine beside it).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
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


@dataclass
class SpecRun:
    samples_ns: list[int] = field(default_factory=list)
    draft_n: int = 0  # draft tokens verified, per repetition (all sequences)
    draft_accepted: int = 0  # of those, accepted
    active_ts: list[float] = field(default_factory=list)  # per repetition: see all_active_rate


def all_active_rate(arrivals: list[list[int]]) -> float:
    """Tokens per second of all sequences together up to the moment the first one finished, from each
    sequence's token arrival times (ns since submission).

    With several sequences of n tokens each, drafts let some finish steps before the others, and the rest
    then decode in a smaller batch: the aggregate to the last token charges that tail to speculation
    (SmolLM2, 16 sequences copying code: the first done at 0.78 of the last's time). A server under load
    fills a freed slot with the next request, so its throughput is the rate while all are active. The
    tokens other sequences got in the step that finished the first arrive just after it and are left
    out: the figure reads ~0.7% low (without drafts, all finishing in one step, it is that much below
    the aggregate; 2026-12-03, both models).
    """
    first_done = min(times[-1] for times in arrivals)
    tokens = sum(sum(1 for t in times if t <= first_done) for times in arrivals)
    return 1e9 * tokens / first_done


def prompts(llm: LLM, kind: str, n: int) -> list[list[int]]:
    """n distinct prompts of the workload, as chat turns in the model's template."""
    template = ChatTemplate.from_gguf_metadata(llm.gguf.metadata)
    texts = workload_prompts(kind, n)
    rendered = [template.render([{"role": "user", "content": t}], with_starts=False).text for t in texts]
    return [llm.tokenizer.encode(text, True, True) for text in rendered]


async def _generate(
    engine: Engine, prompts: list[list[int]], n: int, spec: SpecParams | None
) -> list[list[tuple[int, TokenEvent]]]:
    """Each sequence's events with their arrival times (ns since submission)."""
    start = time.perf_counter_ns()

    async def one(prompt: list[int]) -> list[tuple[int, TokenEvent]]:
        request = GenerationRequest(
            prompt, SamplingParams(temperature=0), n, ignore_eos=True, speculative=spec
        )
        return [(time.perf_counter_ns() - start, event) async for event in engine.submit(request)]

    return await asyncio.gather(*(one(p) for p in prompts))


class SpecTests:
    """The engine of speculative tests that share their workload, its prompts cached in their slots."""

    def __init__(self, llm: LLM, draft: LLM | None, insts: list[Instance], warmup: bool) -> None:
        first = insts[0]
        self.tokens = prompts(llm, first.spec_prompt, first.n_seqs)
        n_ctx = max(len(t) for t in self.tokens) + first.n_gen + 8
        config = EngineConfig(
            n_slots=first.n_seqs,
            n_ctx=first.n_seqs * n_ctx,
            n_ubatch=first.n_ubatch,
            cache_ram_mib=0,
            cache_type_k=first.type_k,
            cache_type_v=first.type_v,
            n_threads=first.n_threads,
        )
        drafted = any(inst.spec_type == "draft-simple" for inst in insts)
        self.engine = Engine(llm, config, draft=draft if drafted else None)
        self.engine.start(warm_up=False)  # the untimed prompt pass below compiles what is not cached
        asyncio.run(_generate(self.engine, self.tokens, 1, None))  # the prompts into their slots
        if warmup:
            for inst in insts:
                asyncio.run(_generate(self.engine, self.tokens, min(16, inst.n_gen), inst.spec))

    def repetition(self, inst: Instance, run: SpecRun) -> None:
        start = time.perf_counter_ns()
        events = asyncio.run(_generate(self.engine, self.tokens, inst.n_gen, inst.spec))
        run.samples_ns.append(time.perf_counter_ns() - start)
        run.active_ts.append(
            all_active_rate([[t for t, e in each if e.token is not None] for each in events])
        )
        finals = [each[-1][1].timings for each in events]
        run.draft_n += sum(t.draft_n for t in finals if t is not None)
        run.draft_accepted += sum(t.draft_n_accepted for t in finals if t is not None)


def run_interleaved(
    llm: LLM, draft: LLM | None, insts: list[Instance], reps: int, warmup: bool
) -> list[SpecRun]:
    """`reps` timed generations of n_gen tokens on each of n_seqs sequences, per test (the tests differ
    only in their speculation type), the tests taking turns; draft counts per repetition."""
    runs = [SpecRun() for _ in insts]
    tests = SpecTests(llm, draft, insts, warmup)
    try:
        for _ in range(reps):
            for inst, run in zip(insts, runs, strict=True):
                tests.repetition(inst, run)
    finally:
        tests.engine.stop()
    for run in runs:
        run.draft_n //= max(reps, 1)
        run.draft_accepted //= max(reps, 1)
    return runs
