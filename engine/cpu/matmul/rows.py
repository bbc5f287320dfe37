"""The get_rows kernels: whole rows dequantized out of the packed layouts (the embedding lookup)."""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.cpu.matmul.q4 import KIND_Q4_0, KIND_Q4_1
from engine.cpu.matmul.tiles import _KERNEL, f16_to_f32, to_f32
from engine.cpu.records import Q4K_D, Q4K_RECORD, q4k_block_at, q4k_nibble_at, q6k_top_at
from engine.quant import IQ4_LEVELS, QK, ROWS

# get_rows: dequantize whole rows out of the interleaved layout (embedding lookup).


@njit(**_KERNEL)
def _rows_q4(ids, qs, d, m, sc, mn, kind, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            if kind == KIND_Q4_0:
                scale = f16_to_f32(d[g, b * ROWS + r])
                low = np.float32(-8.0) * scale
            elif kind == KIND_Q4_1:
                scale = f16_to_f32(d[g, b * ROWS + r])
                low = f16_to_f32(m[g, b * ROWS + r])
            else:
                scale = f16_to_f32(d[g, (b >> 3) * ROWS + r]) * np.float32(sc[g, b * ROWS + r])
                low = -f16_to_f32(m[g, (b >> 3) * ROWS + r]) * np.float32(mn[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                out[i, b * QK + j] = scale * np.float32(v & 15) + low
                out[i, b * QK + j + 16] = scale * np.float32(v >> 4) + low


@njit(**_KERNEL)
def _rows_q4k_records(ids, rec, rec16, mn, out) -> None:  # type: ignore[no-untyped-def]
    """_rows_q4's Q4_K rows read from the records (engine/cpu/records.py)."""
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            at = (b >> 3) * Q4K_RECORD
            sc_at, first = q4k_block_at(at, b & 7)
            dm = (at + Q4K_D) // 2
            scale = f16_to_f32(rec16[g, dm + r]) * np.float32(rec[g, sc_at + r])
            low = -f16_to_f32(rec16[g, dm + ROWS + r]) * np.float32(mn[g, b * ROWS + r])
            for j in range(16):
                v = rec[g, q4k_nibble_at(first, j, r)]
                out[i, b * QK + j] = scale * np.float32(v & 15) + low
                out[i, b * QK + j + 16] = scale * np.float32(v >> 4) + low


@njit(**_KERNEL)
def _rows_q5_1(ids, qs, qh, d, m, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            dv, mv = f16_to_f32(d[g, b * ROWS + r]), f16_to_f32(m[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                h = qh[g, (b * 4 + (j >> 2)) * ROWS + r] >> (2 * (j & 3))
                out[i, b * QK + j] = dv * np.float32((v & 15) | ((h & 1) << 4)) + mv
                out[i, b * QK + j + 16] = dv * np.float32((v >> 4) | ((h & 2) << 3)) + mv


@njit(**_KERNEL)
def _rows_q5(ids, qs, qh, d, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            dv = f16_to_f32(d[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                h = qh[g, (b * 4 + (j >> 2)) * ROWS + r] >> (2 * (j & 3))
                out[i, b * QK + j] = dv * np.float32(np.int32((v & 15) | ((h & 1) << 4)) - 16)
                out[i, b * QK + j + 16] = dv * np.float32(np.int32((v >> 4) | ((h & 2) << 3)) - 16)


@njit(**_KERNEL)
def _rows_q5k(ids, qs, qh, d, m, sc, mn, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            scale = f16_to_f32(d[g, (b >> 3) * ROWS + r]) * np.float32(sc[g, b * ROWS + r])
            low = -f16_to_f32(m[g, (b >> 3) * ROWS + r]) * np.float32(mn[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                h = qh[g, (b * 4 + (j >> 2)) * ROWS + r] >> (2 * (j & 3))
                out[i, b * QK + j] = scale * np.float32((v & 15) | ((h & 1) << 4)) + low
                out[i, b * QK + j + 16] = scale * np.float32((v >> 4) | ((h & 2) << 3)) + low


@njit(**_KERNEL)
def _rows_iq4(ids, qs, d, sc, per_sub_block, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            if per_sub_block:
                scale = f16_to_f32(d[g, (b >> 3) * ROWS + r]) * np.float32(sc[g, b * ROWS + r])
            else:
                scale = f16_to_f32(d[g, b * ROWS + r])
            for j in range(16):
                v = qs[g, (b * 16 + j) * ROWS + r]
                out[i, b * QK + j] = scale * np.float32(IQ4_LEVELS[v & 15])
                out[i, b * QK + j + 16] = scale * np.float32(IQ4_LEVELS[v >> 4])


@njit(**_KERNEL)
def _rows_k16(ids, qs, qh, d, m, sc, mn, is_q2, out) -> None:  # type: ignore[no-untyped-def]
    """Q3_K (stored q + 4) and Q2_K (w = d * sc * q - dmin * mn) rows."""
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            ds = f16_to_f32(d[g, (b >> 3) * ROWS + r])
            for p in range(8):
                v = np.int32(qs[g, (b * 8 + p) * ROWS + r])
                for k in range(4):
                    u = (v >> (2 * k)) & 3
                    half = (
                        k >> 1
                    )  # weights p, p + 8 in the first 16-weight sub-block, p + 16, p + 24 in the second
                    scale = ds * np.float32(sc[g, (2 * b + half) * ROWS + r])
                    if is_q2:
                        low = f16_to_f32(m[g, (b >> 3) * ROWS + r]) * np.float32(
                            mn[g, (2 * b + half) * ROWS + r]
                        )
                        out[i, b * QK + p + 8 * k] = scale * np.float32(u) - low
                    else:
                        h = (np.int32(qh[g, (b * 4 + (p & 3)) * ROWS + r]) >> (4 * (p >> 2) + k)) & 1
                        out[i, b * QK + p + 8 * k] = scale * np.float32((u | (h << 2)) - 4)


@njit(**_KERNEL)
def _rows_q6k(ids, qs, qh, sc, d, row_quads, out) -> None:  # type: ignore[no-untyped-def]
    """Q6_K rows from the field arrays or (`row_quads`) from engine/cpu/records.py's layout."""
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            ds = f16_to_f32(d[g, (b >> 3) * ROWS + r])
            dlo = ds * np.float32(sc[g, (2 * b) * ROWS + r])
            dhi = ds * np.float32(sc[g, (2 * b + 1) * ROWS + r])
            for j in range(16):
                if row_quads:
                    v = qs[g, q4k_nibble_at(b * 16 * ROWS, j, r)]
                    lo_at, lo_shift = q6k_top_at(b, j, r)
                    hi_at, hi_shift = q6k_top_at(b, j + 16, r)
                    lo_top, hi_top = (qh[g, lo_at] >> lo_shift) & 3, (qh[g, hi_at] >> hi_shift) & 3
                else:
                    v = qs[g, (b * 16 + j) * ROWS + r]
                    h = qh[g, (b * 8 + (j >> 1)) * ROWS + r] >> (4 * (j & 1))
                    lo_top, hi_top = h & 3, (h >> 2) & 3
                out[i, b * QK + j] = dlo * np.float32(np.int32((v & 15) | (lo_top << 4)) - 32)
                out[i, b * QK + j + 16] = dhi * np.float32(np.int32((v >> 4) | (hi_top << 4)) - 32)


@njit(**_KERNEL)
def _rows_q8(ids, qs, d, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for b in range(out.shape[1] // QK):
            dv = f16_to_f32(d[g, b * ROWS + r])
            for k in range(QK):
                out[i, b * QK + k] = dv * np.float32(qs[g, (b * QK + k) * ROWS + r])


@njit(**_KERNEL)
def _rows_float(ids, f, out) -> None:  # type: ignore[no-untyped-def]
    for i in range(ids.shape[0]):
        g, r = ids[i] // ROWS, ids[i] % ROWS
        for k in range(out.shape[1]):
            out[i, k] = to_f32(f[g, k * ROWS + r])
