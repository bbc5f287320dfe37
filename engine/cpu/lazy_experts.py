"""Expert tensors packed on first use: the resident set grows with the experts the prompts route to.

A 3-D `*_exps` tensor (expert, rows, cols) is packed as one (expert x rows, cols) PackedWeight: expert e's
rows are row groups e x rows / 32 .. (e + 1) x rows / 32 of every field array (each array is (groups,
bytes per group), engine/quant.py), so a slice of the groups is a contiguous PackedWeight of its own
(`expert_view`) and the one-call expert kernels (engine/cpu/matmul/experts.py) index the whole.

`LazyExperts` reserves that matrix at load in one anonymous mapping that nothing touches (address space
only) and packs expert e into its place from the file's mapping the first time a batch routes a token to
it (`prepare`); the file pages it read are then dropped from the process (MADV_DONTNEED, as
GGUFFile.release_pages does after a dense layer), so they are not held twice. Repacked experts would
otherwise be the whole model in anonymous memory from load on (Qwen3-30B-A3B: 17 GB of experts, of
which a token reads 8 of 128 per layer).

Huge pages: decode reads weights at the memory's speed only in 2 MiB pages (engine/cpu/huge_pages.py:
6.0 -> 10.7 GB/s on one thread). Advised MADV_HUGEPAGE up front, the first byte packed into a 2 MiB
region faults the whole region in: Qwen3-30B-A3B's experts are 0.86 MB (down) and 1.7 MB (gate|up), so
a sparse set of experts took 2.2-2.3x their bytes (bench_moe.py, 16 layers, an 8-token prompt packing
1386 of 4096 expert matrices: RssAnon 4753 MiB). So the mapping stays in 4 KiB pages, and each 2 MiB
region whose experts are all packed is collapsed into a huge page then (MADV_COLLAPSE, Linux 6.1+;
where it fails the region stays in small pages, slower, the same bytes).
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap

import numpy as np

from engine.cpu.huge_pages import HUGE_PAGE, _layout
from engine.cpu.records import repack_for_cpu
from engine.quant import PACKED_FIELDS, ROWS, PackedWeight

_PAGE = mmap.PAGESIZE
_MADV_COLLAPSE = 25  # linux/mman.h; Python's mmap module does not name it
_libc = ctypes.CDLL(None, use_errno=True)


def expert_view(w: PackedWeight, e: int, rows: int) -> PackedWeight:
    """Expert e's rows of a matrix packed from (n_expert x rows) rows, rows a multiple of 32."""
    per = rows // ROWS
    sliced = {f: getattr(w, f)[e * per : (e + 1) * per] for f in PACKED_FIELDS}
    return dataclasses.replace(w, n_rows=rows, **sliced)


def _madvise(start: int, length: int, advice: int) -> int:
    return int(_libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), advice))


def _unmap_pages(a: np.ndarray) -> None:
    """MADV_DONTNEED over the pages of a (a read-only file mapping's): they leave this process's resident
    set and stay in the page cache; a later read faults them back in. Never for anonymous memory, whose
    pages it would zero."""
    if hasattr(mmap, "MADV_DONTNEED"):
        start = a.ctypes.data - a.ctypes.data % _PAGE
        _madvise(start, a.ctypes.data + a.nbytes - start, mmap.MADV_DONTNEED)


def _reserve(n: int) -> np.ndarray:
    """n untouched bytes of an anonymous mapping, starting on a 2 MiB boundary (the array keeps it)."""
    mm = mmap.mmap(-1, n + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(mm, np.uint8)
    start = (-whole.ctypes.data) % HUGE_PAGE
    return whole[start : start + n]


class LazyExperts:
    """A 3-D expert tensor (parts fused along the rows: gate|up) packed expert by expert on first use."""

    def __init__(self, parts: list[np.ndarray], qtype: int, shape: tuple[int, int, int]) -> None:
        self.parts, self.qtype, self.shape = parts, qtype, shape
        n_expert, rows, _ = shape
        first = self._pack(0)
        fields = {f: a for f in PACKED_FIELDS if (a := getattr(first, f)).nbytes}
        sizes = [n_expert * a.nbytes for a in fields.values()]
        offsets, total = _layout(sizes)
        buf = _reserve(total)
        whole = {}
        # per field: (its start address, one expert's bytes) for the huge-page collapse
        self.spans: list[tuple[int, int]] = []
        for (f, a), at, n in zip(fields.items(), offsets, sizes, strict=True):
            whole[f] = buf[at : at + n].view(a.dtype).reshape(n_expert * a.shape[0], a.shape[1])
            self.spans.append((whole[f].ctypes.data, a.nbytes))
        self.whole = dataclasses.replace(first, n_rows=n_expert * rows, **whole)
        self.packed = np.zeros(n_expert, np.bool_)
        self.collapsed: set[int] = set()
        self._store(0, first)

    def _pack(self, e: int) -> PackedWeight:
        _, rows, cols = self.shape
        data = np.concatenate([p[e] for p in self.parts]) if len(self.parts) > 1 else self.parts[0][e]
        w = repack_for_cpu(data, self.qtype, (rows, cols))
        for p in self.parts:
            if isinstance(p, np.memmap):  # the file's pages: a second copy once packed
                _unmap_pages(p[e])
        return w

    def _store(self, e: int, w: PackedWeight) -> None:
        view = expert_view(self.whole, e, self.shape[1])
        for f in PACKED_FIELDS:
            if getattr(w, f).nbytes:
                getattr(view, f)[...] = getattr(w, f)
        self.packed[e] = True

    def prepare(self, experts: np.ndarray) -> None:
        """Pack the experts (ids) not packed yet, then collapse the regions they completed."""
        if self.packed[experts].all():
            return
        new = np.unique(experts[~self.packed[experts]]).tolist()
        for e in new:
            self._store(e, self._pack(e))
        for e in new:
            self._collapse_around(e)

    def _collapse_around(self, e: int) -> None:
        """MADV_COLLAPSE each 2 MiB region inside one field array that holds expert e's bytes and only
        packed experts' (regions across two arrays stay in small pages: a few per tensor)."""
        n_expert = self.shape[0]
        for base, size in self.spans:
            end = base + n_expert * size
            lo, hi = base + e * size, base + (e + 1) * size
            for region in range(lo - lo % HUGE_PAGE, hi, HUGE_PAGE):
                if region in self.collapsed or region < base or region + HUGE_PAGE > end:
                    continue
                first, last = (region - base) // size, (region + HUGE_PAGE - 1 - base) // size
                if self.packed[first : last + 1].all():
                    self.collapsed.add(region)
                    _madvise(region, HUGE_PAGE, _MADV_COLLAPSE)
