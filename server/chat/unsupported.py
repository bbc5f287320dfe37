"""Fields a generation request may carry that Llamba does not act on: nothing a client sends is silently
ignored.

- Metadata that changes no output (OpenAI's `user`, `metadata`, `store`, ...) is accepted.
- llama-server's and OpenAI's fields that Llamba does not implement yet are accepted only with their
  no-op value (clients such as SillyTavern send a whole sampler set at its defaults); any other value is
  a 400 naming the field. Implementing one means removing it from NOT_YET.
- Any other field is a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from server.model.sampling import NUMBER_FIELDS

# Accepted and without effect on what is generated.
METADATA = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "stream_options",
        "id",
        # llama-server's per-request switch to sample on the GPU backend: where sampling runs, not what
        # it picks (llama.cpp's tests check both give the same tokens); Llamba has one sampler.
        "backend_sampling",
        # prompt caching hints: every prompt's prefix is cached here anyway
        "prompt_cache_retention",
        "prompt_cache_options",
    }
)

# field -> the value that leaves generation unchanged (llama.cpp's defaults).
NOT_YET: dict[str, Any] = {
    # llama-server's adaptive-p sampler (adaptive_decay is only read with it)
    "adaptive_target": -1.0,
    "adaptive_decay": 0.9,
    "penalize_nl": False,
    "n_indent": 0,
    "t_max_predict_ms": 0,
    "lora": [],
    "image_data": [],
    "n_keep": 0,
    "preserved_tokens": [],
    "suffix": None,  # /v1/completions' insertion point (llama-server's /infill)
    "best_of": 1,
    # OpenAI's
    "functions": None,  # use tools
    "function_call": None,  # use tool_choice
    "modalities": ["text"],
    "audio": None,
    "prediction": None,
    "web_search_options": None,
    "verbosity": "medium",  # a local model has no verbosity switch
    "moderation": None,  # no moderation runs here
}


# llama-server's own generation fields, which the Anthropic and Responses routes take too (Anthropic's
# stream has no place for the telemetry: TELEMETRY is refused there) (clients send
# them as extra body fields, e.g. the SDKs' `extra_body`): they pass through to the chat request, which
# acts on them or refuses them as it does on /v1/chat/completions.
LLAMA_EXTRAS = frozenset(
    {
        "logit_bias",
        "cache_prompt",
        "id_slot",
        "ignore_eos",
        "chat_template_kwargs",
        "reasoning_format",
        "reasoning_budget_tokens",
        "reasoning_budget_message",
        "samplers",
        "dry_sequence_breakers",
        # stream telemetry (the Responses stream carries them as llama-server's does)
        "timings_per_token",
        "return_progress",
        # per-request speculation
        "speculative.type",
        "speculative.n_max",
        "speculative.n_min",
        "speculative.p_min",
    }
    | set(NUMBER_FIELDS)
    | NOT_YET.keys()
)


def llama_extras(extra: dict[str, Any] | None, own: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The extra fields of an Anthropic or Responses body that pass through to the chat request
    (llama-server's, minus those the API has its own name for); ValueError naming any other."""
    unknown = [name for name in extra or {} if name not in LLAMA_EXTRAS or name in own]
    if unknown:
        raise ValueError("; ".join(f"'{name}': unknown field" for name in unknown))
    return dict(extra or {})


def unsupported(extra: dict[str, Any] | None) -> list[str]:
    """Why each extra field of a request cannot be accepted (empty when all can)."""
    problems = []
    for name, value in (extra or {}).items():
        if name in METADATA:
            continue
        if name not in NOT_YET:
            problems.append(f"'{name}': unknown field")
        elif value is not None and value != NOT_YET[name]:
            problems.append(f"'{name}': not supported (only {NOT_YET[name]!r}, which changes nothing)")
    return problems


TELEMETRY = frozenset({"timings_per_token", "return_progress"})
