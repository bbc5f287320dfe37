"""What crosses the engine's public surface: a generation request in, token events out."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampling import SamplingParams
from engine.text.reasoning import ReasoningSpec


@dataclass(frozen=True)
class GenerationRequest:
    prompt_tokens: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1  # -1: until end of generation or the slot's context is full
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    id_slot: int = -1  # -1: the engine chooses
    cache_prompt: bool = True
    request_id: str = ""
    timings_per_token: bool = False  # timings on every event, not only the last
    return_progress: bool = False  # an event after every prompt chunk, with `progress`
    truncated: bool = False  # the prompt was cut to fit the context (context shift)
    reasoning: ReasoningSpec | None = None  # None: the text is left alone (no split, budget or control)


@dataclass(frozen=True)
class Timings:
    """llama-server's `timings` object."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_ms / self.predicted_n if self.predicted_n else 0.0,
            "predicted_per_second": 1e3 * self.predicted_n / self.predicted_ms if self.predicted_ms else 0.0,
        }


@dataclass(frozen=True)
class PromptProgress:
    """llama-server's `prompt_progress`: how much of the prompt is processed."""

    total: int
    cache: int
    processed: int
    time_ms: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "total": self.total,
            "cache": self.cache,
            "processed": self.processed,
            "time_ms": self.time_ms,
        }


@dataclass(frozen=True)
class TokenEvent:
    """One generated token (token is None on a final event that carries no new token)."""

    text: str  # text now safe to emit (UTF-8 complete, not part of a possible stop string); may be ""
    reasoning_text: str = ""  # the same, for text inside a reasoning block (`text` is then the answer)
    token: int | None = None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    stop_word: str | None = None
    timings: Timings | None = None
    n_prompt: int = 0
    n_generated: int = 0
    id_slot: int = -1
    error: str | None = None
    progress: PromptProgress | None = None  # set on prompt-progress events (no token, no text)
    truncated: bool = False  # on the final event: the context was shifted or the prompt cut
