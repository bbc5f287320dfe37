"""structlog set-up: key=value lines (or JSON), one event name per line, request id bound per request."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(log_format: str = "text", verbose: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    renderer = (
        structlog.processors.JSONRenderer() if log_format == "json" else structlog.processors.LogfmtRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # One write per line: print() writes the message and its newline apart, and a line another thread
        # (hypercorn, the stdlib logging) wrote in between broke the JSON a router reads from its children.
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
