"""A model's child from its load to its exit, for the pool (`server/router/pool.py`): started, its log's
lifecycle events turned into the model's status (and `/models/sse` events), its unasked-for exit a
failure, its stop.

The pool decides when; this module does it and tells the pool back: `on_change` after every change that
may let a queued request go on (a load done, a failure, a stop), `on_failure` with the error the
model's waiters get.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from server.http import errors
from server.router.child import Child
from server.router.events import EventHub
from server.router.state import FAILED, LOADED, LOADING, RUNNING, SLEEPING, UNLOADED, ModelState

log = structlog.get_logger("router")

ChildFactory = Callable[[ModelState, Callable[[dict[str, Any]], None]], Child]


class Children:
    """The models' child processes. `spawn` makes a model's child; `run` runs a task the pool owns."""

    def __init__(
        self,
        spawn: ChildFactory,
        events: EventHub,
        run: Callable[[Coroutine[Any, Any, None]], None],
        on_change: Callable[[], None],
        on_failure: Callable[[ModelState, errors.APIError], None],
    ) -> None:
        self.events = events
        self._spawn = spawn
        self._run = run
        self._on_change = on_change
        self._on_failure = on_failure

    def start_load(self, state: ModelState) -> None:
        state.status, state.progress, state.failure = LOADING, {"stage": "start", "value": 0.0}, None
        state.loads += 1
        state.stopped.clear()
        child = self._spawn(state, lambda event: self._on_child_event(state, child, event))
        state.child = child
        self.publish_status(state)
        self._run(self._run_child(state, child))

    async def _run_child(self, state: ModelState, child: Child) -> None:
        """Start the child and watch it until it exits; an exit nobody asked for is a failure."""
        try:
            await child.start()
            code = await child.wait()
        except OSError as exc:
            code = -1
            child.tail.append(f"could not start the child: {exc}")
        if state.child is child and not child.stopping:
            self._failed(state, child, code)

    def _failed(self, state: ModelState, child: Child, code: int) -> None:
        was = state.status
        state.status, state.child = FAILED, None
        state.failures += 1
        state.failure = {"exit_code": code, "log": child.last_lines()}
        state.stopped.set()
        log.error("child.failed", model=state.id, exit_code=code, during=was, log=child.last_lines(5))
        message = (
            f"model '{state.id}' failed ({'loading' if was == LOADING else 'crashed'}): exit code {code}"
        )
        self._on_failure(state, errors.APIError(503, message, "unavailable_error", log=child.last_lines()))
        self.publish_status(state)
        self._on_change()

    def _on_child_event(self, state: ModelState, child: Child, event: dict[str, Any]) -> None:
        if state.child is not child:
            return
        name = event["event"]
        if name == "model.fetch":
            self.events.publish(state.id, "download_progress", {"message": event.get("message")})
            state.progress = {"stage": "fetch", "value": 0.0}
        elif name == "model.load_progress" and state.status == LOADING:
            state.progress = {"stage": event.get("stage"), "value": event.get("value")}
            self.publish_status(state)
        elif name == "model.loaded":
            first = state.info is None
            state.info = event.get("info") or state.info
            state.status = LOADED
            state.touch()
            self.publish_status(state, info=first)
            self._on_change()
        elif name in ("model.sleeping", "model.awake") and state.status in RUNNING:
            state.status = SLEEPING if name == "model.sleeping" else LOADED
            self.publish_status(state)

    def publish_status(self, state: ModelState, info: bool = False) -> None:
        data: dict[str, Any] = {"status": state.status}
        if state.status == LOADING and state.progress:
            data["progress"] = state.progress
        if state.status == FAILED and state.failure:
            data |= state.failure
        if info and state.info is not None:
            data["info"] = state.info
        self.events.publish(state.id, "model_status", data)

    async def stop(self, state: ModelState, reason: str, timeout: float | None) -> None:
        """Stop the model's child (its requests in flight end with it); its room is free once it exited."""
        child = state.child
        if state.stopping:
            await state.stopped.wait()
            return
        if child is None:
            return
        state.stopping = True
        state.evictions += reason == "evicted"
        log.info("child.stopping", model=state.id, reason=reason)
        try:
            await child.stop(state.entry.stop_timeout if timeout is None else timeout)
        finally:
            state.stopping, state.child = False, None
            state.status = UNLOADED
            state.stopped.set()
            self.publish_status(state)
            self._on_change()
