"""The encoders' CPU kernels against numpy: LayerNorm, GELU and the encoder attention (spans of inputs in
one pass, causal or not, ALiBi, symmetric windows, grouped heads), and the attention's independence of
what else shares the pass."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu.encoder_attention import encoder_attention
from engine.cpu.ops import GELU_TABLE, gelu, layernorm

pytestmark = pytest.mark.every_level
RNG = np.random.default_rng(7)


def test_layernorm_matches_numpy() -> None:
    for rows in (3, 70):  # serial and parallel
        x = (RNG.standard_normal((rows, 48)) * 3 + 1).astype(np.float32)
        w, b = RNG.standard_normal(48).astype(np.float32), RNG.standard_normal(48).astype(np.float32)
        out = np.empty_like(x)
        layernorm(x, w, b, 1e-12, out)
        x64 = x.astype(np.float64)
        want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-12) * w + b
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        layernorm(x, None, None, 1e-5, x)  # in place, no weight or bias
        assert abs(x.mean(1)).max() < 1e-5 and abs(x.std(1) - 1).max() < 1e-3


def test_gelu_is_ggmls_table() -> None:
    x = np.linspace(-12, 12, 97, dtype=np.float32).reshape(1, -1)
    out = np.empty_like(x)
    gelu(x, out)
    half = x.astype(np.float16).view(np.uint16)
    want = np.where(x <= -10, 0, np.where(x >= 10, x, GELU_TABLE[half]))
    np.testing.assert_array_equal(out, want)


def reference(q, k, v, spans, positions, causal, window, slopes, scale):  # type: ignore[no-untyped-def]
    n_tok, n_heads, _ = q.shape
    group = n_heads // k.shape[1]
    out = np.zeros(q.shape)
    for t in range(n_tok):
        lo, hi = spans[t]
        rows = np.arange(lo, hi)
        dist = np.abs(positions[rows] - positions[t])
        seen = np.ones(len(rows), bool)
        if causal:
            seen &= positions[rows] <= positions[t]
        if window:
            seen &= dist <= window // 2
        for h in range(n_heads):
            s = k[rows, h // group].astype(np.float64) @ q[t, h] * scale - slopes[h] * dist
            s = np.where(seen, s, -np.inf)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[rows, h // group]
    return out


def packed(lengths: list[int], n_heads: int = 4, n_kv: int = 2, dim: int = 24):  # type: ignore[no-untyped-def]
    n = sum(lengths)
    q = RNG.standard_normal((n, n_heads, dim)).astype(np.float32)
    k = RNG.standard_normal((n, n_kv, dim)).astype(np.float32)
    v = RNG.standard_normal((n, n_kv, dim)).astype(np.float32)
    spans = np.concatenate(
        [[[s, s + m]] * m for s, m in zip(np.cumsum([0, *lengths[:-1]]), lengths, strict=True)]
    )
    positions = np.concatenate([np.arange(m) for m in lengths]).astype(np.int32)
    return q, k, v, spans.astype(np.int64), positions


@pytest.mark.parametrize(
    ("causal", "window", "alibi"), [(False, 0, False), (True, 0, False), (False, 6, False), (False, 0, True)]
)
def test_encoder_attention_matches_numpy(causal: bool, window: int, alibi: bool) -> None:
    for lengths in ([5], [3, 17, 1, 40], [200, 90]):  # one input, several, past the serial threshold
        q, k, v, spans, positions = packed(lengths)
        slopes = (2.0 ** -np.arange(1, 5)).astype(np.float32) if alibi else np.zeros(4, np.float32)
        out = np.empty_like(q)
        encoder_attention(q, k, v, spans, positions, causal, window, slopes, 0.2, out)
        want = reference(q, k, v, spans, positions, causal, window, slopes, 0.2)
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_encoder_attention_does_not_depend_on_the_packing() -> None:
    q, k, v, spans, positions = packed([7, 33, 12, 300])
    slopes = np.zeros(4, np.float32)
    together = np.empty_like(q)
    encoder_attention(q, k, v, spans, positions, False, 0, slopes, 0.3, together)
    start = 0
    for n in (7, 33, 12, 300):
        rows = slice(start, start + n)
        alone = np.empty_like(q[rows])
        local = spans[rows] - start
        encoder_attention(q[rows], k[rows], v[rows], local, positions[rows], False, 0, slopes, 0.3, alone)
        assert np.array_equal(alone, together[rows])  # bitwise
        start += n
