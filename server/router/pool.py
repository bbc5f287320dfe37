"""The router's policy: which models run, who waits, which model is given up.

- A request for a running model gets a `Lease` at once (its `in_flight` count keeps it from eviction).
- Otherwise it waits in a FIFO queue with one entry per model: every waiter for a model shares that
  model's one load (coalescing), and entries are served in arrival order.
- A load needs room (`--models-max`, 0: any number): failing that, the least recently used idle model
  (no requests in flight, nobody queued for it) is stopped first; when none is idle the head of the
  queue waits and nobody behind it jumps ahead. One eviction serves one entry, however many waiters it
  has, so two waiters that want the same idle model's room share its eviction.
- A waiter that leaves (its client went away) leaves the queue; if nobody else wanted that model, its
  entry goes too and no model is given up for it.

Starting, following and stopping the children is `server/router/children.py`'s, at the pool's word.
Everything runs on the event loop: no locks, state changes between awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from typing import Any

from server.http import errors
from server.router.catalogue import Catalogue
from server.router.children import ChildFactory, Children
from server.router.events import EventHub
from server.router.keep_alive import KeepAlive
from server.router.state import (
    DOWNLOADING,
    FAILED,
    LOADED,
    LOADING,
    RUNNING,
    SLEEPING,
    UNLOADED,
    ModelState,
)

# Seconds a child gets to exit on the router's own shutdown before it is killed (a preset's stop-timeout
# is for unloads, where waiting is cheap; a shutdown must be prompt).
SHUTDOWN_STOP_TIMEOUT = 5.0


class Lease:
    """The right to send one request to a running model's child; `release` when its response ends."""

    def __init__(self, pool: ModelPool, state: ModelState) -> None:
        self.state = state
        self.child = state.child
        self._pool = pool
        self._released = False

    @property
    def url(self) -> str:
        assert self.child is not None
        return self.child.url

    @property
    def name(self) -> str:
        return self.state.id

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool.release(self.state)


