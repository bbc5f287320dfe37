"""`n` choices (OpenAI's `n`, llama-server's `n_cmpl`) on the generation routes: the engine requests of
the choices, their outcomes (EngineClient.choice_events merges their events), and the whole request's
usage and timings.

As llama-server: choice i runs with seed + i (a random seed stays random), at most one choice per slot
(`-np`), and the prompt is evaluated once (the engine copies its cells to the other choices' slots), so
`timings.prompt_n` counts it once and choice i equals the request with seed + i run alone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.api import GenerationRequest, Timings, TokenEvent
from server.chat.generation import Outcome
from server.http import errors
from server.model.client import EngineClient
from server.model.host import ModelHost


def choice_requests(model: ModelHost, gen: GenerationRequest, n: int) -> list[GenerationRequest]:
    """The engine requests of n choices; 400 when the server has fewer slots than choices."""
    n_slots = model.n_slots
    if n > n_slots:
        raise errors.invalid_request(f"'n': at most {n_slots} choices (the server's slots, -np), got {n}")
    sampling = gen.sampling
    requests = [gen]
    for i in range(1, n):
        seed = sampling.seed if sampling.random_seed else (sampling.seed + i) % 2**32
        requests.append(replace(gen, sampling=replace(sampling, seed=seed), id_slot=-1))
    return requests


async def collect_choices(client: EngineClient, requests: list[GenerationRequest]) -> list[Outcome]:
    """Every choice's whole outcome (their events merged by EngineClient.choice_events)."""
    outcomes = [Outcome() for _ in requests]
    async for index, event in client.choice_events(requests):
        outcomes[index].add(event)
    return outcomes


def request_timings(finals: list[TokenEvent | None]) -> Timings | None:
    """The whole request's timings: the prompt's (evaluated once, by the first choice), every choice's
    generated tokens."""
    timings = [f.timings for f in finals if f is not None and f.timings is not None]
    if not timings:
        return None
    return replace(
        timings[0],
        predicted_n=sum(t.predicted_n for t in timings),
        predicted_ms=max(t.predicted_ms for t in timings),
        draft_n=sum(t.draft_n for t in timings),
        draft_n_accepted=sum(t.draft_n_accepted for t in timings),
    )


def choices_usage(n_prompt: int, finals: list[TokenEvent | None]) -> dict[str, Any]:
    timings = request_timings(finals)
    completion = timings.predicted_n if timings else 0
    return {
        "completion_tokens": completion,
        "prompt_tokens": n_prompt,
        "total_tokens": n_prompt + completion,
        "prompt_tokens_details": {"cached_tokens": timings.cache_n if timings else 0},
    }
