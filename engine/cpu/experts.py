"""The CPU backend's mixture-of-experts pieces: expert tensors packed once with a view per expert, the
router's float matmul, bitwise independent of the batch, and gpt-oss's clamped SwiGLU.

A `*_exps` tensor is 3-D (expert, rows, cols). Packed as one (expert x rows, cols) matrix, expert e's rows
are row groups e x rows / 32 .. (e + 1) x rows / 32 of every field array (each array is (groups, bytes
per group), engine/quant.py), so a slice of the groups is a contiguous PackedWeight of its own that the
existing matmul kernels take as they are. One matrix means one huge-page mapping per tensor
(engine/cpu/huge_pages.py) instead of one per expert: a Qwen3-30B-A3B layer has 128 experts of about
1.7 MB each, each of which would round up to a 2 MiB mapping of its own.

The router (`ffn_gate_inp`, float32 in every release: llama-quantize leaves it so) is small (n_expert x
n_embd), but its logits choose the experts and weigh their outputs, so a last-bit difference changes a
token's output. The float matmul kernel's tiles of different sizes differ in their last bits (FMA
contraction differs between its inlined tile copies), so a token's logits there depend on how many
tokens share its call. `router_logits` computes every (token, expert) dot product by the same code
whatever the batch: 16 lane sums over the row, then the lanes added in order.
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit, prange

from engine.cpu.huge_pages import HUGE_PAGE, _huge_page_buffer, _layout
from engine.cpu.records import pack_weight_for_cpu, repack_for_cpu
from engine.cpu.vecmath import exp
from engine.quant import PACKED_FIELDS, ROWS, PackedWeight, dequantize

_KERNEL = {"cache": True, "nogil": True, "error_model": "numpy"}
LANES = 16


def expert_view(w: PackedWeight, e: int, rows: int) -> PackedWeight:
    """Expert e's rows of a matrix packed from (n_expert x rows) rows, rows a multiple of 32."""
    per = rows // ROWS
    sliced = {f: getattr(w, f)[e * per : (e + 1) * per] for f in PACKED_FIELDS}
    return dataclasses.replace(w, n_rows=rows, **sliced)


def pack_experts_for_cpu(
    parts: list[np.ndarray], qtype: int, shape: tuple[int, int, int]
) -> tuple[list[Any], list[Any], Callable[[np.ndarray], None] | None]:
    """(the packed weights that hold the experts, one weight per expert, `prepare`) of a 3-D tensor's
    stored rows, `parts` (each (experts, rows_i, bytes per row), fused along the rows: gate|up). Experts
    are packed on first use: prepare(experts) packs those of them not packed yet, and must run before a
    kernel reads them. Rows that are not a multiple of 32 would share a row group between two experts:
    those experts are packed one by one, at once (prepare None)."""
    n_expert, rows, cols = shape
    if rows % ROWS:
        data = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        each = [pack_weight_for_cpu(data[e], qtype, (rows, cols)) for e in range(n_expert)]
        return each, each, None
    lazy = LazyExperts(parts, qtype, shape)
    return [lazy.whole], [expert_view(lazy.whole, e, rows) for e in range(n_expert)], lazy.prepare


_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)


def _unmap_pages(a: np.ndarray) -> None:
    """MADV_DONTNEED over the pages of a (a read-only file mapping's): they leave this process's resident
    set and stay in the page cache; a later read faults them back in. Never for anonymous memory, whose
    pages it would zero."""
    if not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = a.ctypes.data - a.ctypes.data % _PAGE
    end = a.ctypes.data + a.nbytes
    _libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), mmap.MADV_DONTNEED)


