"""GET /models?reload=1: the catalogue rescanned (built-ins, `--models-dir`, `--models-preset`) and the
pool brought in line with it, by llama-server's rules:

- a running (or loading) model whose source went, or whose launch changed (its file, flags or
  environment), is stopped; its requests in flight end with it;
- every other model takes its new entry (aliases, stop timeout...); a failed one is cleared so the next
  request loads it again;
- new models are listed, not loaded (`load-on-startup` applies at start-up only);
- `/models/sse` listeners get `{"model": "*", "event": "models_reload"}` once it is done.
"""

from __future__ import annotations

import asyncio

import structlog

from server.router.catalogue import Catalogue
from server.router.pool import ModelPool
from server.router.state import FAILED, UNLOADED, ModelState

log = structlog.get_logger("router")


def _stale(state: ModelState, fresh: Catalogue) -> bool:
    entry = fresh.entries.get(state.id)
    return state.child is not None and (entry is None or entry.launch() != state.entry.launch())


async def reload_catalogue(pool: ModelPool, fresh: Catalogue) -> None:
    stale = [s for s in pool.states.values() if _stale(s, fresh)]
    pool.catalogue.replace_with(fresh)
    for entry in fresh.entries.values():
        state = pool.states.get(entry.id)
        if state is None:
            pool.states[entry.id] = ModelState(entry)
            continue
        state.entry = entry  # a stale one's next load starts from it
        if state.status == FAILED:
            state.status, state.failure = UNLOADED, None
    gone = [model_id for model_id in pool.states if model_id not in fresh.entries]
    for model_id in gone:
        if pool.states[model_id].child is None:
            pool.forget(model_id)
    await asyncio.gather(*(pool.stop(s, reason="reload") for s in stale))
    for model_id in gone:
        pool.forget(model_id)
    log.info("router.reloaded", models=sorted(fresh.entries), stopped=[s.id for s in stale], removed=gone)
    pool.events.publish("*", "models_reload")
