"""The KV cache's cell types (`-ctk/--cache-type-k`, `-ctv/--cache-type-v`): names, layouts, references.

A cell row is one (position, kv head) of keys or values, head_dim numbers:
- f16 (llama.cpp's default): head_dim float16 values;
- q8_0: ggml's Q8_0 blocks along the row, 34 bytes per 32 numbers (a float16 scale d, then 32 int8 q;
  the number is d * q), stored as uint8. Written as ggml's reference `quantize_row_q8_0_ref` rounds
  (and llama.cpp's CUDA backend): d = amax / 127 (stored as float16), q = roundf(x * (1 / d)), ties away
  from zero. (llama.cpp's x86 CPU path multiplies by 127 / amax and rounds ties to even: the two differ
  only where x * id lands within an ulp of a half.)

The numpy functions here are the references the kernels (engine/cpu/kv_cells.py, engine/cuda/ops.py)
are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QK8_0 = 32  # numbers per Q8_0 block
Q8_0_BLOCK_BYTES = 2 + QK8_0


@dataclass(frozen=True)
class CacheType:
    name: str  # llama.cpp's name (`-ctk q8_0`)
    ggml_type: int  # ggml's type id (slot files record it)
    dtype: np.dtype  # element type of the cache array

    def row_size(self, head_dim: int) -> int:
        """Elements of the cache array's last axis for one cell row of head_dim numbers."""
        if self.name == "q8_0":
            return head_dim // QK8_0 * Q8_0_BLOCK_BYTES
        return head_dim


F16 = CacheType("f16", 1, np.dtype(np.float16))
Q8_0 = CacheType("q8_0", 8, np.dtype(np.uint8))
CACHE_TYPES = {t.name: t for t in (F16, Q8_0)}
# What llama-server accepts for -ctk/-ctv; the ones not in CACHE_TYPES are refused by name.
LLAMA_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def cache_type(name: str) -> CacheType:
    """The cell type called `name`; ValueError naming the supported ones otherwise."""
    if name in CACHE_TYPES:
        return CACHE_TYPES[name]
    supported = ", ".join(CACHE_TYPES)
    if name in LLAMA_CACHE_TYPES:
        raise ValueError(f"KV cache type '{name}' is not supported by Llamba (supported: {supported})")
    raise ValueError(f"unknown KV cache type '{name}' (supported: {supported})")


def check_head_dim(t: CacheType, head_dim: int) -> None:
    """Q8_0 rows are whole blocks: the head dimension must be a multiple of 32 (as llama.cpp requires)."""
    if t.name == "q8_0" and head_dim % QK8_0:
        raise ValueError(f"KV cache type q8_0 needs a head dimension that is a multiple of 32: {head_dim}")


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf: to nearest, ties away from zero (numpy's round is ties to even)."""
    t = np.trunc(x)
    return t + np.where(np.abs(x - t) >= np.float32(0.5), np.sign(x), np.float32(0.0)).astype(np.float32)


def quantize_q8_0_reference(x: np.ndarray) -> np.ndarray:
    """Rows x[..., head_dim] (float32) -> Q8_0 bytes [..., head_dim / 32 * 34], ggml's reference rule."""
    x = np.asarray(x, dtype=np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, QK8_0)
    amax = np.abs(blocks).max(axis=-1)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    q = _roundf((blocks * inv[..., None]).astype(np.float32)).astype(np.int8)
    out = np.empty((*blocks.shape[:-1], Q8_0_BLOCK_BYTES), dtype=np.uint8)
    out[..., :2] = d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:] = q.view(np.uint8)
    return out.reshape(*x.shape[:-1], -1)


def dequantize_q8_0_reference(cells: np.ndarray) -> np.ndarray:
    """Q8_0 bytes [..., n_blocks * 34] -> float32 [..., n_blocks * 32]."""
    blocks = np.ascontiguousarray(cells, dtype=np.uint8).reshape(*cells.shape[:-1], -1, Q8_0_BLOCK_BYTES)
    d = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blocks[..., 2:].view(np.int8).astype(np.float32)
    return (q * d[..., None]).reshape(*cells.shape[:-1], -1)


def cells_to_float(cells: np.ndarray, t: CacheType) -> np.ndarray:
    """Host cells of type t as float32 numbers (tests and references)."""
    return dequantize_q8_0_reference(cells) if t.name == "q8_0" else np.asarray(cells, dtype=np.float32)
