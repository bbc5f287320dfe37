"""The server's LoRA adapters: llama-server's global scales (--lora, --lora-scaled, /lora-adapters) and
vLLM's adapters served as models (--lora NAME=FILE, --lora-modules, /v1/load_lora_adapter).

`GET /lora-adapters` lists them ({id, path, scale, task_name, prompt_prefix} from the file's metadata,
an aLoRA's alora_invocation_string and alora_invocation_tokens, as llama-server; `name` for a named one);
`POST /lora-adapters` sets the global scales ([{id, scale}]; an adapter not listed goes to 0, as
llama-server's construct_lora_list does). A request's own `lora` ([{id, scale}]) replaces the global scales
for that request (adapters it does not list run at 0); a request without one runs under the global scales
at the time it is built. Unlike llama-server (which skips them), an unknown id or a scale that is not a
number is a 400 naming it.

A named adapter is a model of its own, as vLLM serves LoRA modules: listed in /v1/models with the base
model as its `parent`, and a request whose `model` is its name runs the base under that adapter alone at
scale 1 (the global scales do not apply to it; its own global scale starts at 0, so the base model's
requests do not run under it). Once the server has named adapters, a request's `model` must name the base
model or one of them (vLLM's rule: another name is the route's 404). Named adapters load and unload at
runtime: the file is read and checked off the event loop, then the table of adapters is swapped for a new
one (server/model/lora.py's and the engine's, engine/lora.py's LoraContext): requests running under an
unloaded adapter finish under it, later ones naming it get the 404.

An adapter given without a name (--lora FILE) whose file carries a task name (`adapter.lora.task_name`,
the adapter name llama.cpp reads) is also served as a model under that name (unless another adapter has
it), keeping its global scale; such names alone do not make the server check a request's `model`.

An activated LoRA (aLoRA, `adapter.alora.invocation_tokens`) applies from its invocation in the prompt
on (engine/lora.py's `activation`); a request that enables two of them is a 400, llama-server's.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from engine.lora import (
    AdapterSet,
    LoraAdapter,
    LoraContext,
    LoraError,
    activation,
    adapter_set,
    attach_adapters,
    load_adapter,
)


class LoraRequestError(ValueError):
    """A `lora` list that names no loaded adapter or carries no number (the route's 400)."""


class UnknownAdapter(LookupError):
    """A name that is no loaded adapter (the route's 404)."""


@dataclass(frozen=True)
class Adapter:
    id: int
    path: str
    scale: float  # its global scale (POST /lora-adapters)
    name: str | None = None  # served as a model under this name
    weights: LoraAdapter | None = None  # read with the model (kept while it sleeps)


def _aliased(entries: dict[int, Adapter]) -> dict[int, Adapter]:
    """Unnamed adapters whose file gives a task name, named after it where no other adapter has it."""
    taken = {e.name for e in entries.values() if e.name}
    out = {}
    for i, e in entries.items():
        alias = e.weights.task_name if e.weights and not e.name else ""
        if alias and alias not in taken:
            taken.add(alias)
            e = replace(e, name=alias)
        out[i] = e
    return out


class LoraScales:
    def __init__(
        self, adapters: tuple[tuple[str, float], ...], named: tuple[tuple[str, str], ...] = ()
    ) -> None:
        entries = [Adapter(i, path, float(scale)) for i, (path, scale) in enumerate(adapters)]
        entries += [Adapter(len(entries) + i, path, 0.0, name) for i, (name, path) in enumerate(named)]
        self._entries = {entry.id: entry for entry in entries}  # replaced whole under the lock
        self._next_id = len(entries)
        self.serves_names = bool(named)  # a request's `model` is checked (see the module's docstring)
        self._lock = threading.Lock()
        self._ctx: LoraContext | None = None
        self._base: Any = None  # the model's GGUFFile, which runtime loads are checked against
        self.unavailable: str | None = None  # why this model takes no adapters (a runtime load's 400)
        # token ids -> their text, llama-server's pieces one after another (an aLoRA's invocation string)
        self._render: Callable[[tuple[int, ...]], str] = lambda ids: ""

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def paths(self) -> list[str]:
        return [entry.path for entry in self._entries.values()]

    # -- the model's load ---------------------------------------------------------------------------
    def attach(self, model: Any, base: Any, tokenizer: Any = None) -> None:
        """At each load of the model (a wake too): read the adapters not read yet, hook them all in; one
        line (LoraError) where one does not fit. A model that takes no adapters is fine without any.
        `tokenizer` renders aLoRA invocations for the listing."""
        with self._lock:
            entries = {
                i: e if e.weights else replace(e, weights=load_adapter(e.path, base))
                for i, e in self._entries.items()
            }
            self._entries = entries = _aliased(entries)
        if tokenizer is not None:
            self._render = lambda ids: b"".join(map(tokenizer.token_to_piece, ids)).decode("utf-8", "replace")
        try:
            self._ctx = attach_adapters(model, {i: e.weights for i, e in entries.items() if e.weights})
        except LoraError as exc:
            if entries:
                raise
            self._ctx, self.unavailable = None, str(exc)
        self._base = base

    # -- llama-server's ids and scales ----------------------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        """GET /lora-adapters: llama-server's server_task_result_get_lora::to_json (`name`: Llamba's)."""
        out = []
        for e in self._entries.values():
            w = e.weights
            item = {"id": e.id, "path": e.path, "scale": e.scale}
            item |= {"task_name": w.task_name if w else "", "prompt_prefix": w.prompt_prefix if w else ""}
            if w and w.invocation_tokens:
                item["alora_invocation_string"] = self._render(w.invocation_tokens)
                item["alora_invocation_tokens"] = list(w.invocation_tokens)
            out.append(item | ({"name": e.name} if e.name else {}))
        return out

    def parse(self, value: Any, field: str = "lora") -> dict[int, float]:
        """[{id, scale}, ...] -> {id: scale}; LoraRequestError (one line naming what) if it does not fit."""
        if not isinstance(value, list):
            raise LoraRequestError(f"'{field}' must be an array of objects with 'id' and 'scale' fields")
        entries = self._entries
        out: dict[int, float] = {}
        for entry in value:
            if not isinstance(entry, dict):
                raise LoraRequestError(
                    f"'{field}': each entry must be an object with 'id' and 'scale' fields"
                )
            adapter_id, scale = entry.get("id"), entry.get("scale", 0.0)
            if isinstance(adapter_id, bool) or not isinstance(adapter_id, int):
                raise LoraRequestError(f"'{field}': 'id' must be an integer (got {adapter_id!r})")
            if adapter_id not in entries:
                loaded = f"ids {', '.join(map(str, entries))}" if entries else "none is loaded"
                raise LoraRequestError(f"'{field}': unknown LoRA adapter id {adapter_id} ({loaded})")
            if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
                raise LoraRequestError(
                    f"'{field}': the scale of adapter {adapter_id} is not a number ({scale!r})"
                )
            out[adapter_id] = float(scale)
        return out

    def set_global(self, value: Any) -> None:
        """POST /lora-adapters: the listed scales; every adapter not listed goes to 0 (llama-server's)."""
        scales = self.parse(value)
        with self._lock:
            self._entries = {i: replace(e, scale=scales.get(i, 0.0)) for i, e in self._entries.items()}

    def for_request(self, value: Any, model: str | None = None) -> tuple[AdapterSet, tuple[Any, ...]]:
        """A request's adapter set and the weights it holds while it runs: the named adapter `model` at
        scale 1 (None: no adapter named), else its own `lora` (None: not given -> the global scales)."""
        entries = self._entries
        if model is not None:
            if value is not None:
                raise LoraRequestError(f"'lora' cannot be given with the LoRA adapter model '{model}'")
            found = [e for e in entries.values() if e.name == model]
            if not found:
                raise UnknownAdapter(model)
            pairs = [(found[0].id, 1.0)]
        elif value is None:
            pairs = [(e.id, e.scale) for e in entries.values()]
        else:
            pairs = list(self.parse(value).items())
        chosen = adapter_set(pairs)
        return chosen, tuple(entries[i].weights for i, _ in chosen if i in entries)

    def activated(self, lora: AdapterSet, hold: tuple[Any, ...], prompt: list[int]) -> tuple[AdapterSet, int]:
        """A request's adapter set and the position it applies from, given its prompt (an aLoRA's
        invocation, engine/lora.py's `activation`); LoraRequestError for two aLoRAs at once."""
        try:
            return activation(lora, {i: w for (i, _), w in zip(lora, hold, strict=True)}, prompt)
        except LoraError as exc:
            raise LoraRequestError(str(exc)) from None

    # -- adapters as models ------------------------------------------------------------------------
    def names(self) -> list[tuple[str, str]]:
        """(name, path) of each named adapter, by id: /v1/models' entries."""
        return [(e.name, e.path) for e in self._entries.values() if e.name]

    def is_name(self, model: str) -> bool:
        return any(e.name == model for e in self._entries.values())

    def load(self, name: str, path: str) -> None:
        """vLLM's /v1/load_lora_adapter (run on a worker thread: the file is read and checked here)."""
        if self._ctx is None or self._base is None:
            raise LoraRequestError(self.unavailable or "the model is not loaded")
        if self.is_name(name):
            raise LoraRequestError(f"The lora adapter '{name}' has already been loaded.")
        try:
            weights = load_adapter(path, self._base)
            self._ctx.check(weights)
        except LoraError as exc:
            raise LoraRequestError(str(exc)) from None
        with self._lock:
            if self.is_name(name):
                raise LoraRequestError(f"The lora adapter '{name}' has already been loaded.")
            adapter_id, self._next_id = self._next_id, self._next_id + 1
            self._ctx.add(adapter_id, weights)
            self._entries = {**self._entries, adapter_id: Adapter(adapter_id, path, 0.0, name, weights)}
            self.serves_names = True

    def unload(self, name: str) -> None:
        """vLLM's /v1/unload_lora_adapter: UnknownAdapter when no adapter has that name."""
        with self._lock:
            found = [e.id for e in self._entries.values() if e.name == name]
            if not found:
                raise UnknownAdapter(name)
            self._entries = {i: e for i, e in self._entries.items() if i != found[0]}
            if self._ctx is not None:
                self._ctx.retire(found[0])
