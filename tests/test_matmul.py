"""The CPU matmul and get_rows kernels against numpy references, for every supported weight type.

Two references: x @ W.T in float (the integer kernels quantize x to int8 per 32-block, so they match it
to about 1e-2 of the output RMS), and the same product with x replaced by its int8 quantization, which
the integer kernels must match to float rounding (this one catches int16 overflow and layout slips).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine import quant
from engine.cpu import matmul as mm
from engine.cpu.matmul import dispatch
from engine.gguf import GGUFFile
from engine.quant import QType
from tests.conftest import applies_only
from tests.test_quant import random_blocks

pytestmark = pytest.mark.every_level  # kernels against numpy, on each level (tests/conftest.py)

RNG = np.random.default_rng(1)
# Not a missing prerequisite: a process on the portable level (a CPU without AVX2, or
# LLAMBA_CPU_LEVEL=portable) has only the int16 / int32 kernels, so there are no byte kernels to check;
# tests/test_cpu_levels.py runs these tests on every other level the CPU can execute, a subprocess each.
BYTE_DOT_ONLY = applies_only(
    mm.BYTE_DOT, "the portable level has no byte dot-product kernels (test_cpu_levels runs the other levels)"
)
INT16_PATH = {QType.Q4_0, QType.Q4_1, QType.Q5_0, QType.Q5_1, QType.Q4_K, QType.Q5_K, QType.Q6_K}
INT16_PATH |= {QType.Q2_K, QType.Q3_K}
# The types whose activations the kernels quantize to int8 (IQ4 and Q8_0 sum in int32).
INTEGER_PATH = INT16_PATH | {QType.IQ4_NL, QType.IQ4_XS, QType.Q8_0, QType.MXFP4}


def rel_rms(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref**2)))


def rel_max(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.sqrt(np.mean(ref**2)))


def quantized_x(x: np.ndarray, qtype: int) -> np.ndarray:
    """x as the integer kernels see it for the type: int8 values times the block scale."""
    xq, xd, _ = mm.quantize_activations(x, mm.ACTIVATIONS[QType(qtype)])
    return (xq.reshape(len(x), -1, quant.QK) * xd[..., None]).reshape(x.shape).astype(np.float32)


def bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (ties to even), as float32."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def run_matmul(w: quant.PackedWeight, x: np.ndarray) -> np.ndarray:
    out = np.full((len(x), w.n_rows), np.nan, np.float32)
    mm.matmul(x, w, out)
    return out


def exact_product(qtype: int, w: quant.PackedWeight, weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """What the integer kernels compute exactly: x as they quantize it times W, where the q8_1 types
    (Q4_1, Q5_1) take their block minimum times llama.cpp's f16-rounded block sum instead."""
    exact = quantized_x(x, qtype) @ weights.T
    if mm.ACTIVATIONS[QType(qtype)] == mm.ACT_Q8_1:
        xq, xd, xs = mm.quantize_activations(x, mm.ACT_Q8_1)
        sums = xd * xq.reshape(len(x), -1, quant.QK).sum(axis=-1, dtype=np.float32)
        nb = w.n_cols // quant.QK
        mins = w.m.view(np.float16).astype(np.float32).reshape(w.n_groups, nb, quant.ROWS)
        mins = mins.transpose(0, 2, 1).reshape(-1, nb)[: w.n_rows]
        exact += (xs - sums) @ mins.T
    return exact


def check(qtype: int, w: quant.PackedWeight, weights: np.ndarray, x: np.ndarray, tol: float = 1e-2) -> None:
    got = run_matmul(w, x)
    assert np.isfinite(got).all()
    ref = x @ weights.T
    if qtype in INTEGER_PATH:
        if mm.ACTIVATIONS[QType(qtype)] == mm.ACT_Q8_K:
            tol *= 1.5  # q8_K: one activation scale per 256 values, not per 32: coarser
        assert rel_rms(got, ref) < tol
        assert rel_max(got, ref) < 10 * tol  # the largest of thousands of outputs: heavy-tailed
        assert rel_max(got, exact_product(qtype, w, weights, x)) < 1e-4
    elif qtype == QType.BF16:  # the activations are rounded to bf16 as llama.cpp's are
        assert rel_max(got, bf16(x) @ weights.T) < 1e-4
    else:
        assert rel_max(got, ref) < 1e-4


