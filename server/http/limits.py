"""Request limits at the HTTP edge: how each limit (its value: server/config/limits.py) answers.

Body size (413, Quart's MAX_CONTENT_LENGTH), JSON nesting depth, messages per request, stop strings
(count and length) are checked on every body (`server/http/request_body.py`); the queue of generation
requests (`--max-queue`, 503 with Retry-After) by `server/model/admission.py`; header size and slow headers
by hypercorn (`hypercorn_limits`). `n_probs` and `top_logprobs` are capped by the request schemas
(100 and 20, OpenAI's cap), and `n_predict`/`max_tokens` beyond the context end at the context
(finish_reason "length"), as llama-server's do.
"""

from __future__ import annotations

from typing import Any

from hypercorn.config import Config

from server.config.limits import RequestLimits
from server.http import errors

# Body fields that hold a conversation: chat-shaped routes' `messages`, the Responses API's `input`.
MESSAGE_FIELDS = ("messages", "input")
# Stop strings: OpenAI's and llama-server's `stop`, Anthropic's `stop_sequences`.
STOP_FIELDS = ("stop", "stop_sequences")


def check_body(limits: RequestLimits, body: Any) -> None:
    """400 naming the field and the flag when a parsed body is over a limit."""
    if not isinstance(body, dict):
        return
    for name in MESSAGE_FIELDS:
        items = body.get(name)
        if isinstance(items, list) and len(items) > limits.max_messages:
            raise errors.invalid_request(
                f"'{name}': {len(items)} items, more than the server's {limits.max_messages} (--max-messages)"
            )
    for name in STOP_FIELDS:
        _check_stop(limits, name, body.get(name))


def _check_stop(limits: RequestLimits, name: str, value: Any) -> None:
    stops = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if len(stops) > limits.max_stop_strings:
        raise errors.invalid_request(
            f"'{name}': {len(stops)} stop strings, more than the server's {limits.max_stop_strings} "
            "(--max-stop-strings)"
        )
    for stop in stops:
        if isinstance(stop, str) and len(stop) > limits.max_stop_length:
            raise errors.invalid_request(
                f"'{name}': a stop string of {len(stop)} characters, longer than the server's "
                f"{limits.max_stop_length} (--max-stop-length)"
            )


def hypercorn_limits(config: Config, limits: RequestLimits) -> None:
    """Header size and slow headers. h11 answers headers trickled in over `max_header_size` with a 431
    and closes (headers that arrive whole are measured by `server/http/request_body.py`, also a 431); a
    connection is idle until its request's headers are complete,
    so hypercorn's keep-alive timeout closes one that trickles its headers (slowloris). Bodies are
    bounded by Quart's BODY_TIMEOUT (60 s, 408) and MAX_CONTENT_LENGTH (413)."""
    config.h11_max_incomplete_size = limits.max_header_size
    config.keep_alive_timeout = limits.header_timeout
