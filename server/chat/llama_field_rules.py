"""llama-server's rules for the values of its generation fields, applied to a request body before it is
validated (tools/server/server-schema.cpp, 0c1e570, `make_llama_cmpl_schema` and `field_num::eval`).

- null is absent: a client sends null to ask for the server's default (`has_value`).
- A value of the wrong JSON type is a 400 (nlohmann's type_error: a string for a number, "yes" for a
  boolean); a number where an integer is read is truncated, and a boolean read as a number is 0 or 1,
  as nlohmann's `get<int32_t>()` does.
- A number outside a *hard* limit is a 400; outside a *soft* limit it is clamped (`top_p: 1.5` is 1).
- `dry_base` below 1 is the server's default; a negative `n_probs` asks for no probabilities.
- `reasoning_format` must name a format; `chat_parser` must be JSON (a serialized parser).

Where llama-server silently ignores a wrongly typed value (`grammar: 5`, `stop: 5`, `id_slot: "x"`),
Llamba keeps its 400 naming the field: tests/test_llama_server_fields.py lists those cases.
"""

from __future__ import annotations

import json
from typing import Any

INT32_MAX = 2**31 - 1
REASONING_FORMATS = frozenset({"none", "auto", "deepseek", "deepseek-legacy"})
BOOLEANS = frozenset(
    {
        "verbose",
        "timings_per_token",
        "stream",
        "cache_prompt",
        "return_tokens",
        "return_progress",
        "ignore_eos",
        "post_sampling_probs",
        "backend_sampling",
        "grammar_lazy",
        "parse_tool_calls",
        "reasoning_control",
        "echo",
    }
)
# Read with get<float>() or get<int>(): any JSON number.
NUMBERS = frozenset(
    {
        "sse_ping_interval", "n_predict", "max_tokens", "max_completion_tokens", "n_indent", "n_keep",
        "n_discard", "n_cmpl", "n", "n_cache_reuse", "t_max_predict_ms", "top_k", "top_p", "min_p",
        "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "temperature", "dynatemp_range",
        "dynatemp_exponent", "repeat_last_n", "repeat_penalty", "frequency_penalty", "presence_penalty",
        "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat",
        "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay", "seed", "n_probs", "min_keep",
        "reasoning_budget_tokens", "chat_format",
    }
)  # fmt: skip
STRINGS = frozenset({"reasoning_format", "generation_prompt", "chat_parser", "reasoning_budget_start_tag"})
# A 400 outside these (inclusive; None: no bound).
HARD: dict[str, tuple[float, float | None]] = {
    "sse_ping_interval": (-1, INT32_MAX),
    "n_predict": (-1, INT32_MAX),
    "max_tokens": (-1, INT32_MAX),
    "max_completion_tokens": (-1, INT32_MAX),
    "n_indent": (0, INT32_MAX),
    "n_keep": (-1, INT32_MAX),
    "n_discard": (0, INT32_MAX),
    "n_cache_reuse": (0, INT32_MAX),
    "t_max_predict_ms": (-1, None),
    "repeat_last_n": (0, INT32_MAX),
    "dry_allowed_length": (0, INT32_MAX),
    "dry_penalty_last_n": (0, INT32_MAX),
    "adaptive_decay": (0.0, 0.99),
    "min_keep": (0, INT32_MAX),
    "reasoning_budget_tokens": (-1, INT32_MAX),
}
# Clamped into these.
SOFT: dict[str, tuple[float | None, float | None]] = {
    "top_k": (0, INT32_MAX),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "xtc_probability": (0.0, 1.0),
    "xtc_threshold": (0.0, 1.0),
    "typical_p": (0.0, 1.0),
    "temperature": (0.0, None),
    "mirostat": (0, 2),
    "adaptive_target": (None, 1.0),
    "n_probs": (0, None),  # no limit there; a negative count asks for none
}
_INTEGERS = frozenset({"n_predict", "max_tokens", "max_completion_tokens", "n_indent", "n_keep", "n_discard"})
_INTEGERS |= {"n_cmpl", "n", "n_cache_reuse", "t_max_predict_ms", "top_k", "repeat_last_n", "mirostat"}
_INTEGERS |= {"dry_allowed_length", "dry_penalty_last_n", "seed", "n_probs", "min_keep"}
_INTEGERS |= {"reasoning_budget_tokens", "sse_ping_interval"}
_JSON_TYPE = {bool: "boolean", str: "string", int: "number", float: "number", list: "array", dict: "object"}


def apply(data: dict[str, Any], chat: bool = False) -> dict[str, Any]:
    """The body as llama-server reads it: nulls dropped, soft limits clamped; a ValueError names the
    first field with a wrong type or outside a hard limit. `chat`: a chat body, whose `chat_parser` the
    template's parser replaces (not read)."""
    out = {}
    for name, value in data.items():
        if value is None:
            continue
        if name == "chat_parser" and chat:
            out[name] = value
            continue
        out[name] = _checked(name, value, NUMBERS)
    if isinstance(out.get("dry_base"), int | float) and out["dry_base"] < 1.0:
        del out["dry_base"]  # "any values < 1.0 will be replaced with the default value"
    return out


def _checked(name: str, value: Any, numbers: frozenset[str]) -> Any:
    if name == "logprobs" and not isinstance(value, bool | int | float):  # chat's boolean, else n_probs
        raise ValueError(_type_error(name, "number", value))
    if name in BOOLEANS and not isinstance(value, bool):
        raise ValueError(_type_error(name, "boolean", value))
    if name in STRINGS and not isinstance(value, str):
        raise ValueError(_type_error(name, "string", value))
    if name == "reasoning_format" and value not in REASONING_FORMATS:
        raise ValueError(f"Field 'reasoning_format': Unknown reasoning format: {value}")
    if name == "chat_parser":
        try:
            json.loads(value)
        except ValueError:
            raise ValueError("Field 'chat_parser': not a serialized parser (JSON)") from None
    if name not in numbers:
        return value
    if not isinstance(value, int | float):
        raise ValueError(_type_error(name, "number", value))
    if isinstance(value, bool) or (name in _INTEGERS and isinstance(value, float)):
        value = int(value)  # nlohmann's get<int32_t>() truncates, and reads true as 1
    if name in HARD:
        low, high = HARD[name]
        if value < low or (high is not None and value > high):
            bound = f"{low} <= value <= {high}" if high is not None else f"{low} <= value"
            raise ValueError(f"Field '{name}': Value must be between {bound}, but got {value}")
    if name in SOFT:
        low, high = SOFT[name]
        value = max(value, low) if low is not None else value
        value = min(value, high) if high is not None else value
    return value


def _type_error(name: str, expected: str, value: Any) -> str:
    got = "null" if value is None else _JSON_TYPE.get(type(value), type(value).__name__)
    return f"Field '{name}': type must be {expected}, but is {got}"
