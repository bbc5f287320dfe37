"""Ollama's `keep_alive` in router mode: how long a model stays loaded once its last request ended.

An Ollama request (`/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`) sets its model's keep-alive,
as Ollama's scheduler does per request: a duration ("5m", "30s", a number of seconds) unloads the model's
child that long after its last request ended (a request meanwhile restarts the wait), 0 unloads it as
soon as its requests are done, a negative one keeps it loaded (until `--models-max` evicts it, as any
idle model). A request without `keep_alive` gives the model back the router's own policy: no timed unload
(children may still sleep under `--sleep-idle-seconds`). A keep-alive belongs to the child it was set on:
the next load of the model starts under the router's policy again.

`parse_keep_alive` reads the value as Ollama's `api.Duration` does (Go's `time.ParseDuration` for text).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.router.child import Child
from server.router.state import ModelState

FOREVER = math.inf
# What Ollama's "forever" reads as in /api/ps: now plus Go's longest duration (math.MaxInt64 ns, ~292 y).
FOREVER_S = (2**63 - 1) / 1e9
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = re.compile(r"(\d+\.?\d*|\.\d+)")
_UNIT = re.compile(r"[^\d.]*")


class KeepAliveError(ValueError):
    """A `keep_alive` Ollama refuses (the request's 400, in Go's words)."""


def parse_keep_alive(value: Any) -> float:
    """Seconds a model stays loaded after a request: a number is seconds, text a Go duration; negative
    is forever (`FOREVER`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise KeepAliveError(f"Unsupported type: '{_go_type(value)}'")
    seconds = float(value) if not isinstance(value, str) else go_duration(value)
    return FOREVER if seconds < 0 else seconds


def go_duration(text: str) -> float:
    """Go's `time.ParseDuration` in seconds: `[-+]` then decimal numbers each with its unit
    (ns, us, µs, ms, s, m, h), `"0"` alone needing none."""
    quoted = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    rest, sign = text, 1.0
    if rest[:1] in ("-", "+"):
        sign, rest = (-1.0 if rest[0] == "-" else 1.0), rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise KeepAliveError(f"time: invalid duration {quoted}")
    total = 0.0
    while rest:
        number = _NUMBER.match(rest)
        if number is None:
            raise KeepAliveError(f"time: invalid duration {quoted}")
        rest = rest[number.end() :]
        unit = _UNIT.match(rest)
        name = unit.group() if unit else ""
        if not name:
            raise KeepAliveError(f"time: missing unit in duration {quoted}")
        if name not in _UNITS:
            raise KeepAliveError(f'time: unknown unit "{name}" in duration {quoted}')
        rest = rest[len(name) :]
        total += float(number.group()) * _UNITS[name]
    return sign * total


def _go_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, list):
        return "[]interface {}"
    if isinstance(value, dict):
        return "map[string]interface {}"
    return "<nil>" if value is None else type(value).__name__


@dataclass
class Hold:
    """One model's keep-alive: the child it was set on, its seconds, the pending unload once idle."""

    child: Child
    seconds: float
    deadline: float | None = None  # wall-clock time of the pending unload
    timer: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer, self.deadline = None, None


class KeepAlive:
    """The models' keep-alives, for the pool: `busy` when a request takes a model, `idle` when its last
    one ends; `expire(state)` stops an idle model's child (the pool's stop)."""

    def __init__(self, expire: Callable[[ModelState], None]) -> None:
        self._expire = expire
        self._holds: dict[str, Hold] = {}

    def set(self, state: ModelState, seconds: float | None) -> None:
        """The model's keep-alive from a request that holds it (None: the router's policy)."""
        old = self._holds.pop(state.id, None)
        if old is not None:
            old.cancel()
        if seconds is not None and state.child is not None:
            self._holds[state.id] = Hold(state.child, seconds)

    def busy(self, state: ModelState) -> None:
        hold = self.current(state)
        if hold is not None:
            hold.cancel()

    def idle(self, state: ModelState) -> None:
        hold = self.current(state)
        if hold is None or not state.idle or hold.seconds == FOREVER:
            return
        if hold.seconds <= 0:
            self._expire(state)
            return
        hold.cancel()
        hold.deadline = time.time() + hold.seconds
        hold.timer = asyncio.get_running_loop().call_later(hold.seconds, self._fire, state, hold)

    def _fire(self, state: ModelState, hold: Hold) -> None:
        hold.timer = None
        if self.current(state) is hold and state.idle:
            self._expire(state)

    def current(self, state: ModelState) -> Hold | None:
        """The model's keep-alive, if it was set on the child it runs now."""
        hold = self._holds.get(state.id)
        if hold is not None and hold.child is not state.child:
            hold.cancel()
            del self._holds[state.id]
            return None
        return hold

    def expires_at(self, state: ModelState) -> float:
        """When the model's child is unloaded (wall clock), as Ollama's /api/ps says it: the pending
        unload; now plus its keep-alive while in use; now plus Go's longest duration when none is due."""
        hold = self.current(state)
        now = time.time()
        if hold is None or hold.seconds == FOREVER:
            return now + FOREVER_S
        return hold.deadline if hold.deadline is not None else now + hold.seconds
