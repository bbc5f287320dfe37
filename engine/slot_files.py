"""Slot files: one slot's cached tokens and K/V cells on disk (`--slot-save-path`).

`slot_action` runs the save/restore/erase actions of `POST /slots/<id>` on the engine thread.

Layout (little endian): a fixed header, then n_tokens int32 token ids, then the K cells and the V cells,
each float16 [n_layer, n_kv_heads, n_tokens, head_dim]. The header names the model the cells belong to,
so a file from another model is refused instead of silently poisoning the slot.
"""

from __future__ import annotations

import hashlib
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.kv import KVCache
from engine.slots import Slot

MAGIC = b"LLMBSLOT"
VERSION = 2  # 2: cells are float16 (1 held float32)
CELL = np.dtype("<f2")
_HEADER = struct.Struct("<8sIIIII16sI")  # magic, version, n_layer, n_kv_heads, head_dim, n_vocab, model, n


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

    @classmethod
    def of(cls, kv_shape: tuple[int, ...], n_vocab: int, model_name: str) -> ModelIdentity:
        n_layer, _, n_kv_heads, _, head_dim = kv_shape
        digest = hashlib.sha256(model_name.encode()).digest()[:16]
        return cls(n_layer, n_kv_heads, head_dim, n_vocab, digest)


@dataclass(frozen=True)
class SlotState:
    tokens: list[int]
    k: np.ndarray  # float16 [n_layer, n_kv_heads, n_tokens, head_dim]
    v: np.ndarray


def check_filename(name: object) -> str:
    """A plain file name inside the save directory; anything that could leave it is refused."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise SlotFileError("Invalid filename")
    if "/" in name or "\\" in name or ".." in name or "\0" in name:
        raise SlotFileError("Invalid filename: it must be a plain name, without path separators or '..'")
    return name


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
        n,
    )
    parts = [
        header,
        np.asarray(state.tokens, dtype="<i4").tobytes(),
        np.ascontiguousarray(state.k, dtype=CELL).tobytes(),
        np.ascontiguousarray(state.v, dtype=CELL).tobytes(),
    ]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(b"".join(parts))
    tmp.replace(path)
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
    magic, version, n_layer, n_kv, head_dim, n_vocab, model_hash, n = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SlotFileError(f"failed to restore slot: {path.name!r} is not a slot file")
    if version != VERSION:
        raise SlotFileError(f"failed to restore slot: unsupported slot file version {version}")
    found = ModelIdentity(n_layer, n_kv, head_dim, n_vocab, model_hash)
    if found != identity:
        raise SlotFileError(f"failed to restore slot: {path.name!r} was saved with a different model")
    if n > n_ctx:
        raise SlotFileError(f"failed to restore slot: {n} tokens do not fit the slot's {n_ctx} cells")
    cells = n_layer * n_kv * n * head_dim
    if len(data) != _HEADER.size + 4 * n + 2 * CELL.itemsize * cells:
        raise SlotFileError(f"failed to restore slot: {path.name!r} is truncated or corrupt")
    off = _HEADER.size
    tokens = np.frombuffer(data, "<i4", n, off)
    if n and (tokens.min() < 0 or tokens.max() >= n_vocab):
        raise SlotFileError(f"failed to restore slot: {path.name!r} holds invalid token ids")
    shape = (n_layer, n_kv, n, head_dim)
    k = np.frombuffer(data, CELL, cells, off + 4 * n).reshape(shape)
    v = np.frombuffer(data, CELL, cells, off + 4 * n + CELL.itemsize * cells).reshape(shape)
    return SlotState([int(t) for t in tokens], k, v), len(data)


SLOT_ACTIONS = ("save", "restore", "erase")


def slot_action(
    slot: Slot, kv: KVCache, identity: ModelIdentity, action: str, path: Path | None
) -> dict[str, Any]:
    """save/restore/erase `slot`'s cells (`path`: the slot file); llama-server's reply fields.

    Runs between two steps on the engine thread. SlotBusyError for a slot serving a request (its cells
    are changing), SlotFileError for a file that can't be used (checked before the slot is touched).
    """
    if slot.busy:
        raise SlotBusyError("Slot is busy")
    if action == "erase":
        n_erased, slot.tokens = len(slot.tokens), []
        kv.clear(slot.id)
        return {"id_slot": slot.id, "n_erased": n_erased}
    if action not in ("save", "restore") or path is None:
        raise SlotFileError(f"Invalid action {action!r}")
    start = time.perf_counter()
    if action == "save":
        n = min(len(slot.tokens), int(kv.lengths[slot.id]))
        k, v = kv.read_cells(slot.id, n)
        n_bytes = write_slot(path, identity, SlotState(slot.tokens[:n], k, v))
        counts = {"n_saved": n, "n_written": n_bytes}
    else:
        state, n_bytes = read_slot(path, identity, kv.n_ctx)
        kv.write_cells(slot.id, state.k, state.v)
        slot.tokens = state.tokens
        counts = {"n_restored": len(state.tokens), "n_read": n_bytes}
    ms = 1e3 * (time.perf_counter() - start)
    return {"id_slot": slot.id, "filename": path.name, **counts, "timings": {f"{action}_ms": ms}}
