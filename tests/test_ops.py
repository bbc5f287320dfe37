"""Each CPU op kernel against a plain numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from engine.cpu import ops
from engine.cpu.f16 import float_to_half, half_to_float

pytestmark = pytest.mark.every_level  # kernels against numpy, on each level (tests/conftest.py)

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("rows", [5, ops.PARALLEL_NORM_ROWS])
def test_rmsnorm_is_llama_cpps_arithmetic(rows: int) -> None:
    """Bit for bit as ggml: float32 squares summed in float64 in order, the mean in float32, then
    (x * (1 / sqrtf(mean + eps))) * weight."""
    x, w = rand(rows, 576) * 3, rand(576)
    out = np.empty_like(x)
    ops.rmsnorm(x, w, 1e-5, out)
    total = np.cumsum((x * x).astype(np.float64), axis=1)[:, -1:]  # cumsum adds one after the other
    scale = np.float32(1) / np.sqrt((total / 576).astype(np.float32) + np.float32(1e-5))
    np.testing.assert_array_equal(out, x * scale * w)
    exact = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, exact, rtol=1e-5, atol=1e-5)


def rope_reference(
    x: np.ndarray, positions: np.ndarray, base: float, neox: bool, pair_scale: np.ndarray, mscale: float
) -> np.ndarray:
    """RoPE over the first n_rot = 2 * len(pair_scale) dimensions; the rest pass through."""
    half = len(pair_scale)
    n_rot = 2 * half
    freqs = base ** (-np.arange(0, n_rot, 2) / n_rot) * pair_scale
    angles = positions[:, None, None] * freqs[None, None, :]
    cos, sin = np.cos(angles) * mscale, np.sin(angles) * mscale
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :n_rot] = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        return out
    a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = a * cos - b * sin
    out[..., 1:n_rot:2] = a * sin + b * cos
    return out


@pytest.mark.parametrize("neox", [False, True])
def test_rope(neox: bool) -> None:
    x = rand(6, 3, 64)
    positions = np.array([0, 1, 2, 7, 100, 3000], dtype=np.int32)
    ones = np.ones(32, dtype=np.float32)
    ref = rope_reference(x.astype(np.float64), positions, 10000.0, neox, ones, 1.0)
    ops.rope(x, positions, 10000.0, neox, ones, 1.0)
    np.testing.assert_allclose(x, ref, rtol=1e-3, atol=2e-3)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_scaled_and_partial(neox: bool) -> None:
    """Per-pair angle scales (llama3 / YaRN / LongRoPE), an attention factor, and partial rotary: only
    the first 48 of 64 dimensions turn."""
    x = rand(5, 2, 64)
    positions = np.array([0, 3, 17, 250, 4000], dtype=np.int32)
    pair_scale = RNG.uniform(0.1, 1.0, 24).astype(np.float32)
    ref = rope_reference(x.astype(np.float64), positions, 500000.0, neox, pair_scale.astype(np.float64), 1.2)
    ops.rope(x, positions, 500000.0, neox, pair_scale, 1.2)
    np.testing.assert_allclose(x, ref, rtol=1e-3, atol=2e-3)
    np.testing.assert_array_equal(x[..., 48:], ref[..., 48:].astype(np.float32))


def attention_reference(q, k_cache, v_cache, seq_ids, positions, window, scale, limits=None):  # type: ignore[no-untyped-def]
    """llama.cpp's mask: cells up to the token's limit (its position, or a non-causal chunk's end), the
    window counted back from its position."""
    n_tok, n_heads, _ = q.shape
    group = n_heads // k_cache.shape[1]
    out = np.zeros_like(q)
    for t in range(n_tok):
        end = (positions if limits is None else limits)[t] + 1
        start = max(0, positions[t] + 1 - window) if window else 0
        for h in range(n_heads):
            keys = k_cache[seq_ids[t], h // group, start:end]
            vals = v_cache[seq_ids[t], h // group, start:end]
            s = keys @ q[t, h] * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vals
    return out


@pytest.mark.parametrize("window", [0, 4, 300])
def test_attention_gqa_multi_sequence(window: int) -> None:
    # n_ctx beyond ops.KEY_CHUNK: long contexts are split into chunks and merged.
    n_seq, n_kv, n_ctx, dim, n_heads = 3, 2, 700, 32, 6
    k_cache = rand(n_seq, n_kv, n_ctx, dim).astype(np.float16)
    v_cache = rand(n_seq, n_kv, n_ctx, dim).astype(np.float16)
    seq_ids = np.array([0, 0, 0, 2, 1, 1, 1], dtype=np.int32)
    positions = np.array([0, 1, 2, 9, 5, 255, 699], dtype=np.int32)
    q = rand(len(seq_ids), n_heads, dim)
    out = np.empty_like(q)
    ops.attention(q, k_cache, v_cache, seq_ids, positions, window, 0.125, out)
    ref = attention_reference(
        q, k_cache.astype(np.float32), v_cache.astype(np.float32), seq_ids, positions, window, 0.125
    )
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_attention_result_does_not_depend_on_the_batch() -> None:
    """A token's output is bitwise the same alone or in a batch (decode == prefill, batched == solo)."""
    k_cache = rand(2, 1, 600, 16).astype(np.float16)
    v_cache = rand(2, 1, 600, 16).astype(np.float16)
    seq_ids = np.array([0, 0, 1, 1], dtype=np.int32)
    positions = np.array([3, 599, 100, 520], dtype=np.int32)
    q = rand(4, 2, 16)
    together = np.empty_like(q)
    ops.attention(q, k_cache, v_cache, seq_ids, positions, 0, 0.25, together)
    for t in range(4):
        alone = np.empty_like(q[t : t + 1])
        ops.attention(
            q[t : t + 1], k_cache, v_cache, seq_ids[t : t + 1], positions[t : t + 1], 0, 0.25, alone
        )
        np.testing.assert_array_equal(alone[0], together[t])


@pytest.mark.parametrize("window", [0, 300])
def test_attention_of_a_non_causal_chunk(window: int) -> None:
    """A media chunk decoded non-causally (Gemma 3's image, positions 290..299 here): each of its tokens
    sees the whole chunk, its window counted from its own position; outputs are bitwise the same alone
    or batched with another sequence's causal tokens."""
    k_cache = rand(2, 2, 600, 32).astype(np.float16)
    v_cache = rand(2, 2, 600, 32).astype(np.float16)
    seq_ids = np.array([1, 1] + [0] * 10, dtype=np.int32)
    positions = np.array([40, 41, *range(290, 300)], dtype=np.int32)
    limits = np.array([40, 41] + [299] * 10, dtype=np.int32)
    q = rand(len(seq_ids), 4, 32)
    out = np.empty_like(q)
    ops.attention(q, k_cache, v_cache, seq_ids, positions, window, 0.2, out, limits)
    ref = attention_reference(
        q, k_cache.astype(np.float32), v_cache.astype(np.float32), seq_ids, positions, window, 0.2, limits
    )
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    chunk = np.empty_like(q[2:])
    ops.attention(q[2:], k_cache, v_cache, seq_ids[2:], positions[2:], window, 0.2, chunk, limits[2:])
    np.testing.assert_array_equal(chunk, out[2:])


def test_store_kv_rounds_to_float16() -> None:
    k, v = rand(3, 2, 8), rand(3, 2, 8)
    k_cache, v_cache = np.zeros((2, 2, 10, 8), np.float16), np.zeros((2, 2, 10, 8), np.float16)
    seq_ids, positions = np.array([1, 1, 0], np.int32), np.array([4, 5, 0], np.int32)
    ops.store_kv(k, v, seq_ids, positions, k_cache, v_cache)
    for t in range(3):
        np.testing.assert_array_equal(k_cache[seq_ids[t], :, positions[t]], k[t].astype(np.float16))
        np.testing.assert_array_equal(v_cache[seq_ids[t], :, positions[t]], v[t].astype(np.float16))


@njit
def _halves_to_floats(bits: np.ndarray) -> np.ndarray:
    out = np.empty(bits.size, np.float32)
    for i in range(bits.size):
        out[i] = half_to_float(bits[i])
    return out


@njit
def _floats_to_halves(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.size, np.uint16)
    for i in range(x.size):
        out[i] = float_to_half(x[i])
    return out


def test_half_conversions_match_numpy() -> None:
    """Every finite half reads back exactly; float32 -> half rounds as numpy does, ties included."""
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    halves = bits.view(np.float16)
    finite = np.isfinite(halves)
    np.testing.assert_array_equal(_halves_to_floats(bits)[finite], halves[finite].astype(np.float32))
    values = np.sort(halves[finite].astype(np.float32))
    ties = values[:-1] + np.diff(values) / 2
    x = np.concatenate([values, ties, rand(10000) * 1e5, rand(10000) * 1e-6]).astype(np.float32)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(_floats_to_halves(x), expected)


def test_activations() -> None:
    gate, up = rand(4, 40), rand(4, 40)
    out = np.empty_like(gate)
    ops.silu_mul(gate, up, out)
    np.testing.assert_allclose(out, gate / (1 + np.exp(-gate)) * up, rtol=1e-5, atol=1e-6)


def gelu_reference(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation in float64."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def test_gelu_is_ggmls_float16_table() -> None:
    """ggml's CPU GELU (GGML_GELU_FP16): the input rounded to float16, GELU of that rounded to float16;
    0 at or below -10, the input itself at or above 10."""
    gate = np.concatenate([rand(4, 40) * 4, [[-10.5, -10.0, 10.0, 12.0] * 10]]).astype(np.float32)
    up = rand(5, 40)
    out = np.empty_like(gate)
    ops.gelu_mul(gate, up, out)
    h = gate.astype(np.float16).astype(np.float32)  # ggml evaluates the formula in float32 (tanhf)
    c, a, half, one = (np.float32(v) for v in (np.sqrt(2 / np.pi), 0.044715, 0.5, 1))
    table = (half * h * (one + np.tanh(c * h * (one + a * h * h)))).astype(np.float16).astype(np.float32)
    want = np.where(gate <= -10, 0, np.where(gate >= 10, gate, table)).astype(np.float32) * up
    np.testing.assert_array_equal(out, want)
    np.testing.assert_allclose(out, gelu_reference(gate) * up, rtol=2e-3, atol=2e-3)  # float16 steps


def test_residual_add_and_scale() -> None:
    x, y = rand(3, 7), rand(3, 7)
    expected = (x + y) * 2.5
    ops.add_inplace(x, y)
    ops.scale_inplace(x, 2.5)
    np.testing.assert_allclose(x, expected, rtol=1e-6)


def test_add_bias_broadcasts_over_rows() -> None:
    x, bias = rand(4, 9), rand(1, 9)[0]
    expected = x + bias[None, :]
    ops.add_bias_inplace(x, bias)
    np.testing.assert_array_equal(x, expected)