@pytest.mark.parametrize("n_tok", [1, 3, 13, 64])
@pytest.mark.parametrize("qtype", list(QType), ids=lambda q: q.name)
def test_matmul_random(qtype: QType, n_tok: int) -> None:
    rows, cols = (70, 512) if n_tok != 13 else (33, 768)
    data = random_blocks(qtype, rows, cols)
    w = quant.pack_weight(data, qtype, (rows, cols))
    weights = quant.dequantize(data, qtype, (rows, cols))
    check(qtype, w, weights, RNG.standard_normal((n_tok, cols)).astype(np.float32))


def test_float_odd_width() -> None:
    weights = RNG.standard_normal((40, 37)).astype(np.float32)
    x = RNG.standard_normal((5, 37)).astype(np.float32)
    check(QType.F32, quant.pack_weight(weights, QType.F32, weights.shape), weights, x)


@pytest.mark.parametrize("qtype", [QType.F32, QType.F16, QType.BF16], ids=lambda q: q.name)
def test_float_kernels_agree_to_the_bit(qtype: QType) -> None:
    """The float kernel runs panels of 16 rows x 6, 4, 2, 1 tokens on the 256-bit FMA levels and tiles
    of 32 rows x 8, 4, 2, 1 elsewhere (engine/cpu/matmul/floats.py): one fma per product in position
    order in both, so a 23-token batch (panels 6, 6, 6, 4 then a token alone) gives each token's
    outputs bit for bit as it gets alone and as the tiles give them; 70 rows: a last group of 6."""
    from engine.cpu.matmul.floats import _matmul_float

    rows, cols = 70, 45
    data = random_blocks(qtype, rows, cols)
    w = quant.pack_weight(data, qtype, (rows, cols))
    x = RNG.standard_normal((23, cols)).astype(np.float32)
    if qtype == QType.BF16:
        x = bf16(x)  # as dispatch rounds them
    batched = run_matmul(w, x)
    alone = np.concatenate([run_matmul(w, x[t : t + 1]) for t in range(len(x))])
    np.testing.assert_array_equal(batched, alone)
    tiles = np.full_like(batched, np.nan)
    _matmul_float(x, w.f, tiles)
    np.testing.assert_array_equal(batched, tiles)


def test_float_token_blocks_agree_to_the_bit() -> None:
    """Many tokens run in blocks of ~192 KB of activations (floats.py's TOKEN_BLOCK_BYTES: 24 tokens of
    2048 columns): 53 tokens are blocks of 24, 24 and 5, each token's outputs as it gets them alone."""
    from engine.cpu.matmul.floats import _token_block

    rows, cols = 70, 2048
    assert _token_block(53, cols) == 24
    w = quant.pack_weight(random_blocks(QType.F16, rows, cols), QType.F16, (rows, cols))
    x = RNG.standard_normal((53, cols)).astype(np.float32)
    alone = np.concatenate([run_matmul(w, x[t : t + 1]) for t in range(len(x))])
    np.testing.assert_array_equal(run_matmul(w, x), alone)


