"""Slot files: one slot's cached tokens and K/V cells on disk (`--slot-save-path`).

`slot_action` runs the save/restore/erase actions of `POST /slots/<id>` on the engine thread.

Layout (little endian): a fixed header, then n_tokens int32 token ids, then the K cells and the V cells,
each [n_layer, n_kv_heads, n_tokens, row] in its cache type (f16: head_dim float16; q8_0: ggml's Q8_0
blocks, engine/memory/kv_types.py), then, for a model with recurrent layers (engine/memory/hybrid.py),
their float32 conv and ssm states [n_recurrent_layer, ...] (the identity gives their shapes).
The header names the model and the cache types the cells belong to, so a
file from another model or cache type is refused instead of silently poisoning the slot. After it, the
LoRA adapter set the cells were computed under (engine/lora.py): each adapter by its file's name and its
scale, and the position it applies from (an aLoRA's activation); a restore maps them onto the adapters
this server has loaded (refused when one is missing), so a prefix computed under an adapter is never
reused under another set after a restore. Version 3 files (before adapters were recorded) read as the
base model's.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.lora import AdapterSet, LoraContext, adapter_digest, adapter_set
from engine.memory.base import MemoryState, SequenceMemory
from engine.memory.hybrid import HybridMemory
from engine.memory.kv import DEFAULT_CACHE_TYPES, CacheTypes, KVCache
from engine.memory.kv_types import CacheType
from engine.slots import Slot

MAGIC = b"LLMBSLOT"
VERSION = 4  # 4: the LoRA adapter set; 3: the cache types in the header (2: float16 cells only, 1: float32)
READABLE = (3, 4)
# magic, version, n_layer, n_kv_heads, head_dim, n_vocab, model, k and v ggml types, n
_HEADER = struct.Struct("<8sIIIII16sIII")
_ADAPTERS = struct.Struct("<II")  # how many adapters, the position they apply from
_ADAPTER = struct.Struct("<16sd")  # an adapter: 16 bytes of sha256 over its file's name, its scale
# a LoRA set as a file records it: (engine/lora.py's adapter_digest, scale) pairs; () the base model
SavedAdapters = tuple[tuple[bytes, float], ...]


class SlotFileError(ValueError):
    """A file that can't be restored (missing, corrupt, truncated, another model's, too long)."""


class SlotBusyError(RuntimeError):
    """The slot is serving a request: its cells are changing under us."""


@dataclass(frozen=True)
class ModelIdentity:
    n_layer: int
    n_kv_heads: int
    head_dim: int
    n_vocab: int
    model_hash: bytes  # 16 bytes of sha256 over the model file's name
    types: CacheTypes = DEFAULT_CACHE_TYPES
    conv_shape: tuple[int, ...] = ()  # [n_recurrent_layer, ...] of a hybrid model's states; () none
    ssm_shape: tuple[int, ...] = ()

    @classmethod
    def of(cls, memory: SequenceMemory, n_vocab: int, model_name: str) -> ModelIdentity:
        digest = hashlib.sha256(model_name.encode()).digest()[:16]
        kv = memory.kv if isinstance(memory, HybridMemory) else memory
        if not isinstance(kv, KVCache):  # an encoder's StatelessMemory: no cells, no slot files
            return cls(0, 0, 0, n_vocab, digest)
        identity = cls(kv.n_layer, kv.n_kv_heads, kv.head_dim, n_vocab, digest, kv.types)
        if isinstance(memory, HybridMemory):
            rec = memory.recurrent
            conv, ssm = rec.conv.shape, rec.ssm.shape
            identity = replace(identity, conv_shape=(conv[0], *conv[2:]), ssm_shape=(ssm[0], *ssm[2:]))
        return identity

    @property
    def recurrent_bytes(self) -> int:
        return 4 * (int(np.prod(self.conv_shape)) + int(np.prod(self.ssm_shape))) if self.conv_shape else 0

    def cells_shape(self, t: CacheType, n: int) -> tuple[int, int, int, int]:
        return (self.n_layer, self.n_kv_heads, n, t.row_size(self.head_dim))


@dataclass(frozen=True)
class SlotState:
    tokens: list[int]
    k: np.ndarray  # [n_layer, n_kv_heads, n_tokens, row] in the cache's key type (KVCache.read_cells)
    v: np.ndarray
    conv: np.ndarray | None = None  # a hybrid model's recurrent state (float32), else None
    ssm: np.ndarray | None = None
    adapters: SavedAdapters = ()  # the LoRA set the cells were computed under
    adapters_from: int = 0  # the position the set applies from (the cells below: the base's)

    def memory(self) -> MemoryState:
        return MemoryState(len(self.tokens), self.k, self.v, self.conv, self.ssm)


def check_filename(name: object) -> str:
    """A plain file name inside the save directory; anything that could leave it is refused."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise SlotFileError("Invalid filename")
    if "/" in name or "\\" in name or ".." in name or "\0" in name:
        raise SlotFileError("Invalid filename: it must be a plain name, without path separators or '..'")
    return name


