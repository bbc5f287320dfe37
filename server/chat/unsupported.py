"""Fields a generation request may carry that Llamba does not act on, and what happens to each.

- Metadata that changes no output (OpenAI's `user`, `metadata`, `store`, ...) is accepted.
- llama-server's fields that would change nothing here (ACCEPTED, each with why) are accepted; their
  values are not read.
- llama-server's and OpenAI's fields that Llamba does not implement yet are accepted only with their
  no-op value (clients such as SillyTavern send a whole sampler set at its defaults); any other value is
  a 400 naming the field: the client asked for an effect Llamba cannot give. Implementing one means
  removing it from NOT_YET.
- Any other field is unknown: accepted and ignored as llama-server ignores keys it does not read, named
  once in the log and counted in /metrics; with --strict-fields a 400 naming it
  (server/http/unknown_fields.py).
"""

from __future__ import annotations

from typing import Any

from server.http import unknown_fields
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

# llama-server's fields that change nothing here: field -> why. Accepted whatever their value.
ACCEPTED: dict[str, str] = {
    "n_cache_reuse": "Llamba reuses every cached prefix a prompt shares with its slot or the host prompt "
    "cache (no chunk reuse by KV shifting): no minimum chunk size to set",
    "sse_ping_interval": "no SSE comment pings are sent: a silent stream stays silent (use -to/--timeout "
    "for idle connections)",
    "t_max_prompt_ms": "llama-server does not read it either (a TODO there)",
    "return_tokens": "read by /completion and /infill (a whole reply's `tokens`); the OpenAI and Anthropic "
    "shapes have no place for token ids",
    "best_of": "llama-server does not read it either (OpenAI's legacy completions field): one completion "
    "per choice, none discarded",
    "response_fields": "llama-server applies it to /completion's and /infill's native reply only (both "
    "implement it here); the OpenAI shapes do not read it",
}

# field -> the value that leaves generation unchanged (llama.cpp's defaults).
NOT_YET: dict[str, Any] = {
    "penalize_nl": False,
    "image_data": [],
    "preserved_tokens": [],
    "suffix": None,  # /v1/completions' insertion point (llama-server's /infill)
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
        "t_max_predict_ms",
        "n_discard",
        "n_keep",
        "n_indent",
        "n_probs",
    }
    | set(NUMBER_FIELDS)
    | NOT_YET.keys()
    | ACCEPTED.keys()
)


def passed_extras(extra: dict[str, Any] | None, own: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The extra fields of an Anthropic or Responses body that pass through to the chat request:
    llama-server's, minus those the API has its own name for."""
    return {name: v for name, v in (extra or {}).items() if name in LLAMA_EXTRAS and name not in own}


def check_extras(extra: dict[str, Any] | None, own: frozenset[str] = frozenset()) -> None:
    """The Anthropic or Responses body's other extra fields are unknown there: ignored and noted, or
    with --strict-fields a ValueError naming them."""
    kept = passed_extras(extra, own)
    problems = unknown_fields.refused(name for name in extra or {} if name not in kept)
    if problems:
        raise ValueError("; ".join(problems))


def unsupported(extra: dict[str, Any] | None) -> list[str]:
    """Why extra fields of a request cannot be accepted (empty when all can): a not-yet-implemented
    field asked for an effect, or (with --strict-fields) an unknown field. Unknown fields are noted."""
    problems, unknown = [], []
    for name, value in (extra or {}).items():
        if name in METADATA or name in ACCEPTED:
            continue
        if name not in NOT_YET:
            unknown.append(name)
        elif value is not None and value != NOT_YET[name]:
            problems.append(f"'{name}': not supported (only {NOT_YET[name]!r}, which changes nothing)")
    return problems + unknown_fields.refused(unknown)


TELEMETRY = frozenset({"timings_per_token", "return_progress"})
