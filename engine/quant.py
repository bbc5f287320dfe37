"""GGML block formats: layouts, numpy reference dequantization, and the repacking the CPU kernels read.

Stored layouts (ggml-common.h), per block of `block_size` weights along a row:

    Q4_0  32 w, 18 B: f16 d | 16 B nibbles          w = d * (q - 8)
    Q4_1  32 w, 20 B: f16 d | f16 m | 16 B nibbles   w = d * q + m
    Q5_0  32 w, 22 B: f16 d | u32 high bits | 16 B    w = d * (q - 16), q = nibble | high bit << 4
    Q5_1  32 w, 24 B: f16 d | f16 m | u32 high bits | 16 B    w = d * q + m, q as Q5_0
    Q8_0  32 w, 34 B: f16 d | 32 x int8               w = d * q
    Q2_K 256 w, 84 B: 16 B (scale | min << 4) per 16 | 64 B two-bit quants | f16 d | f16 dmin
                      w = d * sc * q - dmin * mn; byte l of 32-chunk c holds sub-blocks 4c..4c+3
    Q3_K 256 w, 110 B: 32 B high bits | 64 B two-bit quants as Q2_K | 12 B six-bit scales | f16 d
                      w = d * (sc - 32) * q, q = low two bits - (4 unless the high bit is set)
    Q4_K 256 w, 144 B: f16 d | f16 dmin | 12 B six-bit (scale, min) x 8 | 128 B nibbles
                      w = d * sc[s] * q - dmin * mn[s] for sub-block s of 32
    Q5_K 256 w, 176 B: f16 d | f16 dmin | 12 B scales as Q4_K | 32 B fifth bits | 128 B nibbles as Q4_K
                      fifth bit of weight l of sub-block s = bit s of byte l; w as Q4_K, q < 32
    Q6_K 256 w, 210 B: 128 B low nibbles | 64 B two-bit highs | int8 scale x 16 | f16 d
                      w = d * sc[s] * (q - 32) for sub-block s of 16
    IQ4_NL  32 w, 18 B: f16 d | 16 B nibbles          w = d * IQ4_LEVELS[q]
    IQ4_XS 256 w, 136 B: f16 d | u16 scale high bits | 4 B scale low nibbles | 128 B nibbles
                      six-bit scale ls per 32-sub-block, w = d * (ls - 32) * IQ4_LEVELS[q]; the
                      sub-block's 16 bytes pair weights (j, j + 16) as the 32-blocks do
    MXFP4   32 w, 17 B: E8M0 e | 16 B nibbles          w = 2^(e - 128) * MXFP4_LEVELS[q] (gpt-oss's
                      experts: E2M1 values doubled, times half the block's power-of-two scale)
    BF16   the top 16 bits of a float32

In the 32-blocks, byte j holds weight j in its low nibble and weight j + 16 in its high nibble.

`pack_weight` rearranges a matrix for the kernels in engine/cpu/matmul/. Rows are taken in groups of
ROWS (32, zero-padded at the end) and every field is stored "row-interleaved": for one group, one block
and one position inside the block, the values of the 32 rows are contiguous. A kernel then loads the
same weight position of 32 rows as one vector, multiplies it by one broadcast activation and keeps 32
per-row sums in vector lanes: no horizontal reductions, and each weight byte is read once per call.
The bit budget of every format is kept (the K-quants' packed scales get a byte each: Q4_K, Q5_K and
Q3_K grow by 2-4%, Q2_K by 19%), so decode, which is bound by bytes read, reads about what llama.cpp
reads. The 4/5/6-bit quants keep ggml's nibble pairing (j, j + 16), Q2_K/Q3_K hold four two-bit
quants (p, p + 8, p + 16, p + 24) a byte; the third, fifth and sixth bits are regrouped so that the
bit a kernel needs for a position sits at a shift known when the kernel is compiled (see PackedWeight).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property

import numpy as np

ROWS = 32  # rows per interleaved group: 32 lanes of int16 fill one 512-bit register
QK = 32  # weights per block (and per activation-quantization block)
QK_K = 256  # weights per K-quant super-block


class QType(IntEnum):
    """The ggml type numbers of the supported tensor types."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ4_NL = 20
    IQ4_XS = 23
    BF16 = 30
    MXFP4 = 39


