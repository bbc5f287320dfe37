"""Device arrays for the CUDA backend: allocation, transfers, and the small copy kernels models need.

The backend hooks (`empty`, `zeros`, `upload`, `download`, `take_rows`, `split_cols`, and the KV-cell
copies) let a model keep its activations and KV cache on the device. The kernels also take numpy
arrays: `device` uploads them, and `write_back` copies a result into a numpy output, which is what
makes an unchanged model run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32
from numba.types import float16

from engine.cuda import kv_cells

THREADS = 256  # threads per block of the element-wise kernels; a multiple of 32
# Every kernel loops over its jobs (rows, tokens, heads, row groups) with a grid stride, so a launch
# may use fewer blocks than jobs. On a GPU each job gets its own block up to this many; the simulator
# tests lower it, as each simulated thread costs a Python thread.
MAX_BLOCKS = 1 << 20
MAX_ELEM_BLOCKS = 4096  # element-wise kernels: a few waves of blocks, each striding over the array

DeviceArray = Any  # numba's DeviceNDArray (FakeCUDAArray under the simulator)


def is_host(a: Any) -> bool:
    return isinstance(a, np.ndarray)


def device(a: Any, dtype: Any = None) -> DeviceArray:
    """a itself when it is on the device, else a C-contiguous copy of it there (in `dtype` if given)."""
    if not is_host(a):
        return a
    return cuda.to_device(np.ascontiguousarray(a, dtype=dtype))


def ids(a: Any) -> DeviceArray:
    """Index arrays (token ids, positions, sequence ids) as int32 on the device."""
    return device(a, np.int32) if is_host(a) else a


def write_back(host: Any, dev: DeviceArray) -> None:
    """Copy a kernel's result into the caller's numpy output (nothing to do for device outputs)."""
    if is_host(host):
        dev.copy_to_host(host)


def empty(shape: tuple[int, ...] | int, dtype: Any = np.float32) -> DeviceArray:
    return cuda.device_array(shape, dtype=dtype)


def zeros(shape: tuple[int, ...] | int, dtype: Any = np.float32) -> DeviceArray:
    """A zero-filled device array, filled on the device (a KV cache can be gigabytes: no host copy)."""
    out = cuda.device_array(shape, dtype=dtype)
    flat = out.reshape(out.size)
    if flat.size:
        _fill_zero[elem_blocks(flat.size, THREADS), THREADS](flat)
    return out


def upload(a: Any) -> DeviceArray:
    """A host array (norm weights, batch indices) on the device; device arrays pass through."""
    return device(a)


def download(a: Any) -> np.ndarray:
    """The host copy of a result (logits, sampled ids); numpy arrays pass through."""
    return a if is_host(a) else a.copy_to_host()


def take_rows(x: Any, rows: Any) -> Any:
    """x[rows] for a 2-D x: the rows whose logits the caller wants."""
    if is_host(x):
        return x[np.asarray(rows)]
    idx = ids(rows)
    out = cuda.device_array((idx.shape[0], x.shape[1]), dtype=x.dtype)
    if out.size:
        _take_rows[elem_blocks(out.size, THREADS), THREADS](x, idx, out)
    return out


def split_cols(x: Any, sizes: list[int]) -> list[Any]:
    """Contiguous column blocks of a 2-D x (the q | k | v of one fused projection)."""
    if is_host(x):
        bounds = np.cumsum(sizes)[:-1]
        return [np.ascontiguousarray(part) for part in np.split(x, bounds, axis=1)]
    parts, start = [], 0
    for size in sizes:
        part = cuda.device_array((x.shape[0], size), dtype=x.dtype)
        if part.size:
            _copy_cols[elem_blocks(part.size, THREADS), THREADS](x, start, part)
        parts.append(part)
        start += size
    return parts


def read_cells(cache: DeviceArray, seq_id: int, n: int) -> np.ndarray:
    """Host copy of the first n cells of `seq_id` in a [n_layer, n_seq, heads, n_ctx, dim] cache.

    cache[layer, seq] is contiguous, so it copies in one transfer per layer."""
    return np.stack([cache[i, seq_id].copy_to_host()[:, :n] for i in range(cache.shape[0])])


def write_cells(cache: DeviceArray, seq_id: int, cells: np.ndarray) -> None:
    """Replace the first cells of `seq_id` with host cells [n_layer, heads, n, dim]."""
    n = cells.shape[2]
    for i in range(cache.shape[0]):
        layer = cache[i, seq_id].copy_to_host()
        layer[:, :n] = cells[i]
        cache[i, seq_id].copy_to_device(layer)


def gather_cells(cells: DeviceArray, start: int, n: int, head_dim: int) -> DeviceArray:
    """float32 [n, heads, head_dim] of cells [heads, n_ctx, row] (float16, or Q8_0 bytes) from `start`
    (a context shift's staging)."""
    out = cuda.device_array((n, cells.shape[0], head_dim), dtype=np.float32)
    kernel = _gather_cells if cells.dtype == np.float16 else kv_cells.gather_q8_0
    if out.size:
        kernel[elem_blocks(out.size, THREADS), THREADS](device(cells), start, out)
    return out


def scatter_cells(x: DeviceArray, cells: DeviceArray, start: int) -> None:
    """Write x[n, heads, head_dim] into cells [heads, n_ctx, row] from `start` on, in the cells' type."""
    kernel = _scatter_cells if cells.dtype == np.float16 else kv_cells.scatter_q8_0
    if x.size:
        kernel[elem_blocks(x.size, THREADS), THREADS](device(x), cells, start)


def blocks(n_jobs: int) -> int:
    """Blocks for a kernel striding over n_jobs independent jobs (one block per job when allowed)."""
    return max(1, min(n_jobs, MAX_BLOCKS))


def elem_blocks(n: int, threads: int) -> int:
    """Blocks for an element-wise kernel over n elements with `threads` per block."""
    return max(1, min((n + threads - 1) // threads, MAX_ELEM_BLOCKS, MAX_BLOCKS))


# ---------------------------------------------------------------------------------------------------
# Kernels: threads stride over the elements.


def _fill_zero_py(flat):  # type: ignore[no-untyped-def]
    for i in range(cuda.grid(1), flat.shape[0], cuda.gridsize(1)):
        flat[i] = 0


def _take_rows_py(x, rows, out):  # type: ignore[no-untyped-def]
    n_cols = out.shape[1]
    for i in range(cuda.grid(1), out.shape[0] * n_cols, cuda.gridsize(1)):
        r = i // n_cols
        c = i - r * n_cols
        out[r, c] = x[rows[r], c]


def _copy_cols_py(x, start, out):  # type: ignore[no-untyped-def]
    n_cols = out.shape[1]
    for i in range(cuda.grid(1), out.shape[0] * n_cols, cuda.gridsize(1)):
        r = i // n_cols
        c = i - r * n_cols
        out[r, c] = x[r, start + c]


@cuda.jit(device=True)
def _row_head_col(i, n_heads, dim):  # type: ignore[no-untyped-def]
    """The (row, head, column) of flat index i into a C-contiguous [n, n_heads, dim] array."""
    return i // (n_heads * dim), (i // dim) % n_heads, i % dim


def _gather_cells_py(cells, start, out):  # type: ignore[no-untyped-def]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        t, h, d = _row_head_col(i, out.shape[1], out.shape[2])
        out[t, h, d] = float32(cells[h, start + t, d])


def _scatter_cells_py(x, cells, start):  # type: ignore[no-untyped-def]
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        t, h, d = _row_head_col(i, x.shape[1], x.shape[2])
        cells[h, start + t, d] = float16(x[t, h, d])


_fill_zero = cuda.jit(_fill_zero_py)
_gather_cells = cuda.jit(_gather_cells_py)
_scatter_cells = cuda.jit(_scatter_cells_py)
_take_rows = cuda.jit(_take_rows_py)
_copy_cols = cuda.jit(_copy_cols_py)