class ModelPool:
    def __init__(self, catalogue: Catalogue, models_max: int, events: EventHub, spawn: ChildFactory) -> None:
        self.catalogue = catalogue
        self.models_max = models_max
        self.events = events
        self.states = {entry.id: ModelState(entry) for entry in catalogue.entries.values()}
        self._queue: OrderedDict[str, list[asyncio.Future[Lease]]] = OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.children = Children(spawn, events, self._spawn_task, self._pump, self._fail_waiters)
        # Ollama's keep_alive (server/router/keep_alive.py): an idle model's child stopped on its timer.
        self.keep_alive = KeepAlive(lambda state: self._spawn_task(self._expire(state)))

    def state(self, name: str) -> ModelState:
        entry = self.catalogue.resolve(name)
        if entry is None:
            raise errors.invalid_request(f"model '{name}' not found (GET /models lists them)")
        return self.states[entry.id]

    def queued(self, state: ModelState) -> int:
        """Requests waiting for this model (its load, or room for it)."""
        return len(self._queue.get(state.id, ()))

    def listing(self, state: ModelState) -> dict[str, Any]:
        return state.listing() | {"queued": self.queued(state)}

    # -- requests -------------------------------------------------------------------------------------
    async def acquire(self, state: ModelState, autoload: bool = True) -> Lease:
        if state.status in RUNNING and not state.stopping:
            return self._grant(state)
        if not autoload and state.status in (UNLOADED, FAILED) and state.id not in self._queue:
            raise errors.invalid_request(
                f"model '{state.id}' is not loaded; load it with POST /models/load (--no-models-autoload)"
            )
        waiter: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        self._queue.setdefault(state.id, []).append(waiter)
        self._pump()
        try:
            return await waiter
        except asyncio.CancelledError:
            self._leave(state, waiter)
            raise

    def _leave(self, state: ModelState, waiter: asyncio.Future[Lease]) -> None:
        """A waiter's client went away: give back what it got, or take it out of the queue."""
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            waiter.result().release()
            return
        waiters = self._queue.get(state.id)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            if not waiters and state.status != LOADING:
                del self._queue[state.id]  # nobody wants it any more: no eviction, no load for it
        self._pump()

    def _grant(self, state: ModelState) -> Lease:
        state.in_flight += 1
        state.touch()
        self.keep_alive.busy(state)
        return Lease(self, state)

    def release(self, state: ModelState) -> None:
        state.in_flight -= 1
        state.touch()
        if state.in_flight == 0:
            self.keep_alive.idle(state)
        self._pump()

    # -- the queue ------------------------------------------------------------------------------------
    def _pump(self) -> None:
        """Serve the queue in order as far as room allows (called after every change)."""
        for model_id, waiters in list(self._queue.items()):
            state = self.states.get(model_id)
            if state is None:  # dropped by a reload while its waiter was on the way in
                self.forget(model_id)
                continue
            if state.status in RUNNING and not state.stopping:
                del self._queue[model_id]
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(self._grant(state))
                continue
            if state.status in (LOADING, DOWNLOADING) or state.stopping:
                continue  # its load, its fetch, or its stop then a load, is under way
            if not self._has_room():
                if any(s.stopping for s in self.states.values()):
                    return  # a stop is under way: its room goes to the head, no second eviction
                victim = self._least_recently_used()
                if victim is not None:
                    self._spawn_task(self.stop(victim, reason="evicted"))
                return  # the head waits for room; nobody behind it jumps ahead
            self.children.start_load(state)

    def pump(self) -> None:
        """Serve the queue after a change outside the pool (a download ended)."""
        self._pump()

    def forget(self, model_id: str) -> None:
        """A model the catalogue no longer lists (GET /models?reload=1): its waiters get a 400, its
        state goes (its child, if any, was stopped first)."""
        err = errors.invalid_request(f"model '{model_id}' is no longer in the catalogue (it was reloaded)")
        for waiter in self._queue.pop(model_id, []):
            if not waiter.done():
                waiter.set_exception(err)
        self.states.pop(model_id, None)

    def _has_room(self) -> bool:
        running = sum(s.child is not None for s in self.states.values())
        return self.models_max == 0 or running < self.models_max

    def _least_recently_used(self) -> ModelState | None:
        idle = [s for s in self.states.values() if s.idle and s.id not in self._queue]
        return min(idle, key=lambda s: s.last_used, default=None)

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- loading, crashes, stopping (server/router/children.py) ---------------------------------------
    def _fail_waiters(self, state: ModelState, err: errors.APIError) -> None:
        """The model's load failed or its child crashed: its waiters get `err`."""
        for waiter in self._queue.pop(state.id, []):
            if not waiter.done():
                waiter.set_exception(err)

    async def _expire(self, state: ModelState) -> None:
        """Its keep-alive ran out: stop the model's child, unless a request took it meanwhile."""
        if state.idle:
            await self.stop(state, reason="keep_alive")

    async def stop(self, state: ModelState, reason: str = "unload", timeout: float | None = None) -> None:
        """Stop the model's child (its requests in flight end with it); its room is free once it exited."""
        await self.children.stop(state, reason, timeout)

    # -- explicit load / unload, shutdown --------------------------------------------------------------
    def load(self, state: ModelState) -> None:
        """POST /models/load: queue like a request that only wants the model up, without using it."""
        if state.status in (LOADED, SLEEPING, LOADING) and not state.stopping:
            return

        async def load_and_release() -> None:
            with contextlib.suppress(errors.APIError):
                (await self.acquire(state)).release()

        self._spawn_task(load_and_release())

    async def shutdown(self) -> None:
        for waiters in self._queue.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(errors.unavailable("the router is shutting down"))
        self._queue.clear()
        running = [s for s in self.states.values() if s.child is not None]
        await asyncio.gather(
            *(self.stop(s, reason="shutdown", timeout=SHUTDOWN_STOP_TIMEOUT) for s in running),
            return_exceptions=True,
        )
        for task in list(self._tasks):
            task.cancel()