@dataclass(frozen=True)
class BlockLayout:
    block_size: int  # weights per block
    type_size: int  # bytes per block


BLOCK_LAYOUTS: dict[QType, BlockLayout] = {
    QType.F32: BlockLayout(1, 4),
    QType.F16: BlockLayout(1, 2),
    QType.Q4_0: BlockLayout(32, 18),
    QType.Q4_1: BlockLayout(32, 20),
    QType.Q5_0: BlockLayout(32, 22),
    QType.Q5_1: BlockLayout(32, 24),
    QType.Q8_0: BlockLayout(32, 34),
    QType.Q2_K: BlockLayout(256, 84),
    QType.Q3_K: BlockLayout(256, 110),
    QType.Q4_K: BlockLayout(256, 144),
    QType.Q5_K: BlockLayout(256, 176),
    QType.Q6_K: BlockLayout(256, 210),
    QType.IQ4_NL: BlockLayout(32, 18),
    QType.IQ4_XS: BlockLayout(256, 136),
    QType.BF16: BlockLayout(1, 2),
    QType.MXFP4: BlockLayout(32, 17),
}

# IQ4_NL and IQ4_XS: a 4-bit index into these 16 non-uniform levels (ggml's kvalues_iq4nl).
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
# MXFP4: a 4-bit E2M1 value, doubled to an integer (ggml's kvalues_mxfp4); the block's E8M0 scale halved.
MXFP4_LEVELS = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """2^(e - 128) as float32 for E8M0 exponent bytes (ggml_e8m0_to_fp32_half; e < 2 are subnormal)."""
    e = np.asarray(e, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).astype(np.uint32)
    return bits.view(np.float32)


class UnsupportedTensorTypeError(ValueError):
    pass


def qtype_of(qtype: int) -> QType:
    """The QType for a ggml type number; UnsupportedTensorTypeError names any other type."""
    try:
        return QType(qtype)
    except ValueError:
        pass
    try:
        from gguf import GGMLQuantizationType

        name = GGMLQuantizationType(qtype).name
    except ValueError:
        name = "unknown"
    supported = ", ".join(t.name for t in QType)
    raise UnsupportedTensorTypeError(
        f"tensor type {name} (ggml type {qtype}) is not supported (supported: {supported})"
    )


def row_bytes(qtype: int, n_cols: int) -> int:
    layout = BLOCK_LAYOUTS[qtype_of(qtype)]
    if n_cols % layout.block_size:
        raise ValueError(f"{QType(qtype).name} rows need a multiple of {layout.block_size} columns")
    return n_cols // layout.block_size * layout.type_size


# ---------------------------------------------------------------------------------------------------
# Block decoding shared by dequantize and pack_weight. Each returns the integer quants of every weight
# (rows, cols) and the scales in float32 or as raw f16 bits, so the packer copies bits unchanged.


def _f16(raw: np.ndarray) -> np.ndarray:
    """f16 fields (2 consecutive bytes on the last axis) -> uint16 bits with the last axis dropped."""
    return np.ascontiguousarray(raw).view(np.uint16)[..., 0]


def _as_f32(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.float16).astype(np.float32)


