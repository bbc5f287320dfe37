"""LoRA adapters (llama.cpp's GGUF adapters, `--lora`): loading, checking against the base, applying.

An adapter file (convert_lora_to_gguf.py's layout) has `general.type = adapter`, `adapter.type = lora`,
`adapter.lora.alpha` and the base's `general.architecture`; per adapted matrix W (`NAME.weight`) a pair
`NAME.weight.lora_a` [rank, n_in] and `.lora_b` [n_out, rank]. A projection's output becomes
W x + s B (A x) with s = scale * alpha / rank (scale where alpha is 0): llama.cpp's build_lora_mm, the
low-rank term added after the base matmul and before the bias.

Per request: a batch's rows each carry their adapter set ((adapter id, scale), ...; `Batch.lora_rows`
groups the rows by (id, scale)). The base matmul runs once over every row, then each (adapter, scale)'s
low-rank term only over its rows (as the MoE code runs each expert over the rows routed to it), in
adapter-id order; a row's result depends on its own set only.

Activated LoRA (aLoRA: `adapter.alora.invocation_tokens`), as llama-server runs it: where every adapter
of a request's set is an aLoRA (one at most), it applies from one token before the last occurrence of its
invocation sequence in the prompt (`activation`); the rows before that position run as the base's
(`BatchPart.lora_from`), so their cells are the base's and are reused as such by slots and the prompt
cache (`shared_cells`); a prompt without the invocation runs as the base. The kernels are the backend's
`lora_add` (engine/cpu/lora.py, engine/cuda/lora.py).

At runtime (the server's /v1/load_lora_adapter): `LoraContext.add` and `retire` swap the id -> adapter
table for a new one (a forward pass reads whichever table is current; an id, once given, always names the
same adapter). A retired adapter stays reachable through a weak reference while a request that runs under
it holds it (GenerationRequest.lora_hold), and is freed when the last such request ends.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.gguf import GGUFFile
from engine.quant import dequantize

if TYPE_CHECKING:
    from engine.backend import Backend

GGML_F32, GGML_F16 = 0, 1
# The decoders whose projections take adapters (LlamaModel.run hands them each pass's rows); the others'
# own forward passes (Gemma 4, the Qwen3.5 hybrids, the encoders) are not wired for them.
LORA_ARCHS = ("llama", "mistral3", "gemma3", "qwen2", "qwen3", "phi3")
# An adapter set: (adapter id, scale) pairs, scale != 0, by id (what a request runs under; () the base).
AdapterSet = tuple[tuple[int, float], ...]


class LoraError(ValueError):
    """An adapter that cannot be applied to this model (one line naming the file and why)."""


def adapter_digest(adapter: LoraAdapter) -> bytes:
    """16 bytes naming an adapter across servers (slot files): sha256 over its file's name, as a slot
    file names its model."""
    return hashlib.sha256(adapter.path.name.encode()).digest()[:16]


def lora_context(model: Any) -> LoraContext | None:
    """The adapters attach_adapters hooked into `model` (None: it never took adapters)."""
    return getattr(model, "lora", None)


def adapter_set(pairs: Sequence[tuple[int, float]]) -> AdapterSet:
    """The canonical set: zero scales dropped, one entry per id (the last given), sorted by id."""
    by_id = {int(i): float(s) for i, s in pairs}
    return tuple((i, s) for i, s in sorted(by_id.items()) if s != 0.0)


@dataclass(frozen=True)
class LoraWeight:
    a: np.ndarray  # float32 [rank, n_in]
    b: np.ndarray  # float32 [n_out, rank] (after init a view of bt)
    f16: bool  # stored as F16: llama.cpp's dot products round the inputs to float16
    # B transposed, [rank, n_out] contiguous: the CPU kernel's up-projection walks it a row per rank
    # (engine/cpu/lora.py says why)
    bt: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # b becomes bt's transposed view, so B is held once (four rank-16 adapters of Qwen2.5-Coder 1.5B:
        # RssAnon +439 MiB with both copies, +287 MiB now, of which a and bt are 282 MiB)
        object.__setattr__(self, "bt", np.ascontiguousarray(self.b.T))
        object.__setattr__(self, "b", self.bt.T)

    @property
    def rank(self) -> int:
        return int(self.b.shape[1])


@dataclass(frozen=True)
class LoraAdapter:
    path: Path
    alpha: float
    weights: Mapping[str, LoraWeight]  # by the base matrix's tensor name
    # llama.cpp's adapter metadata (`adapter.lora.task_name`, `.prompt_prefix`): /lora-adapters shows them;
    # a task name is also the name an adapter loaded without one is served as a model under
    task_name: str = ""
    prompt_prefix: str = ""
    # an activated LoRA's (aLoRA) `adapter.alora.invocation_tokens`: () for a plain adapter
    invocation_tokens: tuple[int, ...] = ()

    def scale_for(self, w: LoraWeight, scale: float) -> float:
        """llama.cpp's llama_adapter_lora_weight::get_scale, in float32."""
        s, alpha = np.float32(scale), np.float32(self.alpha)
        return float(s * alpha / np.float32(w.rank) if alpha else s)


