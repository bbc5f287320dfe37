"""The Gated DeltaNet kernels (engine/cpu/delta_net.py) against plain numpy references of llama.cpp's
definitions (ggml_ssm_conv + silu, softplus/sigmoid, build_gdn_l2_norm, ggml_gated_delta_net, the gated
RMS norm), and their independence of the batch: two sequences at different positions in one call give
each one's outputs and states bit for bit as alone."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cpu import delta_net, ops

pytestmark = pytest.mark.every_level  # kernels against numpy, on each level (tests/conftest.py)

RNG = np.random.default_rng(7)


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def conv_reference(x: np.ndarray, seq_ids: np.ndarray, weight: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """silu(causal depthwise conv) token by token; weight [C, K] as the file stores it; tail updated."""
    out = np.empty_like(x, dtype=np.float64)
    for t, s in enumerate(seq_ids):
        window = np.concatenate([tail[s], x[t : t + 1]]).astype(np.float64)  # [K, C]
        acc = (window * weight.T.astype(np.float64)).sum(axis=0)
        out[t] = acc / (1.0 + np.exp(-acc))
        tail[s] = window[1:]
    return out


def delta_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    seq_ids: np.ndarray,
    k_head: np.ndarray,
    state: np.ndarray,
) -> np.ndarray:
    """The delta rule in float64; state [n_seq, n_v, d_k, d_v], the math's S."""
    d = v.shape[2]
    out = np.empty(v.shape)
    for t, s in enumerate(seq_ids):
        for h in range(v.shape[1]):
            kh = k_head[h]
            S = state[s, h].astype(np.float64) * np.exp(np.float64(g[t, h]))
            kt, qt = k[t, kh].astype(np.float64), q[t, kh].astype(np.float64)
            delta = (v[t, h] - kt @ S) * beta[t, h]
            S = S + np.outer(kt, delta)
            out[t, h] = (qt @ S) / np.sqrt(d)
            state[s, h] = S
    return out


def unit_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("n_ch", [96, delta_net.CONV_CHUNK * 2 + 40])
def test_conv1d_silu_against_numpy_and_moves_the_tail_on(n_ch: int) -> None:
    n_seq, k = 3, 4
    x, weight = rand(7, n_ch), rand(n_ch, k, scale=0.5)
    seq_ids = np.array([2, 2, 2, 0, 1, 1, 1], np.int32)
    tail = rand(n_seq, k - 1, n_ch)
    want_tail = tail.copy()
    want = conv_reference(x, seq_ids, weight, want_tail)
    out = np.empty_like(x)
    delta_net.conv1d_silu(x, seq_ids, np.ascontiguousarray(weight.T), tail, out)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(tail, want_tail.astype(np.float32))


def test_conv1d_silu_keeps_the_tail_across_short_runs() -> None:
    """Runs shorter than the tail (one token, two) and a sequence that comes back later in the batch: the
    outputs and tails of feeding the tokens one at a time."""
    n_ch, k = 64, 4
    x, weight_t = rand(8, n_ch), rand(k, n_ch, scale=0.5)
    seq_ids = np.array([1, 0, 0, 2, 2, 2, 2, 1], np.int32)
    tail = rand(3, k - 1, n_ch)
    one_by_one, alone_tail = np.empty_like(x), tail.copy()
    for t in range(8):
        delta_net.conv1d_silu(x[t : t + 1], seq_ids[t : t + 1], weight_t, alone_tail, one_by_one[t : t + 1])
    out = np.empty_like(x)
    delta_net.conv1d_silu(x, seq_ids, weight_t, tail, out)
    np.testing.assert_array_equal(out, one_by_one)
    np.testing.assert_array_equal(tail, alone_tail)


def test_decay_and_beta_are_ggmls_softplus_and_sigmoid() -> None:
    alpha, b = rand(5, 6, scale=8.0), rand(5, 6, scale=3.0)
    alpha[0, 0] = 25.0  # past the linear threshold: softplus(x) = x
    dt_bias, a = rand(6), -np.exp(rand(6)).astype(np.float32)
    g, beta = np.empty_like(alpha), np.empty_like(alpha)
    delta_net.decay_and_beta(alpha, b, dt_bias, a, g, beta)
    x = alpha + dt_bias
    with np.errstate(over="ignore"):  # ggml's float32 steps: 1 + expf(x) rounds away a tiny expf(x)
        softplus = np.where(x > 20, x, np.log(np.float32(1) + np.exp(x)))
    np.testing.assert_allclose(g, softplus * a, rtol=2e-6)
    assert g[0, 0] == np.float32(alpha[0, 0] + dt_bias[0]) * a[0]
    np.testing.assert_allclose(beta, 1 / (1 + np.exp(-b.astype(np.float64))), rtol=2e-6)


def test_sigmoid_mul() -> None:
    x, gate = rand(4, 40), rand(4, 40, scale=4.0)
    want = x * (1 / (1 + np.exp(-gate.astype(np.float64))))
    delta_net.sigmoid_mul(x, gate)
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-7)


