"""structlog set-up: llama-server's lines (`llama`, the default), key=value (`text`) or JSON events, one
event name per line, request id bound per request; common/log.cpp's flags (`LogOutput`).

Every line is written where it is logged (the engine thread's slot lines on the engine thread), in one
write per line to stderr and, with --log-file, to the file: no queue to drain, nothing on the asyncio
loop but the loop's own lines.
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import structlog

from server.http.llama_log import LlamaRenderer

_ANSI = re.compile(r"\033\[[0-9;]*m")
# -lv thresholds (common/log.h: 1 error, 2 warning, 3 info, 4 trace, 5 debug) as the stdlib's levels;
# Llamba has no trace level, 4 logs as 3; 0 (output only) keeps the critical lines.
_LEVELS = {0: logging.CRITICAL, 1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.INFO}
OFF = logging.CRITICAL + 10  # --log-disable: above every level


@dataclass(frozen=True)
class LogOutput:
    """Where the log goes and how its lines start (llama-server's log flags)."""

    verbosity: int = 3  # -lv; -v: everything
    file: Path | None = None  # --log-file
    disable: bool = False  # --log-disable
    colors: str = "auto"  # --log-colors on|off|auto
    prefix: bool = False  # --log-prefix
    timestamps: bool = False  # --log-timestamps
    jsonl: bool = False  # --log-jsonl: common/log.cpp's JSON object a line, on stdout

    def level(self) -> int:
        if self.disable:
            return OFF
        return logging.DEBUG if self.verbosity >= 5 else _LEVELS.get(max(0, self.verbosity), logging.INFO)

    def use_colors(self) -> bool:
        on = self.colors == "on" or (self.colors == "auto" and sys.stderr.isatty())
        return on and not self.jsonl


class LogStreams:
    """stderr and the --log-file: each line written to both in one write each (colours only on stderr)."""

    def __init__(self, file: Path | None, stdout: bool = False) -> None:
        self.file: IO[str] | None = (
            file.open("w", encoding="utf-8", buffering=1) if file is not None else None
        )
        self.stdout = stdout  # --log-jsonl writes to stdout, as llama-server

    def write(self, text: str) -> int:
        (sys.stdout if self.stdout else sys.stderr).write(text)
        if self.file is not None:
            self.file.write(_ANSI.sub("", text))
        return len(text)

    def flush(self) -> None:
        (sys.stdout if self.stdout else sys.stderr).flush()
        if self.file is not None:
            self.file.flush()


def _renderer(log_format: str, out: LogOutput) -> Any:
    if log_format == "json":
        return structlog.processors.JSONRenderer()
    if log_format == "text":
        return structlog.processors.LogfmtRenderer()
    return LlamaRenderer(
        prefix=out.prefix, timestamps=out.timestamps, colors=out.use_colors(), jsonl=out.jsonl
    )


def configure(log_format: str = "text", verbose: bool = False, out: LogOutput | None = None) -> None:
    out = out or LogOutput()
    level = logging.DEBUG if verbose and not out.disable else out.level()
    streams = LogStreams(out.file, stdout=out.jsonl)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _renderer(log_format, out),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # One write per line: print() writes the message and its newline apart, and a line another thread
        # (hypercorn, the stdlib logging) wrote in between broke the JSON a router reads from its children.
        logger_factory=structlog.WriteLoggerFactory(streams),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(logging.WARNING, level), stream=streams)  # type: ignore[arg-type]
