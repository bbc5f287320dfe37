"""Block formats: the numpy reference dequantization against gguf-py, and the kernel repacking."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from engine import quant
from engine.gguf import GGUFFile
from engine.quant import QType

RNG = np.random.default_rng(0)
QUANTIZED = [q for q in QType if q not in (QType.F32, QType.F16, QType.BF16)]
# Byte offsets of the f16 scale fields per block, set to sane values in random K-quant blocks.
_F16_FIELDS = {
    QType.Q2_K: (80, 82),
    QType.Q3_K: (108,),
    QType.Q4_K: (0, 2),
    QType.Q5_K: (0, 2),
    QType.Q6_K: (208,),
    QType.IQ4_NL: (0,),
    QType.IQ4_XS: (0,),
}


# Q2_K's four-bit scales and mins get a byte each: 100 bytes per 256 weights against 84 stored.
SCALE_GROWTH = {QType.Q2_K: 1.2}


def random_blocks(qtype: QType, rows: int, cols: int) -> np.ndarray:
    """Stored bytes (rows, bytes per row) of a random matrix of the type."""
    if qtype == QType.F32:
        return RNG.standard_normal((rows, cols)).astype(np.float32)
    if qtype == QType.F16:
        return RNG.standard_normal((rows, cols)).astype(np.float16)
    if qtype in _F16_FIELDS:  # gguf-py cannot quantize K-quants or IQ4: random bits, finite scales
        layout = quant.BLOCK_LAYOUTS[qtype]
        raw = RNG.integers(0, 256, (rows, cols // layout.block_size, layout.type_size), dtype=np.uint8)
        for offset in _F16_FIELDS[qtype]:
            scale = (RNG.random((rows, raw.shape[1])) * 0.02).astype(np.float16)
            raw[..., offset : offset + 2] = scale.view(np.uint8).reshape(rows, -1, 2)
        return raw.reshape(rows, -1)
    weights = RNG.standard_normal((rows, cols)).astype(np.float32)
    return gguf_quants.quantize(weights, GGMLQuantizationType(int(qtype)))


def gguf_reference(data: np.ndarray, qtype: int, shape: tuple[int, int]) -> np.ndarray:
    return gguf_quants.dequantize(np.asarray(data), GGMLQuantizationType(qtype)).reshape(shape)


@pytest.mark.parametrize("qtype", list(QType), ids=lambda q: q.name)
def test_dequantize_random_blocks(qtype: QType) -> None:
    shape = (7, 512)
    data = random_blocks(qtype, *shape)
    got = quant.dequantize(data, qtype, shape)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_array_equal(got, gguf_reference(data, qtype, shape))


def test_mxfp4_every_exponent_dequantizes_as_gguf_does() -> None:
    """MXFP4's E8M0 scales over their whole range (2^-128 .. 2^127: subnormal, normal, past float32's
    range with the larger levels) and every nibble: bit for bit gguf-py's values (inf included)."""
    raw = RNG.integers(0, 256, (256, 4, 17), dtype=np.uint8)
    raw[:, :, 0] = np.arange(256, dtype=np.uint8)[:, None]
    data = raw.reshape(256, -1)
    with np.errstate(over="ignore"):
        got = quant.dequantize(data, QType.MXFP4, (256, 128))
        want = gguf_reference(data, QType.MXFP4, (256, 128))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert got[0, 0] == quant.MXFP4_LEVELS[data[0, 1] & 15] * 2.0**-128  # weight 0: the low nibble


def _first_of_each_type(gguf_file: GGUFFile) -> dict[str, object]:
    seen: dict[str, object] = {}
    for t in gguf_file.tensors.values():
        if len(t.shape) == 2 and t.type_name not in seen:
            seen[t.type_name] = t
    return seen


