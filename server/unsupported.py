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
        "n_cmpl",  # checked by `n` (one choice per request here)
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
    "reasoning_effort": None,
}


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
