"""The CPU matmul's Python entry points: `matmul` and `get_rows` pick a kernel by weight type and level."""

from __future__ import annotations

import numpy as np
from numba import get_num_threads

from engine.cpu.matmul.floats import _round_to_bf16, matmul_float
from engine.cpu.matmul.intrinsics import BYTE_DOT
from engine.cpu.matmul.iq4 import _matmul_iq4_nl, _matmul_iq4_nl_vnni, _matmul_iq4_xs, _matmul_iq4_xs_vnni
from engine.cpu.matmul.k16 import _matmul_q2k, _matmul_q3k
from engine.cpu.matmul.mxfp4 import _matmul_mxfp4, _matmul_mxfp4_vnni, _rows_mxfp4
from engine.cpu.matmul.q4 import (
    KIND_Q4_0,
    KIND_Q4_1,
    KIND_Q4_K,
    _matmul_q4_0,
    _matmul_q4_0_vnni,
    _matmul_q4_1,
    _matmul_q4_1_vnni,
)
from engine.cpu.matmul.q4k import _matmul_q4_k, _matmul_q4k_records, _matmul_q4k_records_chunked
from engine.cpu.matmul.q5 import _matmul_q5, _matmul_q5_1, _matmul_q5_1_vnni, _matmul_q5_vnni
from engine.cpu.matmul.q5k import _matmul_q5k, _matmul_q5k_vnni
from engine.cpu.matmul.q6k import _matmul_q6k, _matmul_q6k_row_quads, _matmul_q6k_row_quads_chunked
from engine.cpu.matmul.q8 import _matmul_q8, _matmul_q8_vnni
from engine.cpu.matmul.rows import (
    _rows_float,
    _rows_iq4,
    _rows_k16,
    _rows_q4,
    _rows_q4k_records,
    _rows_q5,
    _rows_q5_1,
    _rows_q5k,
    _rows_q6k,
    _rows_q8,
)
from engine.quant import PackedWeight, QType

# Python entry points: a dictionary lookup and one call into compiled code.


