"""A model's child from load to exit: started, watched, its events turned into the model's state and
published on `/models/sse`, stopped on request.

The pool (server/router/pool.py) decides when a model loads or is given up; this module carries it out
and tells the pool back through two callbacks: `changed` after every change that may make room or a
model ready (the pool serves its queue), and `fail_waiters` when a child dies that requests waited for.
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
# Starts a task the pool keeps track of (so its shutdown can cancel it).
TaskRunner = Callable[[Coroutine[Any, Any, None]], None]
# Fails the requests waiting for a model, each with an error from the factory.
WaiterFailer = Callable[[str, Callable[[], Exception]], None]


class ModelLifecycle:
    """Carries out the pool's decisions on the models' children: load one, watch it, stop it."""

    def __init__(
        self,
        events: EventHub,
        spawn: ChildFactory,
        *,
        run: TaskRunner,
        changed: Callable[[], None],
        fail_waiters: WaiterFailer,
    ) -> None:
        self.events = events
        self._spawn = spawn
        self._run = run
        self._changed = changed
        self._fail_waiters = fail_waiters

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

        def error() -> errors.APIError:
            return errors.APIError(503, message, "unavailable_error", log=child.last_lines())

        self._fail_waiters(state.id, error)
        self.publish_status(state)
        self._changed()

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
            self._changed()
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

    async def stop(self, state: ModelState, reason: str = "unload", timeout: float | None = None) -> None:
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
            self._changed()