class LazyExperts:
    """A 3-D expert tensor packed expert by expert as the router first picks each one.

    The packed matrix (every expert's row groups, one after another) is reserved at load in one anonymous
    mapping (advised huge pages, engine/cpu/huge_pages.py) that nothing touches, so it costs address
    space only; an expert's rows are read from the file's mapping and packed into their place the first
    time a batch routes a token to it. The resident set then grows with the experts the prompts use, not
    with the model (Qwen3-30B-A3B: 17 GB of experts, 8 of 128 per layer and token). Packing an expert
    costs what packing it at load did (~2 ms for one of Qwen3-30B-A3B's 1.7 MB gate|up experts).
    """

    def __init__(self, parts: list[np.ndarray], qtype: int, shape: tuple[int, int, int]) -> None:
        self.parts, self.qtype, self.shape = parts, qtype, shape
        n_expert, rows, _ = shape
        first = self._pack(0)
        fields = {f: a for f in PACKED_FIELDS if (a := getattr(first, f)).nbytes}
        sizes = [n_expert * a.nbytes for a in fields.values()]
        offsets, total = _layout(sizes)
        buf = _huge_page_buffer(total) if total >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE") else None
        buf = np.zeros(total, np.uint8) if buf is None else buf  # np.zeros: calloc'd, untouched pages
        whole = {}
        for (f, a), at, n in zip(fields.items(), offsets, sizes, strict=True):
            whole[f] = buf[at : at + n].view(a.dtype).reshape(n_expert * a.shape[0], a.shape[1])
        self.whole = dataclasses.replace(first, n_rows=n_expert * rows, **whole)
        self.packed = np.zeros(n_expert, np.bool_)
        self._store(0, first)

    def _pack(self, e: int) -> PackedWeight:
        _, rows, cols = self.shape
        data = np.concatenate([p[e] for p in self.parts]) if len(self.parts) > 1 else self.parts[0][e]
        w = repack_for_cpu(data, self.qtype, (rows, cols))
        for p in self.parts:
            if isinstance(
                p, np.memmap
            ):  # the file's pages: a second copy once packed (GGUFFile.release_pages)
                _unmap_pages(p[e])
        return w

    def _store(self, e: int, w: PackedWeight) -> None:
        view = expert_view(self.whole, e, self.shape[1])
        for f in PACKED_FIELDS:
            if getattr(w, f).nbytes:
                getattr(view, f)[...] = getattr(w, f)
        self.packed[e] = True

    def prepare(self, experts: np.ndarray) -> None:
        """Pack the experts (ids) not packed yet."""
        if self.packed[experts].all():
            return
        for e in np.unique(experts[~self.packed[experts]]).tolist():
            self._store(e, self._pack(e))


def pack_router_for_cpu(data: np.ndarray, qtype: int, shape: tuple[int, int]) -> np.ndarray:
    """The router's matrix as float32 rows (n_expert, n_embd), whatever its stored type."""
    return np.ascontiguousarray(dequantize(data, qtype, shape), dtype=np.float32)


def router_logits(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[T, n_expert] = x[T, n_embd] @ w.T in float32, each row independent of the others."""
    if x.shape[1] != w.shape[1] or out.shape != (x.shape[0], w.shape[0]):
        raise ValueError(f"router shapes: x {x.shape}, w {w.shape}, out {out.shape}")
    _router_logits(np.ascontiguousarray(x), w, out)


@njit(parallel=True, **_KERNEL)
def _router_logits(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    n_tok, n_expert = out.shape
    for t in prange(n_tok):
        lanes = np.empty(LANES, np.float32)
        for e in range(n_expert):
            out[t, e] = _dot(x[t], w[e], lanes)


@njit(**_KERNEL)
def _dot(a: np.ndarray, b: np.ndarray, lanes: np.ndarray) -> np.float32:
    """a . b: lane l sums positions l, l + 16, ... (one vector of sums), then the lanes in order."""
    n = a.shape[0]
    lanes[:] = np.float32(0.0)
    body = n - n % LANES
    for k in range(0, body, LANES):
        for lane in range(LANES):
            lanes[lane] += a[k + lane] * b[k + lane]
    for k in range(body, n):
        lanes[k - body] += a[k] * b[k]
    total = np.float32(0.0)
    for lane in range(LANES):
        total += lanes[lane]
    return total


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> None:
    """gate = gpt-oss's clamped SwiGLU of (gate, up), in place (ggml's swiglu_oai): x = min(gate, limit),
    y = clamp(up, -limit, limit), x * sigmoid(alpha * x) * (y + 1)."""
    _swiglu_oai(gate, up, np.float32(alpha), np.float32(limit))


@njit(fastmath=True, **_KERNEL)
def _swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: np.float32, limit: np.float32) -> None:
    one = np.float32(1.0)
    for r in range(gate.shape[0]):
        for i in range(gate.shape[1]):
            x = min(gate[r, i], limit)
            y = min(max(up[r, i], -limit), limit)
            gate[r, i] = x / (one + exp(-(alpha * x))) * (y + one)
