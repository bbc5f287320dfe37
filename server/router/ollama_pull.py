"""Ollama's `POST /api/pull` and `DELETE /api/delete` in router mode, over the router's downloads
(server/router/downloads.py): only the catalogue's models, nothing from a model hub or Ollama's registry.

A pull answers in Ollama's progress shape: `pulling manifest`, then the model's one layer (`pulling
<digest>` with `digest`, `total` and `completed` bytes, every half second while the file comes), then
`verifying sha256 digest`, `writing manifest` and `success`. A built-in model missing from the cache is
fetched as `POST /models` fetches it (a fetch already under way, or a loading child's own, is followed
instead); a model already here (any source) is one layer with all its bytes done. A name the catalogue
lacks, or a model that is neither here nor a built-in one, fails as Ollama's pull of a name its registry
lacks does (`pull model manifest: file does not exist`): a last `{"error"}` line of the stream, or a 500
without `stream`. Leaving the stream does not cancel the fetch (`POST /models/unload` does).

A delete removes a model the caches hold (`DELETE /models`' logic: a built-in model's file, a llama.cpp
cache model's entries); 404 when the model is not here, 400 for a model of `--models-dir` or a preset.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio

from engine.model_files import ModelSpec, lookup
from server.http import errors, ndjson
from server.router.downloads import cache_files, is_cached
from server.router.local_models import local_model, model_path
from server.router.state import DOWNLOADING, FAILED, LOADING, UNLOADED, ModelState

if TYPE_CHECKING:
    from server.router.app import Router

PROGRESS_S = 0.5  # between two progress lines of a fetch
NOT_IN_REGISTRY = "pull model manifest: file does not exist"


async def pull_reply(router: Router, name: str, stream: bool) -> Any:
    """The pull's NDJSON progress, or (`stream` false) its last status alone."""
    events = pull_events(router, name)
    if stream:
        return ndjson.response(ndjson.line(event) async for event in events)
    last: dict[str, Any] = {}
    async for event in events:
        last = event
    return last


async def pull_events(router: Router, name: str) -> AsyncIterator[dict[str, Any]]:
    yield {"status": "pulling manifest"}
    entry = router.catalogue.resolve(name)
    if entry is None:
        raise _failed(NOT_IN_REGISTRY)
    spec = lookup(entry.model)
    if spec is None:  # a cache, folder or preset file: it is here or nowhere
        found = await anyio.to_thread.run_sync(local_model, entry)
        if found is None:
            raise _failed(NOT_IN_REGISTRY)
        yield layer(found.digest, found.size, found.size)
    else:
        async for event in _fetch(router, _builtin_state(router, entry.id, spec), spec):
            yield event
    for status in ("verifying sha256 digest", "writing manifest", "success"):
        yield {"status": status}


def _builtin_state(router: Router, entry_id: str, spec: ModelSpec) -> ModelState:
    """The built-in model's own state (a preset section that names it is fetched through it)."""
    own = router.pool.states[entry_id]
    if own.entry.source == "builtin":
        return own
    builtin = router.pool.states.get(spec.name)
    return builtin if builtin is not None and builtin.entry.source == "builtin" else own


async def _fetch(router: Router, state: ModelState, spec: ModelSpec) -> AsyncIterator[dict[str, Any]]:
    if not is_cached(spec):
        if state.status in (UNLOADED, FAILED):
            try:
                router.downloads.start(state, spec.name)
            except errors.APIError as exc:
                raise _failed(exc.message) from None
        while state.status in (DOWNLOADING, LOADING) and not is_cached(spec):
            yield layer(spec.sha256, spec.size, _partial_size(spec))
            await asyncio.sleep(PROGRESS_S)
        if not is_cached(spec):
            why = router.downloads.last_message.get(state.id) or f"model '{state.id}' is {state.status}"
            raise _failed(f"pull model: {why}")
    yield layer(spec.sha256, spec.size, spec.size)


def layer(digest: str, total: int, completed: int) -> dict[str, Any]:
    """One layer's progress as Ollama reports it (`completed` left out until some bytes are)."""
    event: dict[str, Any] = {"status": f"pulling {digest[:12]}", "digest": f"sha256:{digest}", "total": total}
    return event | {"completed": completed} if completed else event


def _partial_size(spec: ModelSpec) -> int:
    try:
        return cache_files(spec)[2].stat().st_size
    except OSError:
        return 0


def _failed(message: str) -> errors.APIError:
    return errors.APIError(500, message, "server_error")


async def delete_model(router: Router, name: str) -> None:
    entry = router.catalogue.resolve(name)
    state = router.pool.states.get(entry.id) if entry is not None else None
    if entry is None or state is None or await anyio.to_thread.run_sync(model_path, entry) is None:
        raise errors.not_found(f"model '{name}' not found")
    await router.downloads.remove(state)
