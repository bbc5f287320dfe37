"""Each CPU op kernel against a plain numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import ops

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_rmsnorm() -> None:
    x, w = rand(5, 64), rand(64)
    out = np.empty_like(x)
    ops.rmsnorm(x, w, 1e-5, out)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def rope_reference(x: np.ndarray, positions: np.ndarray, base: float, neox: bool) -> np.ndarray:
    dim = x.shape[2]
    half = dim // 2
    freqs = base ** (-np.arange(0, dim, 2) / dim)
    angles = positions[:, None, None] * freqs[None, None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    if neox:
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


@pytest.mark.parametrize("neox", [False, True])
def test_rope(neox: bool) -> None:
    x = rand(6, 3, 64)
    positions = np.array([0, 1, 2, 7, 100, 3000], dtype=np.int32)
    ref = rope_reference(x.astype(np.float64), positions, 10000.0, neox)
    ops.rope(x, positions, 10000.0, neox)
    np.testing.assert_allclose(x, ref, rtol=1e-3, atol=2e-3)


def attention_reference(q, k_cache, v_cache, seq_ids, positions, window, scale):  # type: ignore[no-untyped-def]
    n_tok, n_heads, _ = q.shape
    group = n_heads // k_cache.shape[1]
    out = np.zeros_like(q)
    for t in range(n_tok):
        end = positions[t] + 1
        start = max(0, end - window) if window else 0
        for h in range(n_heads):
            keys = k_cache[seq_ids[t], h // group, start:end]
            vals = v_cache[seq_ids[t], h // group, start:end]
            s = keys @ q[t, h] * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vals
    return out


@pytest.mark.parametrize("window", [0, 4])
def test_attention_gqa_multi_sequence(window: int) -> None:
    n_seq, n_kv, n_ctx, dim, n_heads = 3, 2, 16, 32, 6
    k_cache, v_cache = rand(n_seq, n_kv, n_ctx, dim), rand(n_seq, n_kv, n_ctx, dim)
    seq_ids = np.array([0, 0, 0, 2, 1, 1], dtype=np.int32)
    positions = np.array([0, 1, 2, 9, 5, 15], dtype=np.int32)
    q = rand(len(seq_ids), n_heads, dim)
    out = np.empty_like(q)
    ops.attention(q, k_cache, v_cache, seq_ids, positions, window, 0.125, out)
    ref = attention_reference(q, k_cache, v_cache, seq_ids, positions, window, 0.125)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_store_kv() -> None:
    k, v = rand(3, 2, 8), rand(3, 2, 8)
    k_cache, v_cache = np.zeros((2, 2, 10, 8), np.float32), np.zeros((2, 2, 10, 8), np.float32)
    seq_ids, positions = np.array([1, 1, 0], np.int32), np.array([4, 5, 0], np.int32)
    ops.store_kv(k, v, seq_ids, positions, k_cache, v_cache)
    for t in range(3):
        np.testing.assert_array_equal(k_cache[seq_ids[t], :, positions[t]], k[t])
        np.testing.assert_array_equal(v_cache[seq_ids[t], :, positions[t]], v[t])


def test_activations() -> None:
    gate, up = rand(4, 40), rand(4, 40)
    out = np.empty_like(gate)
    ops.silu_mul(gate, up, out)
    np.testing.assert_allclose(out, gate / (1 + np.exp(-gate)) * up, rtol=1e-5, atol=1e-6)
    ops.gelu_mul(gate, up, out)
    c = np.sqrt(2 / np.pi)
    ref = 0.5 * gate * (1 + np.tanh(c * (gate + 0.044715 * gate**3))) * up
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_residual_add_and_scale() -> None:
    x, y = rand(3, 7), rand(3, 7)
    expected = (x + y) * 2.5
    ops.add_inplace(x, y)
    ops.scale_inplace(x, 2.5)
    np.testing.assert_allclose(x, expected, rtol=1e-6)