def _blocks(data: np.ndarray, qtype: QType, shape: tuple[int, int]) -> np.ndarray:
    """The raw bytes as (rows, blocks per row, bytes per block)."""
    rows, cols = shape
    layout = BLOCK_LAYOUTS[qtype]
    raw = np.asarray(data).view(np.uint8).reshape(rows, -1)
    if raw.shape[1] != row_bytes(qtype, cols):
        raise ValueError(f"{qtype.name} {shape}: expected {row_bytes(qtype, cols)} bytes per row")
    return raw.reshape(rows, cols // layout.block_size, layout.type_size)


def _nibbles32(qs: np.ndarray) -> np.ndarray:
    """(..., 16) bytes of 32-blocks -> (..., 32) quants: byte j holds weights j (low) and j + 16 (high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q5_high_bits(qh: np.ndarray) -> np.ndarray:
    """(..., 4) bytes of a little-endian u32 -> (..., 32) bits, bit j for weight j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q4_k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., 12) bytes -> six-bit (scale, min) per sub-block, each (..., 8) uint8."""
    lo, hi, both = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([lo & 0x3F, (both & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([hi & 0x3F, (both >> 4) | ((hi >> 2) & 0x30)], axis=-1)
    return sc, mn


def _q4_k_quants(qs: np.ndarray) -> np.ndarray:
    """(..., 128) bytes -> (..., 256) quants: each 32-byte chunk holds sub-block 2c low, 2c + 1 high."""
    chunks = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return ((chunks >> np.array([0, 4], np.uint8).reshape(2, 1)) & 0x0F).reshape(*qs.shape[:-1], 256)


def _q5_k_quants(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """(..., 32) fifth-bit and (..., 128) nibble bytes -> (..., 256) five-bit quants (0..31)."""
    high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # (..., sub-block, 32)
    return _q4_k_quants(qs) | (high.reshape(*qh.shape[:-1], 256) << 4)


def _iq4_xs_scales(b: np.ndarray) -> np.ndarray:
    """IQ4_XS blocks (..., 136) -> the signed sub-block scales ls - 32, (..., 8) int8."""
    low = (b[..., 4:8, None] >> np.array([0, 4], np.uint8)) & 0x0F  # (..., 4, 2): sub-blocks 2i, 2i + 1
    high_bits = _f16(b[..., 2:4])[..., None] >> (2 * np.arange(8, dtype=np.uint16))
    high = (high_bits & 3).astype(np.uint8)
    return (low.reshape(*b.shape[:-1], 8) | (high << 4)).astype(np.int8) - np.int8(32)


def _two_bit_quants(qs: np.ndarray) -> np.ndarray:
    """(..., 64) Q2_K/Q3_K bytes -> (..., 256) two-bit values: byte l of chunk c (32 bytes) holds
    weight l of 32-sub-blocks 4c .. 4c + 3 in bits 0-1 .. 6-7."""
    lead = qs.shape[:-1]
    shifted = qs.reshape(*lead, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    return (shifted & 3).reshape(*lead, 256)


def _q3_k_quants(hmask: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """(..., 32) high-bit and (..., 64) low-bit bytes -> (..., 256) signed quants (-4..3)."""
    high = (hmask[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # (..., sub-block, 32)
    low = _two_bit_quants(qs).astype(np.int8)
    return low - ((1 - high.reshape(*hmask.shape[:-1], 256)) << 2).astype(np.int8)


def _q3_k_scales(scales: np.ndarray) -> np.ndarray:
    """(..., 12) bytes -> (..., 16) signed six-bit scales (sc - 32) per 16 weights."""
    low = (scales[..., None, 0:8] >> np.array([0, 4], np.uint8)[:, None]) & 0x0F  # (..., 2, 8)
    high = (scales[..., None, 8:12] >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3  # (..., 4, 4)
    lead = scales.shape[:-1]
    return (low.reshape(*lead, 16) | (high.reshape(*lead, 16) << 4)).astype(np.int8) - np.int8(32)


def _q6_k_quants(ql: np.ndarray, qh: np.ndarray) -> np.ndarray:
    """(..., 128) low and (..., 64) high bytes -> (..., 256) unsigned six-bit quants (0..63)."""
    lead = ql.shape[:-1]
    low = (ql.reshape(*lead, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)) & 0x0F
    high = (qh.reshape(*lead, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 0x03
    return low.reshape(*lead, 256) | (high.reshape(*lead, 256) << 4)


def dequantize(data: np.ndarray, qtype: int, shape: tuple[int, int]) -> np.ndarray:
    """Reference dequantization of a (rows, cols) matrix -> float32 (rows, cols)."""
    qt = qtype_of(qtype)
    rows, cols = shape
    if qt == QType.F32:
        return np.asarray(data).view(np.float32).reshape(rows, cols).copy()
    if qt == QType.F16:
        return np.asarray(data).view(np.float16).reshape(rows, cols).astype(np.float32)
    if qt == QType.BF16:  # the top half of a float32
        bits = np.asarray(data).view(np.int16).reshape(rows, cols).astype(np.int32) << 16
        return bits.view(np.float32)
    b = _blocks(data, qt, shape)
    if qt == QType.Q4_0:
        w = (_nibbles32(b[..., 2:]).astype(np.float32) - 8) * _as_f32(_f16(b[..., 0:2]))[..., None]
    elif qt == QType.Q4_1:
        d, m = _as_f32(_f16(b[..., 0:2]))[..., None], _as_f32(_f16(b[..., 2:4]))[..., None]
        w = _nibbles32(b[..., 4:]).astype(np.float32) * d + m
    elif qt == QType.Q5_0:
        q = _nibbles32(b[..., 6:]) | (_q5_high_bits(b[..., 2:6]) << 4)
        w = (q.astype(np.float32) - 16) * _as_f32(_f16(b[..., 0:2]))[..., None]
    elif qt == QType.Q5_1:
        d, m = _as_f32(_f16(b[..., 0:2]))[..., None], _as_f32(_f16(b[..., 2:4]))[..., None]
        q = _nibbles32(b[..., 8:]) | (_q5_high_bits(b[..., 4:8]) << 4)
        w = d * q.astype(np.float32) + m
    elif qt == QType.IQ4_NL:
        w = _as_f32(_f16(b[..., 0:2]))[..., None] * IQ4_LEVELS[_nibbles32(b[..., 2:])].astype(np.float32)
    elif qt == QType.IQ4_XS:
        dl = _as_f32(_f16(b[..., 0:2]))[..., None] * _iq4_xs_scales(b).astype(np.float32)
        levels = IQ4_LEVELS[_nibbles32(b[..., 8:].reshape(rows, -1, 8, 16))].astype(np.float32)
        w = dl[..., None] * levels
    elif qt == QType.Q8_0:
        w = b[..., 2:].view(np.int8).astype(np.float32) * _as_f32(_f16(b[..., 0:2]))[..., None]
    elif qt == QType.MXFP4:
        w = e8m0_half(b[..., 0])[..., None] * MXFP4_LEVELS[_nibbles32(b[..., 1:])].astype(np.float32)
    elif qt == QType.Q2_K:
        d, dmin = _as_f32(_f16(b[..., 80:82]))[..., None], _as_f32(_f16(b[..., 82:84]))[..., None]
        dl = d * (b[..., 0:16] & 0x0F).astype(np.float32)
        ml = dmin * (b[..., 0:16] >> 4).astype(np.float32)
        q = _two_bit_quants(b[..., 16:80]).reshape(rows, -1, 16, 16).astype(np.float32)
        w = dl[..., None] * q - ml[..., None]
    elif qt == QType.Q3_K:
        dl = _as_f32(_f16(b[..., 108:110]))[..., None] * _q3_k_scales(b[..., 96:108]).astype(np.float32)
        q = _q3_k_quants(b[..., 0:32], b[..., 32:96]).reshape(rows, -1, 16, 16).astype(np.float32)
        w = dl[..., None] * q
    elif qt == QType.Q4_K:
        d, dmin = _as_f32(_f16(b[..., 0:2]))[..., None], _as_f32(_f16(b[..., 2:4]))[..., None]
        sc, mn = _q4_k_scales(b[..., 4:16])
        q = _q4_k_quants(b[..., 16:]).reshape(rows, -1, 8, 32).astype(np.float32)
        w = (d * sc)[..., None] * q - (dmin * mn)[..., None]
    elif qt == QType.Q5_K:
        d, dmin = _as_f32(_f16(b[..., 0:2]))[..., None], _as_f32(_f16(b[..., 2:4]))[..., None]
        sc, mn = _q4_k_scales(b[..., 4:16])
        q = _q5_k_quants(b[..., 16:48], b[..., 48:]).reshape(rows, -1, 8, 32).astype(np.float32)
        w = (d * sc)[..., None] * q - (dmin * mn)[..., None]
    else:  # Q6_K
        q = _q6_k_quants(b[..., 0:128], b[..., 128:192]).astype(np.float32) - 32
        scale = _as_f32(_f16(b[..., 208:210]))[..., None] * b[..., 192:208].view(np.int8)
        w = q.reshape(rows, -1, 16, 16) * scale[..., None]
    return w.reshape(rows, cols).astype(np.float32, copy=False)


# ---------------------------------------------------------------------------------------------------
# Repacking for the kernels.


PACKED_FIELDS = ("qs", "qh", "d", "m", "sc", "mn", "f")  # PackedWeight's arrays


@dataclass(frozen=True)
class PackedWeight:
    """A weight matrix (n_rows = output features N, n_cols = input features K), repacked at load.

    Every array is 2-D, C-contiguous, shaped (n_groups, per-group length): group g holds rows
    32g .. 32g + 31 and the last axis runs (block, position in block, row of the group). Fields a type
    does not use are (n_groups, 0). With nb = n_cols / 32 and ns = n_cols / 256:

        F32   f  float32 (g, K * 32): weight k of the 32 rows
        F16   f  uint16 f16 bits, as F32
        BF16  f  int16 bf16 bits, as F32 (signed: the dtype tells the kernels which half format)
        Q4_0  qs uint8 (g, nb * 16 * 32): byte j of block b = ggml's byte (weights j, j + 16)
              d  uint16 f16 (g, nb * 32)
        Q4_1  qs, d as Q4_0; m uint16 f16 (g, nb * 32) the block minimum
        Q5_0  qs, d as Q4_0 (low four bits); qh uint8 (g, nb * 4 * 32): byte c of block b holds the
              fifth bits of weights (4c + i, 4c + i + 16) in bits (2i, 2i + 1), i = 0..3
        Q5_1  qs, qh, d as Q5_0; m uint16 f16 (g, nb * 32) the block minimum
        IQ4_NL qs, d as Q4_0 (the nibbles index IQ4_LEVELS)
        IQ4_XS qs as IQ4_NL per 32-sub-block; sc int8 (g, nb * 32) ls - 32; d uint16 f16 (g, ns * 32)
        MXFP4 qs as Q4_0 (the nibbles index MXFP4_LEVELS); sc uint8 (g, nb * 32) the E8M0 exponent
        Q8_0  qs int8 (g, nb * 32 * 32) weight k of block b; d as Q4_0
        Q2_K  qs uint8 (g, nb * 8 * 32): byte p of block b holds the two-bit quants of weights p, p + 8,
              p + 16, p + 24 in bits 0-1 .. 6-7 (p < 8); sc, mn uint8 (g, nb * 2 * 32) scale and min
              per 16 weights; d, m uint16 f16 (g, ns * 32)
        Q3_K  qs as Q2_K holding the low two bits of q + 4 (0..7); qh uint8 (g, nb * 4 * 32): byte c of
              block b holds the third bits of weights c + 8k in bit k and of c + 4 + 8k in bit 4 + k;
              sc int8 (g, nb * 2 * 32) sc - 32 per 16 weights; d uint16 f16 (g, ns * 32)
        Q4_K  qs as Q4_0 per 32-sub-block (re-paired from ggml's 64-weight chunks)
              sc, mn uint8 (g, nb * 32) six-bit scale and min per sub-block
              d, m uint16 f16 (g, ns * 32) super-block scale and dmin
        Q5_K  qs, sc, mn, d, m as Q4_K; qh fifth bits per 32-sub-block as Q5_0
        Q6_K  qs low four bits as Q4_0 per 32-block
              qh uint8 (g, nb * 8 * 32): byte p of block b holds the two top bits of weights
              2p, 2p + 16, 2p + 1, 2p + 17 in bits 0-1, 2-3, 4-5, 6-7
              sc int8 (g, nb * 2 * 32) scale per 16 weights; d uint16 f16 (g, ns * 32)
    """

    qtype: int
    n_rows: int
    n_cols: int
    qs: np.ndarray
    qh: np.ndarray
    d: np.ndarray
    m: np.ndarray
    sc: np.ndarray
    mn: np.ndarray
    f: np.ndarray
    # The CPU backend's own layouts (engine/cpu/records.py): Q4_K's records in qs (mins in mn), Q6_K's qs
    # and qh in row quads.
    repacked: bool = False

    @property
    def n_groups(self) -> int:
        return self.qs.shape[0]

    @cached_property
    def nbytes(self) -> int:
        """Bytes a matmul reads (padding rows included). Cached: every CPU matmul asks (chunks or not),
        and the sum over the fields' arrays was 0.7% of the engine thread's decode time (perf, Qwen)."""
        return sum(getattr(self, f).nbytes for f in PACKED_FIELDS)


def _interleave(fields: np.ndarray, n_groups: int) -> np.ndarray:
    """(rows, *per-row dims) -> (groups, *per-row dims, 32 rows) flattened per group, zero-padded."""
    rows = fields.shape[0]
    if rows != n_groups * ROWS:
        padded = np.zeros((n_groups * ROWS, *fields.shape[1:]), fields.dtype)
        padded[:rows] = fields
        fields = padded
    grouped = fields.reshape(n_groups, ROWS, *fields.shape[1:])
    moved = np.moveaxis(grouped, 1, -1)
    return np.ascontiguousarray(moved).reshape(n_groups, -1)


def _pair_nibbles(q: np.ndarray) -> np.ndarray:
    """(..., 32) quants of a 32-block -> (..., 16) bytes, byte j = q[j] | q[j + 16] << 4."""
    return (q[..., :16] & 0x0F) | (q[..., 16:] << 4)


def _pack_q5_high(bits: np.ndarray) -> np.ndarray:
    """(..., 32) fifth bits -> (..., 4) bytes laid out as PackedWeight documents for Q5_0."""
    lo = bits[..., :16].reshape(*bits.shape[:-1], 4, 4)  # [c, i] = weight 4c + i
    hi = bits[..., 16:].reshape(*bits.shape[:-1], 4, 4)
    shift = 2 * np.arange(4, dtype=np.uint8)
    return ((lo << shift) | (hi << (shift + 1))).sum(axis=-1, dtype=np.uint8)


def _pack_q6_high(high: np.ndarray) -> np.ndarray:
    """(..., 32) two-bit tops of a 32-block -> (..., 8) bytes laid out as documented for Q6_K."""
    lo, hi = high[..., :16], high[..., 16:]
    return lo[..., 0::2] | (hi[..., 0::2] << 2) | (lo[..., 1::2] << 4) | (hi[..., 1::2] << 6)


def pack_weight(data: np.ndarray, qtype: int, shape: tuple[int, int]) -> PackedWeight:
    """Repack stored rows (any (rows, bytes per row) array of one type, e.g. q|k|v concatenated)."""
    qt = qtype_of(qtype)
    rows, cols = shape
    n_groups = -(-rows // ROWS)
    empty_u8 = np.zeros((n_groups, 0), np.uint8)
    empty_u16 = np.zeros((n_groups, 0), np.uint16)
    parts: dict[str, np.ndarray] = {}
    if qt in (QType.F32, QType.F16, QType.BF16):
        dtype = {QType.F32: np.float32, QType.F16: np.uint16, QType.BF16: np.int16}[qt]
        parts["f"] = _interleave(np.asarray(data).view(dtype).reshape(rows, cols), n_groups)
    else:
        b = _blocks(data, qt, shape)
        parts.update(_PACKERS[qt](b, n_groups))
    return PackedWeight(
        qtype=int(qt),
        n_rows=rows,
        n_cols=cols,
        qs=parts.get("qs", empty_u8),
        qh=parts.get("qh", empty_u8),
        d=parts.get("d", empty_u16),
        m=parts.get("m", empty_u16),
        sc=parts.get("sc", empty_u8),
        mn=parts.get("mn", empty_u8),
        f=parts.get("f", np.zeros((n_groups, 0), np.float32)),
    )


def _pack_q4_0(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    return {"qs": _interleave(b[..., 2:], n_groups), "d": _interleave(_f16(b[..., 0:2]), n_groups)}


def _pack_q4_1(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    return {
        "qs": _interleave(b[..., 4:], n_groups),
        "d": _interleave(_f16(b[..., 0:2]), n_groups),
        "m": _interleave(_f16(b[..., 2:4]), n_groups),
    }


def _pack_q5_0(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    return {
        "qs": _interleave(b[..., 6:], n_groups),
        "qh": _interleave(_pack_q5_high(_q5_high_bits(b[..., 2:6])), n_groups),
        "d": _interleave(_f16(b[..., 0:2]), n_groups),
    }


def _pack_q5_1(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    return {
        "qs": _interleave(b[..., 8:], n_groups),
        "qh": _interleave(_pack_q5_high(_q5_high_bits(b[..., 4:8])), n_groups),
        "d": _interleave(_f16(b[..., 0:2]), n_groups),
        "m": _interleave(_f16(b[..., 2:4]), n_groups),
    }


def _pack_iq4_xs(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    rows = b.shape[0]
    return {
        "qs": _interleave(b[..., 8:].reshape(rows, -1, 16), n_groups),
        "sc": _interleave(_iq4_xs_scales(b).reshape(rows, -1), n_groups),
        "d": _interleave(_f16(b[..., 0:2]), n_groups),
    }


def _pack_mxfp4(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    return {"qs": _interleave(b[..., 1:], n_groups), "sc": _interleave(b[..., 0], n_groups)}


def _pack_q8_0(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    return {
        "qs": _interleave(b[..., 2:].view(np.int8), n_groups),
        "d": _interleave(_f16(b[..., 0:2]), n_groups),
    }


def _k_nibble_pairs(qs: np.ndarray) -> np.ndarray:
    """(rows, super-blocks, 128) Q4_K/Q5_K nibble bytes -> (rows, 32-blocks, 16) paired as (j, j + 16).

    ggml pairs weights l and l + 32 of a 64-chunk in one byte; re-pair them per 32-block."""
    rows = qs.shape[0]
    chunks = qs.reshape(rows, -1, 4, 2, 16)  # (row, super-block, chunk, half, 16 bytes)
    first, second = chunks[..., 0, :], chunks[..., 1, :]
    even = (first & 0x0F) | (second << 4)  # sub-block 2c: low nibbles
    odd = (first >> 4) | (second & 0xF0)  # sub-block 2c + 1: high nibbles
    return np.stack([even, odd], axis=-2).reshape(rows, -1, 16)


def _crumbs(q: np.ndarray) -> np.ndarray:
    """(..., 32) two-bit values of a 32-block -> (..., 8) bytes, byte p = q[p + 8k] << 2k for k < 4."""
    parts = q.reshape(*q.shape[:-1], 4, 8).astype(np.uint8) << (2 * np.arange(4, dtype=np.uint8))[:, None]
    return np.bitwise_or.reduce(parts, axis=-2)


def _third_bits(high: np.ndarray) -> np.ndarray:
    """(..., 32) bits of a 32-block -> (..., 4) bytes; byte c: bit(c + 8k) at k, bit(c + 4 + 8k) at 4 + k."""
    parts = high.reshape(*high.shape[:-1], 4, 2, 4).astype(np.uint8)  # [k, half, c] = weight 8k + 4 half + c
    shifts = (np.arange(4, dtype=np.uint8)[:, None] + np.array([0, 4], np.uint8)[None, :])[..., None]
    return np.bitwise_or.reduce((parts << shifts).reshape(*high.shape[:-1], 8, 4), axis=-2)


def _pack_q2_k(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    rows = b.shape[0]
    q = _two_bit_quants(b[..., 16:80]).reshape(rows, -1, 32)
    return {
        "qs": _interleave(_crumbs(q), n_groups),
        "sc": _interleave((b[..., 0:16] & 0x0F).reshape(rows, -1), n_groups),
        "mn": _interleave((b[..., 0:16] >> 4).reshape(rows, -1), n_groups),
        "d": _interleave(_f16(b[..., 80:82]), n_groups),
        "m": _interleave(_f16(b[..., 82:84]), n_groups),
    }


def _pack_q3_k(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    rows = b.shape[0]
    q = (_q3_k_quants(b[..., 0:32], b[..., 32:96]) + 4).astype(np.uint8).reshape(rows, -1, 32)
    return {
        "qs": _interleave(_crumbs(q & 3), n_groups),
        "qh": _interleave(_third_bits(q >> 2), n_groups),
        "sc": _interleave(_q3_k_scales(b[..., 96:108]).reshape(rows, -1), n_groups),
        "d": _interleave(_f16(b[..., 108:110]), n_groups),
    }


def _pack_q4_k(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    rows = b.shape[0]
    qs = _k_nibble_pairs(b[..., 16:])
    sc, mn = _q4_k_scales(b[..., 4:16])
    return {
        "qs": _interleave(qs, n_groups),
        "sc": _interleave(sc.reshape(rows, -1), n_groups),
        "mn": _interleave(mn.reshape(rows, -1), n_groups),
        "d": _interleave(_f16(b[..., 0:2]), n_groups),
        "m": _interleave(_f16(b[..., 2:4]), n_groups),
    }


def _pack_q5_k(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    rows = b.shape[0]
    sc, mn = _q4_k_scales(b[..., 4:16])
    fifth = (_q5_k_quants(b[..., 16:48], b[..., 48:]) >> 4).reshape(rows, -1, 32)
    return {
        "qs": _interleave(_k_nibble_pairs(b[..., 48:]), n_groups),
        "qh": _interleave(_pack_q5_high(fifth), n_groups),
        "sc": _interleave(sc.reshape(rows, -1), n_groups),
        "mn": _interleave(mn.reshape(rows, -1), n_groups),
        "d": _interleave(_f16(b[..., 0:2]), n_groups),
        "m": _interleave(_f16(b[..., 2:4]), n_groups),
    }


def _pack_q6_k(b: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    rows = b.shape[0]
    q = _q6_k_quants(b[..., 0:128], b[..., 128:192]).reshape(rows, -1, 32)
    return {
        "qs": _interleave(_pair_nibbles(q & 0x0F), n_groups),
        "qh": _interleave(_pack_q6_high(q >> 4), n_groups),
        "sc": _interleave(b[..., 192:208].view(np.int8).reshape(rows, -1), n_groups),
        "d": _interleave(_f16(b[..., 208:210]), n_groups),
    }


_PACKERS = {
    QType.Q4_0: _pack_q4_0,
    QType.Q4_1: _pack_q4_1,
    QType.Q5_0: _pack_q5_0,
    QType.Q5_1: _pack_q5_1,
    QType.IQ4_NL: _pack_q4_0,
    QType.IQ4_XS: _pack_iq4_xs,
    QType.Q8_0: _pack_q8_0,
    QType.Q2_K: _pack_q2_k,
    QType.Q3_K: _pack_q3_k,
    QType.Q4_K: _pack_q4_k,
    QType.Q5_K: _pack_q5_k,
    QType.Q6_K: _pack_q6_k,
    QType.MXFP4: _pack_mxfp4,
}