def test_l2_norm_is_rmsnorm_with_llama_cpps_eps() -> None:
    """build_gdn_l2_norm: rms_norm(x, eps / n) scaled by 1/sqrtf(n), i.e. x / sqrt(sum x^2 + eps)."""
    x, eps = rand(9, 64), 1e-6
    x[0] = 0.0  # an all-zero head stays zero (eps keeps the division finite)
    out = np.empty_like(x)
    ops.rmsnorm(x, delta_net.l2_norm_weight(64), delta_net.l2_norm_eps(eps, 64), out)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out, x64 / np.sqrt((x64**2).sum(1, keepdims=True) + eps), rtol=2e-6)
    assert not out[0].any()


def test_gated_rms_norm_is_rmsnorm_times_silu_of_z() -> None:
    """The linear-attention output's norm: rms_norm(o) * w * silu(z) (llama.cpp's build_norm_gated)."""
    o, z, w = rand(6, 32), rand(6, 32, scale=2.0), rand(32)
    o64, z64 = o.astype(np.float64), z.astype(np.float64)
    want = o64 / np.sqrt((o64**2).mean(1, keepdims=True) + 1e-6) * w * (z64 / (1 + np.exp(-z64)))
    normed = np.empty_like(o)
    ops.rmsnorm(o, w, 1e-6, normed)
    ops.silu_mul(z, normed, z)
    np.testing.assert_allclose(z, want, rtol=1e-5, atol=1e-6)


def run_delta(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    seq_ids: np.ndarray,
    k_head: np.ndarray,
    state: np.ndarray,
) -> np.ndarray:
    out = np.empty(v.shape, np.float32)
    delta_net.gated_delta_rule(q, k, v, g, beta, seq_ids, k_head, state, out)
    return out


def delta_inputs(n_tok: int, n_k: int, n_v: int, d: int) -> tuple[np.ndarray, ...]:
    q, k = unit_rows(rand(n_tok, n_k, d)), unit_rows(rand(n_tok, n_k, d))
    v = rand(n_tok, n_v, d)
    g = -np.abs(rand(n_tok, n_v, scale=0.5))
    beta = (1 / (1 + np.exp(-rand(n_tok, n_v)))).astype(np.float32)
    return q, k, v, g, beta


@pytest.mark.parametrize(
    ("n_k", "n_v", "d", "tiled"), [(2, 4, 64, True), (2, 4, 40, False), (3, 3, 32, True)]
)
def test_gated_delta_rule_against_numpy(n_k: int, n_v: int, d: int, tiled: bool) -> None:
    """Repeated key heads tiled (Qwen3.5) or grouped (Qwen3-Next); a head dim off the lane width."""
    q, k, v, g, beta = delta_inputs(9, n_k, n_v, d)
    seq_ids = np.array([1] * 5 + [0] * 4, np.int32)
    k_head = np.arange(n_v) % n_k if tiled else np.arange(n_v) // (n_v // n_k)
    state = rand(2, n_v, d, d, scale=0.3)
    want_state = state.copy()
    want = delta_reference(q, k, v, g, beta, seq_ids, k_head, want_state)
    got = run_delta(q, k, v, g, beta, seq_ids, k_head.astype(np.int64), state)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-5)


def test_kernels_do_not_depend_on_the_batch() -> None:
    """Sequence 0 at its start and sequence 1 deep into its state, in one call and each alone: the
    same outputs and states, bit for bit."""
    n_k, n_v, d, n_ch = 2, 4, 64, 300
    q, k, v, g, beta = delta_inputs(11, n_k, n_v, d)
    x, weight_t = rand(11, n_ch), rand(4, n_ch, scale=0.5)
    seq_ids = np.array([0] * 6 + [1] * 5, np.int32)
    k_head = np.arange(n_v, dtype=np.int64) % n_k
    tail = np.zeros((2, 3, n_ch), np.float32)
    tail[1] = rand(3, n_ch)
    state = np.zeros((2, n_v, d, d), np.float32)
    state[1] = rand(n_v, d, d, scale=0.3)
    both_tail, both_state = tail.copy(), state.copy()
    conv = np.empty_like(x)
    delta_net.conv1d_silu(x, seq_ids, weight_t, both_tail, conv)
    both = run_delta(q, k, v, g, beta, seq_ids, k_head, both_state)
    for part in (slice(0, 6), slice(6, 11)):
        alone_conv = np.empty_like(x[part])
        delta_net.conv1d_silu(x[part], seq_ids[part], weight_t, tail, alone_conv)
        alone = run_delta(q[part], k[part], v[part], g[part], beta[part], seq_ids[part], k_head, state)
        np.testing.assert_array_equal(alone_conv, conv[part])
        np.testing.assert_array_equal(alone, both[part])
    np.testing.assert_array_equal(tail, both_tail)
    np.testing.assert_array_equal(state, both_state)