def _matrix(t: Any) -> tuple[np.ndarray, bool]:
    if t.ggml_type == GGML_F32:
        return np.array(t.data, dtype=np.float32), False
    if t.ggml_type == GGML_F16:
        return np.asarray(t.data).astype(np.float32), True
    return dequantize(t.data, t.ggml_type, t.shape).astype(np.float32), False


def load_adapter(path: str | Path, base: GGUFFile) -> LoraAdapter:
    """Read and check a GGUF LoRA adapter against the base model's file; LoraError (one line) if it
    does not fit: not an adapter, another architecture, a matrix the base lacks, a shape that differs."""
    path = Path(path)
    try:
        g = GGUFFile(path)
    except Exception as exc:
        raise LoraError(f"LoRA adapter {path}: cannot be read ({exc})") from exc
    meta = g.metadata

    def fail(why: str) -> LoraError:
        return LoraError(f"LoRA adapter {path}: {why}")

    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        kind = f"general.type {meta.get('general.type')!r}, adapter.type {meta.get('adapter.type')!r}"
        raise fail(f"not a LoRA adapter ({kind})")
    arch, base_arch = meta.get("general.architecture"), base.metadata.get("general.architecture")
    if arch != base_arch:
        raise fail(f"is for architecture {arch!r}, the model is {base_arch!r}")
    pairs: dict[str, dict[str, Any]] = {}
    for name, t in g.tensors.items():
        stem, _, part = name.rpartition(".")
        if part not in ("lora_a", "lora_b"):
            raise fail(f"tensor {name!r} has an unexpected suffix")
        pairs.setdefault(stem, {})[part] = t
    weights: dict[str, LoraWeight] = {}
    for stem, pair in sorted(pairs.items()):
        if len(pair) != 2:
            raise fail(f"tensor pair for {stem!r} is missing one component")
        if stem == "token_embd.weight":
            raise fail("a LoRA on token_embd is not supported by Llamba")
        w = dict.get(base.tensors, stem)  # not marked as read: the model's load check is done
        if w is None:
            raise fail(f"tensor {stem!r} does not exist in the model (wrong base model?)")
        a, b = pair["lora_a"], pair["lora_b"]
        n_out, n_in = w.shape
        if a.shape[1] != n_in or b.shape[0] != n_out or a.shape[0] != b.shape[1]:
            raise fail(
                f"{stem!r} has lora_a {list(a.shape)} and lora_b {list(b.shape)}, the model's matrix is"
                f" {list(w.shape)} (wrong base model?)"
            )
        a_f32, a16 = _matrix(a)
        b_f32, b16 = _matrix(b)
        weights[stem] = LoraWeight(np.ascontiguousarray(a_f32), np.ascontiguousarray(b_f32), a16 and b16)
    alpha = float(meta.get("adapter.lora.alpha", 0.0))
    invocation = tuple(int(t) for t in meta.get("adapter.alora.invocation_tokens", ()))
    text = {k: str(meta.get(f"adapter.lora.{k}", "")) for k in ("task_name", "prompt_prefix")}
    return LoraAdapter(path, alpha, weights, invocation_tokens=invocation, **text)


def shared_cells(held: AdapterSet, held_from: int, wanted: AdapterSet, wanted_from: int) -> float:
    """How many leading cells computed under adapter set `held` from position `held_from` on (the base
    below it) serve a request under `wanted` from `wanted_from`: all of them (inf) under the same set from
    the same position, else those below the first position where either applies an adapter (an aLoRA's
    prefix is the base's, and can be reused from a base prompt and back)."""
    if held == wanted and (not held or held_from == wanted_from):
        return math.inf
    return min(held_from if held else math.inf, wanted_from if wanted else math.inf)


def last_occurrence(tokens: Sequence[int], pattern: Sequence[int]) -> int:
    """Where the last occurrence of `pattern` in `tokens` starts (-1: none), found as llama-server scans
    for an aLoRA's invocation: backwards, one token at a time, a mismatch restarting at the pattern's last
    token without comparing that token again (so in [A, B, B] it misses [A, B]: its answer, kept)."""
    want = len(pattern) - 1
    for i in range(len(tokens) - 1, -1, -1):
        if tokens[i] == pattern[want]:
            if want == 0:
                return i
            want -= 1
        else:
            want = len(pattern) - 1
    return -1


