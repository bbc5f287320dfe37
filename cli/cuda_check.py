"""`make cuda-check`: compile every CUDA kernel for a compute capability with `cuda.compile_ptx`.

No GPU is needed, only NVVM (numba-cuda[cu13] brings it). Each kernel is compiled for the argument
types the backend passes it, and one line per kernel reports the PTX size, its static shared and local
memory (local memory means a register array spilled or not promoted) and, when nvJitLink is installed
(it comes with the cu13 extra), the registers and spills ptxas reports for the target. Exits 1 if any
kernel fails to compile.

    python -m cli.cuda_check [--cc 9.0] [--ptx-dir DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from numba import types

F32, F16, I32, I8, U8 = types.float32, types.float16, types.int32, types.int8, types.uint8


def arr(dtype: Any, ndim: int) -> types.Array:
    return types.Array(dtype, ndim, "C")


def kernels() -> Iterator[tuple[str, Callable[..., None], tuple[Any, ...]]]:
    """(name, Python function, argument types) of every kernel, as the backend launches them."""
    from engine.cuda import arrays, kv_cells, matmul, ops, sampling

    f1, f2, f3, f4 = (arr(F32, n) for n in (1, 2, 3, 4))
    i1 = arr(I32, 1)
    yield "fill_zero", arrays._fill_zero_py, (f1,)
    yield "fill_zero_f16", arrays._fill_zero_py, (arr(F16, 1),)
    yield "take_rows", arrays._take_rows_py, (f2, i1, f2)
    yield "copy_cols", arrays._copy_cols_py, (f2, types.int64, f2)
    yield "rmsnorm", ops._rmsnorm_py, (f2, f1, F32, f2)
    yield "rope", ops._rope_py, (f3, i1, F32, types.boolean, f1, F32)
    h4 = arr(F16, 4)  # the KV cache
    yield "store_kv", ops._store_kv_py, (f3, f3, i1, i1, h4, h4)
    b4 = arr(U8, 4)  # a q8_0 KV cache: Q8_0 bytes
    cell_types = {"f16": h4, "q8_0": b4}
    for (k_type, v_type), source in ops.ATTENTION_PY.items():
        name = "attention" if (k_type, v_type) == ("f16", "f16") else f"attention_{k_type}_{v_type}"
        yield name, source, (f3, cell_types[k_type], cell_types[v_type], i1, i1, I32, F32, f3)
    yield "store_q8_0", kv_cells._store_q8_0_py, (f3, i1, i1, b4)
    h3 = arr(F16, 3)  # one layer's cells of one sequence
    yield "gather_cells", arrays._gather_cells_py, (h3, types.int64, f3)
    yield "scatter_cells", arrays._scatter_cells_py, (f3, h3, types.int64)
    yield "gather_q8_0", kv_cells._gather_q8_0_py, (arr(U8, 3), types.int64, f3)
    yield "scatter_q8_0", kv_cells._scatter_q8_0_py, (f3, arr(U8, 3), types.int64)
    yield "silu_mul", ops._silu_mul_py, (f2, f2, f2)
    yield "gelu_mul", ops._gelu_mul_py, (f2, f2, f2)
    yield "add_inplace", ops._add_inplace_py, (f2, f2)
    yield "add_bias_inplace", ops._add_bias_inplace_py, (f2, f1)
    yield "scale_inplace", ops._scale_inplace_py, (f2, F32)
    yield "softmax", sampling._softmax_py, (f2, f2)
    yield "argmax", sampling._argmax_py, (f2, i1)
    yield "top_k", sampling._top_k_py, (f2, I32, arr(I32, 2), f2, f1)
    for name, kind, weight_types in _weight_types(matmul):
        for tile in matmul.TILES:
            yield f"matmul_{name}_t{tile}", matmul.MATMUL_PY[(kind, tile)], (f2, *weight_types, f2)
        yield f"get_rows_{name}", matmul.GET_ROWS_PY[kind], (i1, *weight_types, f2)


def _weight_types(matmul: Any) -> Iterator[tuple[str, int, tuple[Any, ...]]]:
    """The DeviceWeight field types (qs, qh, d, m, sc, mn, f) of each format, placeholders included."""
    u8, i8, h = arr(U8, 2), arr(I8, 2), arr(F16, 2)
    for name, kind in (("q4_0", matmul.KIND_Q4_0), ("q4_1", matmul.KIND_Q4_1), ("q4_k", matmul.KIND_Q4_K)):
        yield name, kind, (u8, u8, h, h, u8, u8, arr(F32, 2))
    yield "q5_0", matmul.KIND_Q5_0, (u8, u8, h, h, u8, u8, arr(F32, 2))
    yield "q5_1", matmul.KIND_Q5_1, (u8, u8, h, h, u8, u8, arr(F32, 2))
    yield "q5_k", matmul.KIND_Q5_K, (u8, u8, h, h, u8, u8, arr(F32, 2))
    yield "q2_k", matmul.KIND_Q2_K, (u8, u8, h, h, u8, u8, arr(F32, 2))
    yield "q3_k", matmul.KIND_Q3_K, (u8, u8, h, h, i8, u8, arr(F32, 2))
    yield "q6_k", matmul.KIND_Q6_K, (u8, u8, h, h, i8, u8, arr(F32, 2))
    yield "iq4_nl", matmul.KIND_IQ4_NL, (u8, u8, h, h, u8, u8, arr(F32, 2))
    yield "iq4_xs", matmul.KIND_IQ4_XS, (u8, u8, h, h, i8, u8, arr(F32, 2))
    yield "q8_0", matmul.KIND_Q8_0, (i8, u8, h, h, u8, u8, arr(F32, 2))
    yield "f32", matmul.KIND_FLOAT, (u8, u8, h, h, u8, u8, arr(F32, 2))
    yield "f16", matmul.KIND_FLOAT, (u8, u8, h, h, u8, u8, h)


def _memory(ptx: str, space: str) -> int:
    """Bytes of static `.shared` or `.local` arrays the PTX declares."""
    return sum(int(n) for n in re.findall(rf"\.{space}\s+\.align\s+\d+\s+\.b8\s+\S+?\[(\d+)\]", ptx))


def _ptxas_info(ptx: str, cc: tuple[int, ...]) -> str:
    """Registers and spills as ptxas reports them, assembling the PTX to a cubin with nvJitLink (also no
    GPU needed); empty when cuda-bindings' nvjitlink is not installed."""
    try:
        from cuda.bindings import nvjitlink
    except ImportError:
        return ""
    data = ptx.encode()
    handle = nvjitlink.create(2, [f"-arch=sm_{cc[0]}{cc[1]}", "-verbose"])
    try:
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel")
        nvjitlink.complete(handle)
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
    finally:
        nvjitlink.destroy(handle)
    text = log.decode(errors="replace")
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    info = f"  {regs.group(1)} regs" if regs else ""
    if spills:
        info += f", spills {spills.group(1)}/{spills.group(2)} B"
    return info


