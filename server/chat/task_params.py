"""A request's parameters as llama-server reports them: its `task_params::to_json` in the short form it
writes for `/slots` (each slot's `params`) and `/props` (`default_generation_settings.params`): the
sampling, the limits and how the answer is read, under llama-server's names, types and order.

Dashboards written for llama-server read these keys, so each is present with llama-server's type, also
where Llamba has no such feature: `backend_sampling` (never), `generation_prompt` (not tracked: ""); `lora`
is the request's own list (else none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.api import SamplingParams

UINT32 = 0xFFFFFFFF  # llama.cpp keeps the seed as uint32: -1 (random) reads 4294967295


@dataclass(frozen=True)
class RunParams:
    """The non-sampling half of a task's parameters."""

    n_predict: int = -1
    n_keep: int = 0
    n_discard: int = 0
    ignore_eos: bool = False
    stream: bool = False
    timings_per_token: bool = False
    chat: bool = False  # a chat (its answer parsed per the template, "peg-native"), not raw text
    reasoning_format: str = "none"
    spec_types: tuple[str, ...] = ()  # empty: "none"


def task_params(sampling: SamplingParams, run: RunParams) -> dict[str, Any]:
    """llama-server's `task_params::to_json(only_metrics = true)`: what /slots and /props show."""
    p = sampling
    return {
        "seed": p.seed & UINT32,
        "temperature": p.temperature,
        "dynatemp_range": p.dynatemp_range,
        "dynatemp_exponent": p.dynatemp_exponent,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "top_n_sigma": p.top_n_sigma,
        "xtc_probability": p.xtc_probability,
        "xtc_threshold": p.xtc_threshold,
        "typical_p": p.typical_p,
        "repeat_last_n": p.repeat_last_n,
        "repeat_penalty": p.repeat_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "dry_multiplier": p.dry_multiplier,
        "dry_base": p.dry_base,
        "dry_allowed_length": p.dry_allowed_length,
        "dry_penalty_last_n": p.dry_penalty_last_n,
        "mirostat": p.mirostat,
        "mirostat_tau": p.mirostat_tau,
        "mirostat_eta": p.mirostat_eta,
        "adaptive_target": p.adaptive_target,
        "adaptive_decay": p.adaptive_decay,
        "max_tokens": run.n_predict,
        "n_predict": run.n_predict,
        "n_keep": run.n_keep,
        "n_discard": run.n_discard,
        "ignore_eos": run.ignore_eos,
        "stream": run.stream,
        "n_probs": p.n_probs,
        "min_keep": p.min_keep,
        **_reading(run),
        "samplers": list(p.samplers),
        "speculative.types": ",".join(run.spec_types) or "none",
        "timings_per_token": run.timings_per_token,
        "post_sampling_probs": p.post_sampling_probs,
        "backend_sampling": False,
        "lora": [],
    }


def _reading(run: RunParams) -> dict[str, Any]:
    """How the answer is read: llama-server parses every chat with its PEG parser ("peg-native"), and
    raw completions as content only; reasoning stays in the content only for deepseek-legacy streams."""
    return {
        "chat_format": "peg-native" if run.chat else "Content-only",
        "reasoning_format": run.reasoning_format,
        "reasoning_in_content": run.stream and run.reasoning_format == "deepseek-legacy",
        "generation_prompt": "",
    }