def activation(
    lora: AdapterSet, adapters: Mapping[int, LoraAdapter], prompt: Sequence[int]
) -> tuple[AdapterSet, int]:
    """A request's adapter set and the position its adapters apply from, as llama-server's
    launch_slot_with_task reads aLoRAs: only where every adapter of the set is an aLoRA (with a plain one
    among them the aLoRA applies throughout), the set must hold one (LoraError otherwise, llama-server's
    400); its invocation sequence's last occurrence in the prompt starting at i, the adapter applies from
    position i - 1 on (llama-server processes the tokens before i - 1 without it: convert_lora_to_gguf.py
    drops the invocation string's first token, which the adapters were trained to activate at), and where
    the prompt has no occurrence the request runs as the base."""
    invocations = [adapters[i].invocation_tokens if i in adapters else () for i, _ in lora]
    if not lora or not all(invocations):
        return lora, 0
    if len(lora) != 1:
        raise LoraError("Cannot run multiple aLoRAs in a single request")
    start = last_occurrence(prompt, invocations[0])
    return ((), 0) if start < 0 else (lora, max(0, start - 1))


@dataclass
class LoraContext:
    """A model's adapters (by id) and, during a forward pass, which rows run under which (adapter, scale)."""

    backend: Backend
    adapters: Mapping[int, LoraAdapter]  # replaced whole, never changed in place (add, retire)
    rows: tuple[tuple[int, float, np.ndarray], ...] = ()
    hooked: set[str] = field(default_factory=set)
    # unloaded adapters still held by running requests (GenerationRequest.lora_hold)
    retired: weakref.WeakValueDictionary[int, LoraAdapter] = field(
        default_factory=weakref.WeakValueDictionary
    )

    def adapter(self, adapter_id: int) -> LoraAdapter:
        found = self.adapters.get(adapter_id)
        return found if found is not None else self.retired[adapter_id]

    def check(self, adapter: LoraAdapter, model_name: str = "the model") -> None:
        """LoraError unless every matrix the adapter adapts is one of the projections hooked here."""
        missing = sorted(set(adapter.weights) - self.hooked)
        if missing:
            raise LoraError(
                f"LoRA adapter {adapter.path}: Llamba does not apply adapters to {missing[0]!r} of"
                f" {model_name} ({len(missing)} such matrices)"
            )

    def add(self, adapter_id: int, adapter: LoraAdapter) -> None:
        """Serve `adapter` under a new id (a new table: passes under way keep reading theirs)."""
        if adapter_id in self.adapters or adapter_id in self.retired:
            raise ValueError(f"LoRA adapter id {adapter_id} is taken")
        self.check(adapter)
        self.adapters = {**self.adapters, adapter_id: adapter}

    def retire(self, adapter_id: int) -> None:
        """Stop serving an id: its adapter lives on while running requests hold it."""
        adapter = self.adapters[adapter_id]
        self.retired[adapter_id] = adapter
        self.adapters = {i: a for i, a in self.adapters.items() if i != adapter_id}

    def apply(self, spans: tuple[tuple[str, int], ...], x: Any, out: Any) -> None:
        """After a projection's matmul of x into out (columns: each matrix of `spans`, (name, width)):
        every (adapter, scale) of this pass over its rows."""
        for adapter_id, scale, rows in self.rows:
            adapter = self.adapter(adapter_id)
            col = 0
            for name, width in spans:
                w = adapter.weights.get(name)
                if w is not None:
                    s = adapter.scale_for(w, scale)
                    self.backend.lora_add(x, rows, w, s, out, col)  # type: ignore[misc]
                col += width


def attach_adapters(model: Any, adapters: Sequence[LoraAdapter] | Mapping[int, LoraAdapter]) -> LoraContext:
    """Hook the adapters (a list: ids 0, 1, ...; or by id) into the model's projections; LoraError where
    the backend has no LoRA kernel or an adapter's matrix is not one of the projections Llamba applies
    them to. With no adapters it readies the model for adapters loaded later (LoraContext.add)."""
    backend = model.backend
    arch = getattr(getattr(model, "hp", None), "arch", "?")
    if arch not in LORA_ARCHS:
        raise LoraError(f"LoRA adapters apply to {', '.join(LORA_ARCHS)} models only: this one is {arch!r}")
    if backend.lora_add is None:
        raise LoraError(
            "LoRA adapters run on the CPU and CUDA backends only:"
            f" the {backend.name} backend has no LoRA kernel"
        )
    by_id = dict(adapters) if isinstance(adapters, Mapping) else dict(enumerate(adapters))
    ctx = LoraContext(backend, by_id)
    projections = [p for layer in getattr(model, "layers", []) for p in _projections(layer)]
    for projection in projections:
        for group in projection.groups:
            ctx.hooked.update(name for name, _ in group.spans)
    for adapter in by_id.values():
        ctx.check(adapter, type(model).__name__)
    for projection in projections:
        projection.lora = ctx
    model.lora = ctx
    return ctx


def _projections(layer: Any) -> list[Any]:
    return list(layer.projections()) if hasattr(layer, "projections") else []