def _target_device_functions(cc: tuple[int, ...]) -> None:
    """Device functions (block reductions, block decoders) are compiled on first call for the current
    device's compute capability, which needs a driver; without a GPU, answer with the target's."""
    from types import SimpleNamespace

    from numba.cuda import dispatcher

    if hasattr(dispatcher, "get_current_device"):
        dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cli.cuda_check", description=__doc__.splitlines()[0])
    p.add_argument("--cc", default="9.0", help="compute capability MAJOR.MINOR (default: 9.0, H100/H200)")
    p.add_argument("--ptx-dir", type=Path, help="also write each kernel's PTX here")
    args = p.parse_args(argv)
    from numba import cuda

    cc = tuple(int(v) for v in args.cc.split("."))
    if args.ptx_dir:
        args.ptx_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    _target_device_functions(cc)
    print(f"compiling for sm_{cc[0]}{cc[1]} with numba.cuda {getattr(cuda, 'implementation', '?')}")
    for name, fn, sig in kernels():
        start = time.perf_counter()
        try:
            ptx, _ = cuda.compile_ptx(fn, sig, cc=cc)
        except Exception as exc:  # report every kernel, then fail
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        secs = time.perf_counter() - start
        shared, local = _memory(ptx, "shared"), _memory(ptx, "local")
        info = _ptxas_info(ptx, cc)
        size = f"{len(ptx):>6} B PTX  shared {shared:>5} B  local {local:>3} B"
        print(f"ok   {name:<16} {size}{info}  {secs:4.2f} s")
        if args.ptx_dir:
            (args.ptx_dir / f"{name}.ptx").write_text(ptx)
    total = sum(1 for _ in kernels())
    print(f"{total - failed} of {total} kernels compiled for sm_{cc[0]}{cc[1]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