def slot_path(save_dir: Path, name: object) -> Path:
    """The file `name` in `save_dir`, refused when it is a symlink leading out of the directory."""
    path = save_dir / check_filename(name)
    if not path.resolve().is_relative_to(save_dir.resolve()):
        raise SlotFileError("Invalid filename: it is a link that leads out of the slot directory")
    return path


def write_slot(path: Path, identity: ModelIdentity, state: SlotState) -> int:
    """Write the slot file (via a temporary name, so a crash never leaves half a file); bytes written."""
    n = len(state.tokens)
    header = _HEADER.pack(
        MAGIC,
        VERSION,
        identity.n_layer,
        identity.n_kv_heads,
        identity.head_dim,
        identity.n_vocab,
        identity.model_hash,
        identity.types.k.ggml_type,
        identity.types.v.ggml_type,
        n,
    )
    parts = [
        header,
        _ADAPTERS.pack(len(state.adapters), state.adapters_from),
        *(_ADAPTER.pack(digest, scale) for digest, scale in state.adapters),
        np.asarray(state.tokens, dtype="<i4").tobytes(),
        np.ascontiguousarray(state.k, dtype=identity.types.k.dtype.newbyteorder("<")).tobytes(),
        np.ascontiguousarray(state.v, dtype=identity.types.v.dtype.newbyteorder("<")).tobytes(),
    ]
    if state.conv is not None and state.ssm is not None:
        parts += [np.ascontiguousarray(a, dtype="<f4").tobytes() for a in (state.conv, state.ssm)]
    tmp = path.with_name(path.name + ".tmp")
    # O_NOFOLLOW: a link planted at the temporary name must not send the bytes elsewhere (the final
    # rename replaces a link at `path` itself, never its target).
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(parts))
        tmp.replace(path)
    except OSError as exc:
        raise SlotFileError(f"failed to save slot: cannot write {path.name!r}: {exc.strerror}") from None
    return sum(len(p) for p in parts)


