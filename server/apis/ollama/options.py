"""Ollama's `options` (its api.Options and api.Runner) mapped onto the sampler and the generation limits.

Each option's value is type-checked as Ollama's `Options.FromMap` checks it (an integer option takes any
JSON number, truncated; a float option a number; a boolean a boolean; `stop` a list of strings), and
a wrong type is a 400 in Ollama's words. The sampling options become the chat request's own fields, so
their ranges are the chat route's (a 400 naming the field). The runner options, fixed when a llama-server
process starts, are accepted without effect (`NO_EFFECT` says why; docs/compatibility.md lists them). An
option Ollama does not know is ignored and logged once, as Ollama warns "invalid option provided".
Defaults are the server's (its sampling flags), not Ollama's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from server.http import errors

log = structlog.get_logger("server")

# Ollama option -> the chat request field it sets
SAMPLING: dict[str, str] = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "num_predict": "n_predict",
    "num_keep": "n_keep",
    "stop": "stop",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
}
RUNNER_REASON = "a load-time setting: this server's flags fixed it when it started"
# The options accepted without effect, and why.
NO_EFFECT: dict[str, str] = {
    "num_batch": RUNNER_REASON + " (-b)",
    "num_gpu": RUNNER_REASON + " (-ngl, --device)",
    "main_gpu": RUNNER_REASON + " (--device)",
    "use_mmap": RUNNER_REASON + " (weights are always repacked in memory)",
    "use_mlock": RUNNER_REASON + " (--mlock)",
    "num_thread": RUNNER_REASON + " (-t)",
    "numa": RUNNER_REASON + " (--numa)",
    "low_vram": "an older runner option Ollama no longer reads",
    "f16_kv": "an older runner option Ollama no longer reads (KV cell types: -ctk/-ctv)",
    "vocab_only": "an older runner option Ollama no longer reads",
    "logits_all": "an older runner option Ollama no longer reads",
    "penalize_newline": "an older sampler option Ollama no longer reads",
    "tfs_z": "tail-free sampling: removed from llama.cpp and Ollama",
    "draft_num_predict": "speculation is the server's (--spec-* flags)",
}
INTEGER = frozenset(
    {"top_k", "repeat_last_n", "seed", "num_predict", "num_keep", "mirostat", "num_ctx", "num_batch",
     "num_gpu", "main_gpu", "num_thread", "draft_num_predict"}
)  # fmt: skip
FLOAT = frozenset(
    {"temperature", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
     "frequency_penalty", "mirostat_tau", "mirostat_eta", "tfs_z"}
)  # fmt: skip
BOOLEAN = frozenset({"use_mmap", "use_mlock", "numa", "low_vram", "f16_kv", "vocab_only", "logits_all",
                     "penalize_newline"})  # fmt: skip
KNOWN = frozenset(SAMPLING) | frozenset(NO_EFFECT) | {"num_ctx"}
_warned: set[str] = set()


@dataclass(frozen=True)
class Options:
    """A request's options as the chat route's fields, and `num_ctx` (applied by the route)."""

    fields: dict[str, Any] = field(default_factory=dict)
    num_ctx: int | None = None


def read_options(raw: dict[str, Any] | None) -> Options:
    """The options' fields; 400 for a value of the wrong type."""
    fields: dict[str, Any] = {}
    num_ctx = None
    for name, value in (raw or {}).items():
        if name not in KNOWN:
            _warn_unknown(name)
            continue
        if value is None:
            continue
        value = _typed(name, value)
        if name == "num_ctx":
            num_ctx = value
        elif name in SAMPLING:
            fields |= _sampling_field(name, value)
    return Options(fields, num_ctx)


def _typed(name: str, value: Any) -> Any:
    if name in INTEGER:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise errors.invalid_request(f'option "{name}" must be of type integer')
        return int(value)
    if name in FLOAT:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise errors.invalid_request(f'option "{name}" must be of type float32')
        return float(value)
    if name in BOOLEAN:
        if not isinstance(value, bool):
            raise errors.invalid_request(f'option "{name}" must be of type boolean')
        return value
    if not isinstance(value, list):  # stop
        raise errors.invalid_request(f'option "{name}" must be of type array')
    if not all(isinstance(v, str) for v in value):
        raise errors.invalid_request(f'option "{name}" must be of an array of strings')
    return value


def _sampling_field(name: str, value: Any) -> dict[str, Any]:
    """One sampling option as its chat field: num_predict -2 (Ollama's "fill the context") is -1, the
    context's end; a negative seed is Ollama's "random", the server's default."""
    if name == "num_predict" and value < -1:
        value = -1
    if name == "seed" and value < 0:
        return {}
    if name == "stop" and not value:
        return {}
    return {SAMPLING[name]: value}


def _warn_unknown(name: str) -> None:
    if name not in _warned and len(_warned) < 256:
        _warned.add(name)
        log.warning("ollama.invalid_option", option=name, detail="ignored, as Ollama ignores it")
