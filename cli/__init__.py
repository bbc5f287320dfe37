"""The command-line tools: llamba-bench, llamba-perplexity, llamba-models, llamba-bench-serve and the CUDA
compile check. Each reaches the engine (or a server over HTTP) through its public surface."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

import structlog


@contextlib.contextmanager
def quiet_engine_logs() -> Iterator[None]:
    """While a tool runs, the engine's log events (structlog: a slot's lifecycle, its timings) are
    warnings and worse only, on stderr: its stdout holds its results (-o json, the perplexity figures)
    and nothing else. The configuration before is restored (the tests call the tools in-process)."""
    before = structlog.get_config()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    try:
        yield
    finally:
        structlog.configure(**before)