def read_slot(path: Path, identity: ModelIdentity, n_ctx: int) -> tuple[SlotState, int]:
    """The slot state in `path` and the bytes read; SlotFileError when it can't be used as is."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SlotFileError(f"failed to restore slot: file {path.name!r} not found") from None
    except OSError as exc:
        raise SlotFileError(f"failed to restore slot: cannot read {path.name!r}: {exc.strerror}") from None
    if len(data) < _HEADER.size:
        raise SlotFileError(f"failed to restore slot: {path.name!r} is truncated or not a slot file")
    magic, version = struct.unpack_from("<8sI", data)
    if magic != MAGIC:
        raise SlotFileError(f"failed to restore slot: {path.name!r} is not a slot file")
    if version not in READABLE:
        raise SlotFileError(f"failed to restore slot: unsupported slot file version {version}")
    _, _, n_layer, n_kv, head_dim, n_vocab, model_hash, k_type, v_type, n = _HEADER.unpack_from(data)
    header = ModelIdentity(n_layer, n_kv, head_dim, n_vocab, model_hash, identity.types)
    if replace(header, conv_shape=identity.conv_shape, ssm_shape=identity.ssm_shape) != identity:
        raise SlotFileError(f"failed to restore slot: {path.name!r} was saved with a different model")
    if (k_type, v_type) != (identity.types.k.ggml_type, identity.types.v.ggml_type):
        raise SlotFileError(f"failed to restore slot: {path.name!r} was saved with other KV cache types")
    if n > n_ctx:
        raise SlotFileError(f"failed to restore slot: {n} tokens do not fit the slot's {n_ctx} cells")
    adapters, adapters_from, off = _read_adapters(data, path) if version >= 4 else ((), 0, _HEADER.size)
    state, n_read = _read_cells(data, off, path, identity, n)
    return replace(state, adapters=adapters, adapters_from=adapters_from), n_read


def _read_adapters(data: bytes, path: Path) -> tuple[SavedAdapters, int, int]:
    """The LoRA set after the header: (adapters, the position they apply from, where the tokens start)."""
    off = _HEADER.size + _ADAPTERS.size
    if len(data) < off:
        raise SlotFileError(f"failed to restore slot: {path.name!r} is truncated or corrupt")
    n_adapters, adapters_from = _ADAPTERS.unpack_from(data, _HEADER.size)
    end = off + n_adapters * _ADAPTER.size
    if len(data) < end:
        raise SlotFileError(f"failed to restore slot: {path.name!r} is truncated or corrupt")
    adapters = tuple(_ADAPTER.unpack_from(data, off + i * _ADAPTER.size) for i in range(n_adapters))
    return adapters, adapters_from, end


def _read_cells(data: bytes, off: int, path: Path, identity: ModelIdentity, n: int) -> tuple[SlotState, int]:
    """The tokens and cells from `off` on, after a checked header."""
    k_shape = identity.cells_shape(identity.types.k, n)
    v_shape = identity.cells_shape(identity.types.v, n)
    k_dtype = identity.types.k.dtype.newbyteorder("<")
    v_dtype = identity.types.v.dtype.newbyteorder("<")
    k_bytes = int(np.prod(k_shape)) * k_dtype.itemsize
    v_bytes = int(np.prod(v_shape)) * v_dtype.itemsize
    if len(data) != off + 4 * n + k_bytes + v_bytes + identity.recurrent_bytes:
        raise SlotFileError(f"failed to restore slot: {path.name!r} is truncated or corrupt")
    tokens = np.frombuffer(data, "<i4", n, off)
    if n and (tokens.min() < 0 or tokens.max() >= identity.n_vocab):
        raise SlotFileError(f"failed to restore slot: {path.name!r} holds invalid token ids")
    k = np.frombuffer(data, k_dtype, int(np.prod(k_shape)), off + 4 * n).reshape(k_shape)
    v = np.frombuffer(data, v_dtype, int(np.prod(v_shape)), off + 4 * n + k_bytes).reshape(v_shape)
    state = SlotState([int(t) for t in tokens], k, v)
    if identity.conv_shape:
        off += 4 * n + k_bytes + v_bytes
        n_conv = int(np.prod(identity.conv_shape))
        conv = np.frombuffer(data, "<f4", n_conv, off).reshape(identity.conv_shape)
        ssm = np.frombuffer(data, "<f4", int(np.prod(identity.ssm_shape)), off + 4 * n_conv)
        state = replace(state, conv=conv, ssm=ssm.reshape(identity.ssm_shape))
    return state, len(data)


SLOT_ACTIONS = ("save", "restore", "erase")


def slot_action(
    slot: Slot,
    memory: SequenceMemory,
    identity: ModelIdentity,
    action: str,
    path: Path | None,
    lora: LoraContext | None = None,
) -> dict[str, Any]:
    """save/restore/erase `slot`'s cells (`path`: the slot file); llama-server's reply fields.

    Runs between two steps on the engine thread. SlotBusyError for a slot serving a request (its cells
    are changing), SlotFileError for a file that can't be used (checked before the slot is touched).
    `lora`: the model's adapters (None: it has none), which a file's adapter set is saved and restored by.
    """
    if slot.busy:
        raise SlotBusyError("Slot is busy")
    if action == "erase":
        n_erased, slot.tokens = len(slot.tokens), []
        memory.clear(slot.id)
        return {"id_slot": slot.id, "n_erased": n_erased}
    if action not in ("save", "restore") or path is None:
        raise SlotFileError(f"Invalid action {action!r}")
    if memory.whole_inputs:  # engine/memory/stateless.py
        raise SlotFileError("this model keeps no memory in its slots: there is nothing to save or restore")
    start = time.perf_counter()
    if action == "save":
        n = min(len(slot.tokens), int(memory.lengths[slot.id]))
        adapters = _saved_adapters(slot.lora, lora)
        held = memory.read(slot.id, n)
        assert held.k is not None and held.v is not None
        state = SlotState(slot.tokens[:n], held.k, held.v, held.conv, held.ssm, adapters, slot.lora_from)
        n_bytes = write_slot(path, identity, state)
        counts = {"n_saved": n, "n_written": n_bytes}
    else:
        state, n_bytes = read_slot(path, identity, memory.n_ctx)
        adapter_ids = _served_adapters(state.adapters, lora, path.name)
        memory.write(slot.id, state.memory())
        slot.tokens = state.tokens
        slot.lora, slot.lora_from = adapter_ids, state.adapters_from if adapter_ids else 0
        counts = {"n_restored": len(state.tokens), "n_read": n_bytes}
    ms = 1e3 * (time.perf_counter() - start)
    return {"id_slot": slot.id, "filename": path.name, **counts, "timings": {f"{action}_ms": ms}}


def _saved_adapters(adapters: AdapterSet, lora: LoraContext | None) -> SavedAdapters:
    """A slot's adapter set as a file records it; SlotFileError for an adapter unloaded since."""
    try:
        return tuple((adapter_digest(lora.adapter(i)), scale) for i, scale in adapters) if lora else ()
    except KeyError:
        raise SlotFileError(
            "failed to save slot: its cells were computed under a LoRA adapter that has been unloaded"
        ) from None


def _served_adapters(saved: SavedAdapters, lora: LoraContext | None, name: str) -> AdapterSet:
    """A file's adapter set as this server's ids; SlotFileError where one of them is not loaded here."""
    ids: dict[bytes, int] = {}
    for i, adapter in sorted((lora.adapters if lora else {}).items(), reverse=True):
        ids[adapter_digest(adapter)] = i  # the lowest id of two files with one name
    missing = [digest for digest, _ in saved if digest not in ids]
    if missing:
        raise SlotFileError(
            f"failed to restore slot: {name!r} was saved under a LoRA adapter this server has not loaded"
        )
    return adapter_set([(ids[digest], scale) for digest, scale in saved])