@pytest.mark.parametrize("model", ["smollm2_gguf", "gemma3_gguf"])
def test_dequantize_real_tensors(model: str, request: pytest.FixtureRequest) -> None:
    tensors = _first_of_each_type(request.getfixturevalue(model))
    assert tensors
    for t in tensors.values():
        rows = t.data[:40]  # type: ignore[attr-defined]
        shape = (40, t.shape[1])  # type: ignore[attr-defined]
        got = quant.dequantize(rows, t.ggml_type, shape)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(got, gguf_reference(rows, t.ggml_type, shape), err_msg=t.name)  # type: ignore[attr-defined]


# The tensor types of the two model files (their model cards list the same).
MODEL_TYPES = {
    "smollm2_gguf": {QType.F32, QType.Q4_1, QType.Q8_0},
    "gemma3_gguf": {QType.F32, QType.Q5_0, QType.Q4_K, QType.Q8_0, QType.Q6_K},
}


@pytest.mark.parametrize("model", list(MODEL_TYPES))
def test_model_types_are_covered(model: str, request: pytest.FixtureRequest) -> None:
    tensors = request.getfixturevalue(model).tensors.values()
    types = {quant.qtype_of(t.ggml_type) for t in tensors}  # raises on a type Llamba cannot read
    assert types == MODEL_TYPES[model]


def test_unsupported_type_is_named() -> None:
    with pytest.raises(quant.UnsupportedTensorTypeError, match="IQ2_XXS"):
        quant.qtype_of(int(GGMLQuantizationType.IQ2_XXS))
    with pytest.raises(quant.UnsupportedTensorTypeError, match="IQ3_S"):
        quant.pack_weight(np.zeros((1, 110), np.uint8), int(GGMLQuantizationType.IQ3_S), (1, 256))
    with pytest.raises(quant.UnsupportedTensorTypeError, match="unknown"):
        quant.dequantize(np.zeros((1, 4), np.uint8), 999, (1, 4))


def test_wrong_row_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="bytes per row"):
        quant.dequantize(np.zeros((2, 40), np.uint8), QType.Q4_0, (2, 64))
    with pytest.raises(ValueError, match="multiple of 256"):
        quant.row_bytes(QType.Q4_K, 640)


@pytest.mark.parametrize("qtype", list(QType), ids=lambda q: q.name)
def test_pack_layout(qtype: QType) -> None:
    rows, cols = 70, 512  # 70 rows: three groups, the last one padded
    w = quant.pack_weight(random_blocks(qtype, rows, cols), qtype, (rows, cols))
    assert (w.qtype, w.n_rows, w.n_cols, w.n_groups) == (int(qtype), rows, cols, 3)
    for a in (w.qs, w.qh, w.d, w.m, w.sc, w.mn, w.f):
        assert a.ndim == 2 and a.shape[0] == 3 and a.flags.c_contiguous
    # The packed bytes hold what the stored ones do, bar the K-quant scales spread to a byte each.
    stored = quant.row_bytes(qtype, cols) * 96
    assert stored <= w.nbytes <= stored * SCALE_GROWTH.get(qtype, 1.05)


@pytest.mark.parametrize("model", list(MODEL_TYPES))
def test_every_matrix_of_the_models_packs(model: str, request: pytest.FixtureRequest) -> None:
    """Each 2-D tensor of the real files packs to its shape and about its stored size. (How long packing
    takes is part of the load time that scripts/first_token.py prints.)"""
    matrices = [t for t in request.getfixturevalue(model).tensors.values() if len(t.shape) == 2]
    assert matrices
    for t in matrices:
        rows, cols = t.shape
        w = quant.pack_weight(t.data, t.ggml_type, t.shape)
        n_groups = -(-rows // quant.ROWS)
        assert (w.qtype, w.n_rows, w.n_cols, w.n_groups) == (t.ggml_type, rows, cols, n_groups), t.name
        stored = quant.row_bytes(t.ggml_type, cols) * w.n_groups * quant.ROWS  # the last group is padded
        assert stored <= w.nbytes <= stored * 1.05, t.name
