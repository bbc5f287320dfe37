"""Request limits as settings: what one request may ask of the server, each bound with its flag.

Pure data (the flags of the same names fill it: `server/config/flags.py`); `server/http/limits.py`
checks bodies against it and gives hypercorn its header limits, `server/model/admission.py` bounds the
queue with `max_queue`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestLimits:
    """The limits, from the flags of the same names (server/config/flags.py)."""

    max_body_size: int = 32 * 1024 * 1024  # bytes of one request body
    max_json_depth: int = 128  # nested arrays/objects (tool schemas nest; CPython's json stops near 1000)
    max_messages: int = 4096  # messages (or Responses input items) in one request
    max_stop_strings: int = 64  # llama-server has no cap; OpenAI allows 4
    max_stop_length: int = 1024  # characters of one stop string
    max_queue: int = 256  # generation requests waiting beyond the slots; -1: no limit
    header_timeout: float = 10.0  # seconds a client may take to send a request's headers
    max_header_size: int = 32 * 1024  # bytes of a request line plus its headers