def _extreme_blocks(qtype: QType, rows: int, cols: int) -> np.ndarray:
    """Every quant at the value whose int16 products are largest: nibble 15 where the kernel sums
    unsigned nibbles (Q4_0, Q4_1, Q4_K), the most negative centred value where it sums q - 16 (Q5_0, Q5_K)
    or q - 32 (Q6_K): all bits clear; MXFP4's largest level, -12 (its byte tiles sum level + 16)."""
    layout = quant.BLOCK_LAYOUTS[qtype]
    raw = np.zeros((rows, cols // layout.block_size, layout.type_size), np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    if qtype == QType.Q4_K:
        raw[..., 0:2] = scale
        raw[..., 4:16] = 0x3F  # six-bit scales and mins of 63
        raw[..., 16:] = 0xFF
    elif qtype == QType.Q5_K:  # summed as q - 16: all quants 0
        raw[..., 0:2] = scale
        raw[..., 4:16] = 0x3F
    elif qtype == QType.Q6_K:
        raw[..., 208:210] = scale
        raw[..., 192:208] = 127
    elif qtype == QType.Q3_K:  # stored as q + 4: all high bits set and low bits 3 (q = 3, stored 7)
        raw[..., 108:110] = scale
        raw[..., 0:96] = 0xFF
        raw[..., 96:108] = 0xFF  # scales 63 - 32 = 31
    elif qtype == QType.MXFP4:  # every nibble 15 (level -12), scale 2^(120 - 128)
        raw[..., 0] = 120
        raw[..., 1:] = 0xFF
    elif qtype == QType.Q2_K:  # q = 3 everywhere, scales and mins 15
        raw[..., 80:82] = scale
        raw[..., 82:84] = scale
        raw[..., 0:80] = 0xFF
    else:
        raw[..., 0:2] = scale
        if qtype == QType.Q4_0:
            raw[..., 2:] = 0xFF
        elif qtype == QType.Q4_1:
            raw[..., 4:] = 0xFF
        elif qtype == QType.Q8_0:
            raw[..., 2:] = 0x80  # -128
        # Q5_0 and Q5_1 (summed as q - 16): all quant bits clear
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("qtype", sorted(INT16_PATH), ids=lambda q: QType(q).name)
def test_int16_sums_do_not_overflow(qtype: QType, sign: float) -> None:
    rows, cols = 32, 512
    data = _extreme_blocks(qtype, rows, cols)
    weights = quant.dequantize(data, qtype, (rows, cols))
    x = np.full((2, cols), sign, np.float32)  # every activation quantizes to +-127
    got = run_matmul(quant.pack_weight(data, qtype, (rows, cols)), x)
    np.testing.assert_allclose(got, x @ weights.T, rtol=1e-4)


@pytest.mark.parametrize("qtype", list(QType), ids=lambda q: q.name)
def test_get_rows_random(qtype: QType) -> None:
    rows, cols = 70, 512
    data = random_blocks(qtype, rows, cols)
    w = quant.pack_weight(data, qtype, (rows, cols))
    ids = np.array([0, 69, 31, 32, 5, 5], np.int32)
    out = np.empty((len(ids), cols), np.float32)
    mm.get_rows(w, ids, out)
    np.testing.assert_array_equal(out, quant.dequantize(data, qtype, (rows, cols))[ids])


def test_concatenated_rows_pack_as_one() -> None:
    """q|k|v (or gate|up) rows concatenated before packing give the concatenated outputs."""
    parts = [random_blocks(QType.Q4_1, n, 256) for n in (64, 16, 16)]
    x = RNG.standard_normal((3, 256)).astype(np.float32)
    fused = run_matmul(quant.pack_weight(np.concatenate(parts), QType.Q4_1, (96, 256)), x)
    single = [run_matmul(quant.pack_weight(p, QType.Q4_1, (len(p), 256)), x) for p in parts]
    np.testing.assert_array_equal(fused, np.concatenate(single, axis=1))


def test_argument_checks() -> None:
    w = quant.pack_weight(random_blocks(QType.Q8_0, 32, 64), QType.Q8_0, (32, 64))
    with pytest.raises(ValueError, match="shapes"):
        mm.matmul(np.zeros((2, 32), np.float32), w, np.zeros((2, 32), np.float32))
    with pytest.raises(TypeError):
        mm.matmul(np.zeros((2, 64)), w, np.zeros((2, 32), np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        mm.matmul(np.zeros((64, 2), np.float32).T, w, np.zeros((2, 32), np.float32))
    with pytest.raises(IndexError):
        mm.get_rows(w, np.array([32], np.int32), np.zeros((1, 64), np.float32))


def _real_matrices(gguf_file: GGUFFile, max_rows: int = 2048) -> list:  # type: ignore[type-arg]
    """One matrix of every type in the file (the head cut to max_rows rows)."""
    seen: dict[str, object] = {}
    for t in gguf_file.tensors.values():
        if len(t.shape) == 2 and t.type_name not in seen:
            seen[t.type_name] = t
    return [
        (t.name, t.ggml_type, t.data[:max_rows], (min(t.shape[0], max_rows), t.shape[1]))
        for t in seen.values()
    ]  # type: ignore[attr-defined]


@pytest.mark.parametrize("model", ["smollm2_gguf", "gemma3_gguf"])
@pytest.mark.parametrize("n_tok", [1, 3, 64])
def test_matmul_real_tensors(model: str, n_tok: int, request: pytest.FixtureRequest) -> None:
    for name, qtype, data, shape in _real_matrices(request.getfixturevalue(model)):
        w = quant.pack_weight(data, qtype, shape)
        weights = quant.dequantize(data, qtype, shape)
        # Activations shaped like a model's: mostly small, a few large channels. An outlier sets its
        # block's int8 scale, so the rest of the block rounds coarser: twice the tolerance.
        x = RNG.standard_normal((n_tok, shape[1])).astype(np.float32)
        x[:, :: max(1, shape[1] // 8)] *= 8
        try:
            check(qtype, w, weights, x, tol=2e-2)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_get_rows_real_embeddings(smollm2_gguf: GGUFFile, gemma3_gguf: GGUFFile) -> None:
    for f in (smollm2_gguf, gemma3_gguf):
        t = f.tensors["token_embd.weight"]
        w = quant.pack_weight(t.data, t.ggml_type, t.shape)
        ids = np.array([0, 1, 2, t.shape[0] - 1, 12345], np.int32)
        out = np.empty((len(ids), t.shape[1]), np.float32)
        mm.get_rows(w, ids, out)
        np.testing.assert_array_equal(out, quant.dequantize(t.data[ids], t.ggml_type, (len(ids), t.shape[1])))


@BYTE_DOT_ONLY
@pytest.mark.parametrize(
    "qtype",
    sorted(INTEGER_PATH - {QType.Q2_K, QType.Q3_K, QType.IQ4_NL, QType.IQ4_XS}),
    ids=lambda q: QType(q).name,
)
def test_byte_dot_path_is_bitwise_the_portable_path(qtype: QType, monkeypatch: pytest.MonkeyPatch) -> None:
    """On every level but portable these types' tiles of every size sum on the byte dot products
    (engine/cpu/simd.py; 23 tokens: tiles 8, 8, 4, 2, 1); their outputs must not differ from the
    portable (int16 / int32) kernels' by a bit (a token's logits may not depend on the batch, nor on
    the level), extreme blocks included."""
    rows, cols = 70, 512
    for data in (random_blocks(qtype, rows, cols), _extreme_blocks(qtype, rows, cols)):
        w = quant.pack_weight(data, qtype, (rows, cols))
        x = RNG.standard_normal((23, cols)).astype(np.float32)
        x[:3] = np.sign(x[:3])  # rows whose activations all quantize to +-127
        x[-3:] = np.sign(x[-3:])  # the same in the 2- and 1-token tiles
        monkeypatch.setattr(dispatch, "BYTE_DOT", True)
        byte_dot = run_matmul(w, x)
        monkeypatch.setattr(dispatch, "BYTE_DOT", False)
        np.testing.assert_array_equal(byte_dot, run_matmul(w, x))


@BYTE_DOT_ONLY
@pytest.mark.parametrize("qtype", [QType.IQ4_NL, QType.IQ4_XS], ids=lambda q: q.name)
def test_iq4_portable_path(qtype: QType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the CPU has VNNI the IQ4 kernels decode the levels with pshufb; the portable kernels (a
    table lookup per lane, int32 sums) must give the same exact product on the other CPUs."""
    rows, cols = 70, 512
    data = random_blocks(qtype, rows, cols)
    monkeypatch.setattr(dispatch, "BYTE_DOT", False)
    for n_tok in (1, 13):
        x = RNG.standard_normal((n_tok, cols)).astype(np.float32)
        weights = quant.dequantize(data, qtype, (rows, cols))
        check(qtype, quant.pack_weight(data, qtype, (rows, cols)), weights, x)


@BYTE_DOT_ONLY
def test_q8_0_tiles_agree_to_the_bit() -> None:
    """Q8_0's tiles of 4 and 8 tokens sum on vpdpbusd (weights + 128, then 128 x sum(x) off), those of
    1 and 2 on vpdpwssd: each token of a 23-token batch (tiles 8, 8, 4, 2, 1) must come out bit for bit
    as it does alone, with quants at -128 and 127 and activations at +-127."""
    rows, cols = 70, 512
    extremes = np.zeros((rows, cols // quant.QK, 34), np.uint8)
    extremes[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    extremes[..., 2:] = RNG.choice(np.array([0x80, 0x7F], np.uint8), size=(rows, cols // quant.QK, 32))
    for data in (random_blocks(QType.Q8_0, rows, cols), extremes):
        w = quant.pack_weight(data, QType.Q8_0, (rows, cols))
        weights = quant.dequantize(data, QType.Q8_0, (rows, cols))
        x = RNG.standard_normal((23, cols)).astype(np.float32)
        x[:3] = np.sign(x[:3])
        batched = run_matmul(w, x)
        alone = np.concatenate([run_matmul(w, x[t : t + 1]) for t in range(len(x))])
        np.testing.assert_array_equal(batched, alone)
        assert rel_max(batched, exact_product(QType.Q8_0, w, weights, x)) < 1e-4


def q8_k_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's quantize_row_q8_K in numpy (float32 throughout): per 256 values the first of the
    largest magnitude v, iscale -127 / v, q = min(127, round-half-even(iscale x)), d = 1 / iscale;
    laid out per 32-block as the kernels read it (d repeated, d x the block's integer sum)."""
    n_tok, k = x.shape
    xq, xd, xs = (
        np.zeros((n_tok, k), np.int16),
        np.zeros((n_tok, k // 32), np.float32),
        np.zeros_like(x[:, ::32]),
    )
    for t in range(n_tok):
        for sb in range(k // 256):
            v = x[t, sb * 256 : (sb + 1) * 256]
            vmax = v[np.argmax(np.abs(v))]
            if vmax == 0:
                continue
            iscale = np.float32(-127.0) / vmax
            q = np.minimum(np.rint(iscale * v), np.float32(127.0)).astype(np.int16)
            xq[t, sb * 256 : (sb + 1) * 256] = q
            xd[t, sb * 8 : (sb + 1) * 8] = np.float32(1.0) / iscale
            xs[t, sb * 8 : (sb + 1) * 8] = xd[t, sb * 8] * q.reshape(8, 32).sum(axis=1).astype(np.float32)
    return xq, xd, xs


def test_q8_k_activations_are_llama_cpp_s() -> None:
    """Bitwise, with ties of magnitude (the first wins, whatever its sign), zero and -0.0 super-blocks."""
    x = (RNG.standard_normal((4, 8960)) * RNG.uniform(0.01, 100, (4, 1))).astype(np.float32)
    x[0, 7], x[0, 5] = 1e3, -1e3  # a tie: the first (negative) sets the sign of the scale
    x[1, 300], x[1, 290] = -2e3, 2e3
    x[2, :256] = 0.0
    x[3, 256:512] = -0.0
    for got, want in zip(mm.quantize_activations(x, mm.ACT_Q8_K), q8_k_reference(x), strict=True):
        np.testing.assert_array_equal(got, want)