def _check(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    if x.dtype != np.float32 or out.dtype != np.float32:
        raise TypeError("matmul works on float32 arrays")
    if not (x.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("matmul needs C-contiguous x and out")
    if x.ndim != 2 or x.shape[1] != w.n_cols or out.shape != (x.shape[0], w.n_rows):
        raise ValueError(f"matmul shapes: x {x.shape}, weight ({w.n_rows}, {w.n_cols}), out {out.shape}")


def matmul(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    """out[T, N] = x[T, K] @ W.T in float32; x and out C-contiguous."""
    _check(x, w, out)
    _MATMUL[w.qtype](x, w, out)


def get_rows(w: PackedWeight, ids: np.ndarray, out: np.ndarray) -> None:
    """Embedding lookup: out[i] = dequantized row ids[i] of W (ids int32, out float32 (len(ids), K))."""
    if out.dtype != np.float32 or not out.flags.c_contiguous or out.shape != (len(ids), w.n_cols):
        raise ValueError(f"get_rows: out must be float32 C-contiguous ({len(ids)}, {w.n_cols})")
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    if ids.size and (ids.min() < 0 or ids.max() >= w.n_rows):
        raise IndexError(f"get_rows: ids out of range [0, {w.n_rows})")
    _GET_ROWS[w.qtype](w, ids, out)


# Tiles of 4 or more tokens take the VNNI kernels where the CPU has them (the int16 path keeps T < 4
# compiling everywhere); the 4-bit types take them at every T (vpdpbusd tiles for 1 and 2 tokens).
VNNI_MIN_TOKENS = 4


# Row groups in chunks from a counter (engine/cpu/chunks.py) only for weights of 4 MiB and more: the
# counter's atomics cost a small matrix more than its static split loses. Gemma 3 270M (matrices of
# 0.7-1.5 MiB) decoded 1.024x slower with every Q4_K/Q6_K matmul chunked (60 rounds, faster in 12),
# SmolLM2 1.091x with its Q4_1/Q8_0 ones; Qwen2.5-Coder 1.5B's 8-191 MiB matrices gain (chunks.py).
CHUNKED_MIN_BYTES = 4 << 20


def _chunked(w: PackedWeight) -> bool:
    return w.nbytes >= CHUNKED_MIN_BYTES


def _byte_dot_layout(w: PackedWeight) -> None:
    """Records and row quads are read by the byte dot-product kernels only, which portable lacks."""
    if not BYTE_DOT:
        raise ValueError(
            f"a repacked {w.qtype.name} weight needs the byte dot-product kernels (not portable)"
        )


def _matmul_q4k_dispatch(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    if not w.repacked:  # portable (pack_weight_for_cpu), or engine.quant's field arrays as they are
        _matmul_q4_k(x, w.qs, w.d, w.m, w.sc, w.mn, out)
        return
    _byte_dot_layout(w)
    if _chunked(w):
        _matmul_q4k_records_chunked(x, w.qs, w.qs.view(np.uint16), w.mn, out, get_num_threads())
    else:
        _matmul_q4k_records(x, w.qs, w.qs.view(np.uint16), w.mn, out)


def _matmul_q6k_dispatch(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
    args = (x, w.qs, w.qh, w.sc, w.d, out)
    if w.repacked:
        _byte_dot_layout(w)
    if w.repacked and _chunked(w):
        _matmul_q6k_row_quads_chunked(*args, get_num_threads())
    elif w.repacked:
        _matmul_q6k_row_quads(*args)
    else:  # portable (pack_weight_for_cpu), or engine.quant's field arrays as they are
        _matmul_q6k(*args)


def _vnni(x: np.ndarray) -> bool:
    return BYTE_DOT and x.shape[0] >= VNNI_MIN_TOKENS


_MATMUL = {
    QType.Q4_0: lambda x, w, out: (_matmul_q4_0_vnni if BYTE_DOT else _matmul_q4_0)(x, w.qs, w.d, out),
    QType.Q4_1: lambda x, w, out: (_matmul_q4_1_vnni if BYTE_DOT else _matmul_q4_1)(x, w.qs, w.d, w.m, out),
    QType.Q4_K: _matmul_q4k_dispatch,
    QType.Q5_0: lambda x, w, out: (_matmul_q5_vnni if BYTE_DOT else _matmul_q5)(x, w.qs, w.qh, w.d, out),
    QType.Q3_K: lambda x, w, out: _matmul_q3k(x, w.qs, w.qh, w.d, w.sc, out),
    QType.Q2_K: lambda x, w, out: _matmul_q2k(x, w.qs, w.d, w.m, w.sc, w.mn, out),
    QType.Q5_1: lambda x, w, out: (_matmul_q5_1_vnni if BYTE_DOT else _matmul_q5_1)(
        x, w.qs, w.qh, w.d, w.m, out
    ),
    QType.Q5_K: lambda x, w, out: (_matmul_q5k_vnni if BYTE_DOT else _matmul_q5k)(
        x, w.qs, w.qh, w.d, w.m, w.sc, w.mn, out
    ),
    QType.Q6_K: _matmul_q6k_dispatch,
    QType.IQ4_NL: lambda x, w, out: (_matmul_iq4_nl_vnni if BYTE_DOT else _matmul_iq4_nl)(x, w.qs, w.d, out),
    QType.IQ4_XS: lambda x, w, out: (_matmul_iq4_xs_vnni if BYTE_DOT else _matmul_iq4_xs)(
        x, w.qs, w.d, w.sc, out
    ),
    QType.Q8_0: lambda x, w, out: (_matmul_q8_vnni if BYTE_DOT else _matmul_q8)(x, w.qs, w.d, out),
    QType.MXFP4: lambda x, w, out: (_matmul_mxfp4_vnni if BYTE_DOT else _matmul_mxfp4)(x, w.qs, w.sc, out),
    QType.F32: lambda x, w, out: matmul_float(x, w.f, out),
    QType.F16: lambda x, w, out: matmul_float(x, w.f, out),
    QType.BF16: lambda x, w, out: matmul_float(_round_to_bf16(x), w.f, out),
}

_GET_ROWS = {
    QType.Q4_0: lambda w, ids, out: _rows_q4(ids, w.qs, w.d, w.m, w.sc, w.mn, KIND_Q4_0, out),
    QType.Q4_1: lambda w, ids, out: _rows_q4(ids, w.qs, w.d, w.m, w.sc, w.mn, KIND_Q4_1, out),
    QType.Q4_K: lambda w, ids, out: (
        _rows_q4k_records(ids, w.qs, w.qs.view(np.uint16), w.mn, out)
        if w.repacked
        else _rows_q4(ids, w.qs, w.d, w.m, w.sc, w.mn, KIND_Q4_K, out)
    ),
    QType.Q5_0: lambda w, ids, out: _rows_q5(ids, w.qs, w.qh, w.d, out),
    QType.Q3_K: lambda w, ids, out: _rows_k16(ids, w.qs, w.qh, w.d, w.d, w.sc, w.sc, False, out),
    QType.Q2_K: lambda w, ids, out: _rows_k16(ids, w.qs, w.qs, w.d, w.m, w.sc, w.mn, True, out),
    QType.Q5_1: lambda w, ids, out: _rows_q5_1(ids, w.qs, w.qh, w.d, w.m, out),
    QType.Q5_K: lambda w, ids, out: _rows_q5k(ids, w.qs, w.qh, w.d, w.m, w.sc, w.mn, out),
    QType.Q6_K: lambda w, ids, out: _rows_q6k(ids, w.qs, w.qh, w.sc, w.d, w.repacked, out),
    QType.IQ4_NL: lambda w, ids, out: _rows_iq4(ids, w.qs, w.d, w.sc, False, out),
    QType.IQ4_XS: lambda w, ids, out: _rows_iq4(ids, w.qs, w.d, w.sc, True, out),
    QType.Q8_0: lambda w, ids, out: _rows_q8(ids, w.qs, w.d, out),
    QType.MXFP4: lambda w, ids, out: _rows_mxfp4(ids, w.qs, w.sc, out),
    QType.F32: lambda w, ids, out: _rows_float(ids, w.f, out),
    QType.F16: lambda w, ids, out: _rows_float(ids, w.f, out),
    QType.BF16: lambda w, ids, out: _rows_float(ids, w.f, out),
}
