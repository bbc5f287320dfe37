"""Adaptive-p (engine/sampling/adaptive_p.py) at the numpy level: the transform, the moving average, the
fields; llama.cpp's own picks are compared in tests/test_sampler_goldens.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.sampling import Sampler, SamplingParams, parse_samplers
from engine.sampling.adaptive_p import AdaptiveP, transform
from engine.sampling.arrays import softmax32
from engine.sampling.default_chain import takes_fast_path
from engine.sampling.rng import LlamaRng

F32 = np.float32


def reference(p: float, adapted: float) -> float:
    d = abs(p - adapted) / 0.3
    return 5.0 - 10.0 * d * d / (1.0 + d)


def test_the_transform_peaks_at_the_target_and_falls_quadratically_then_linearly() -> None:
    probs = np.array([0.4, 0.1, 0.7, 0.0, 1.0, 0.25], dtype=F32)
    logits = np.array([1.0, -1.0, 2.0, -np.inf, 3.0, 0.5], dtype=F32)
    out = transform(probs, logits, F32(0.4))
    assert out.dtype == np.float32
    assert out[0] == F32(5.0)  # on the target: the peak
    assert out[2] == pytest.approx(0.0, abs=1e-6)  # d = 1: 5 - 10 / 2
    assert out[3] == -np.inf  # a masked candidate stays masked
    for i in (1, 4, 5):
        assert out[i] == pytest.approx(reference(float(probs[i]), 0.4), rel=1e-6, abs=1e-6)
    # symmetric around the target, and far-off candidates fall about 10 per width (linear tail)
    assert transform(np.array([0.3, 0.5], dtype=F32), np.zeros(2, F32), F32(0.4)).tolist() == pytest.approx(
        [reference(0.3, 0.4)] * 2, rel=1e-6
    )
    # llama.cpp's float32 order of operations: ((10 * d) * d) / (1 + d), d = |(p - t) * (1 / 0.3f)|
    d = np.abs((probs - F32(0.4)) * (F32(1) / F32(0.3)))
    np.testing.assert_array_equal(
        out[[0, 1, 2, 4, 5]], (F32(5) - F32(10) * d * d / (F32(1) + d))[[0, 1, 2, 4, 5]]
    )


def test_a_zero_probability_candidate_with_a_finite_logit_is_still_transformed() -> None:
    logits = np.array([0.0, -200.0, -np.inf], dtype=F32)
    probs = softmax32(logits)
    assert probs[1] == 0
    out = transform(probs, logits, F32(0.05))
    assert out[1] == pytest.approx(reference(0.0, 0.05), rel=1e-6)
    assert out[2] == -np.inf


def test_the_average_starts_at_the_target_and_moves_by_the_accepted_draws_original_probability() -> None:
    a = AdaptiveP(0.3, 0.9)
    assert a.weighted_sum == F32(0.3) / (F32(1) - F32(0.9))
    assert a.total_weight == F32(1) / (F32(1) - F32(0.9))
    assert a.adapted_target() == pytest.approx(0.3, rel=1e-6)  # 2 * 0.3 - 0.3
    logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=F32)
    original = softmax32(logits)
    a.distribution(None, logits)
    a.drawn(0)
    a.accept(1)  # not the drawn token (a forced one): nothing learned, the draw forgotten
    assert a.weighted_sum == F32(0.3) / (F32(1) - F32(0.9))
    a.accept(0)
    assert a.weighted_sum == F32(0.3) / (F32(1) - F32(0.9))
    a.distribution(None, logits)
    a.drawn(0)
    a.accept(0)
    ws = F32(original[0] + F32(0.9) * (F32(0.3) / (F32(1) - F32(0.9))))
    tw = F32(F32(1) + F32(0.9) * (F32(1) / (F32(1) - F32(0.9))))
    assert (a.weighted_sum, a.total_weight) == (ws, tw)
    # a likely draw (p = 0.64 > target) lowers the next target
    assert a.adapted_target() == min(max(F32(2) * F32(0.3) - ws / tw, F32(0)), F32(1))
    assert a.adapted_target() < F32(0.3)


def test_the_original_probability_is_looked_up_by_token_among_truncated_candidates() -> None:
    a = AdaptiveP(0.5, 0.0)
    ids = np.array([7, 3, 9])
    logits = np.array([1.0, 0.5, -0.5], dtype=F32)
    a.distribution(ids, logits)
    a.drawn(9)
    a.accept(9)
    assert a.weighted_sum == softmax32(logits)[2]  # decay 0: the last draw alone
    assert a.total_weight == 1


@pytest.mark.parametrize(("decay", "used"), [(1.5, F32(0.99)), (-0.2, F32(0)), (0.5, F32(0.5))])
def test_the_decay_is_clamped_to_0_to_0_99(decay: float, used: np.float32) -> None:
    assert AdaptiveP(0.5, decay).decay == used


def test_a_negative_target_draws_the_plain_softmax_with_discrete_distribution() -> None:
    rng = np.random.RandomState(3)
    logits = (rng.standard_normal(300) * 2).astype(F32)
    params = SamplingParams(samplers=parse_samplers(["adaptive_p"]), seed=5)
    sampler = Sampler(params, logits.size)
    check = LlamaRng(5)
    for _ in range(20):
        token = sampler.sample(logits)
        sampler.accept(token)
        assert sampler.last is not None
        np.testing.assert_array_equal(sampler.last.weights, softmax32(logits))
        assert sampler.last.logits is logits or np.array_equal(sampler.last.logits, logits)
        cumulative = np.cumsum(softmax32(logits).astype(np.float64) / softmax32(logits).sum(dtype=np.float64))
        cumulative[-1] = 1
        assert token == int(np.searchsorted(cumulative, check.uniform()))


def test_the_fast_and_general_paths_draw_alike() -> None:
    rng = np.random.RandomState(4)
    cycle = [(rng.standard_normal(1000) * 3).astype(F32) for _ in range(3)]
    fields = {"samplers": parse_samplers(["top_k", "min_p", "adaptive_p"]), "top_k": 50, "min_p": 0.01}
    fast = SamplingParams(**fields, adaptive_target=0.3, seed=9)
    general = SamplingParams(**fields, adaptive_target=0.3, seed=9, min_keep=1)  # min_keep: no fast path
    assert takes_fast_path(fast) and not takes_fast_path(general)
    a, b = Sampler(fast, 1000), Sampler(general, 1000)
    for step in range(60):
        ta, tb = a.sample(cycle[step % 3]), b.sample(cycle[step % 3])
        assert ta == tb, step
        a.accept(ta)
        b.accept(tb)
        assert a.last is not None and b.last is not None
        np.testing.assert_array_equal(a.last.logits, b.last.logits)
    assert a._adaptive is not None and b._adaptive is not None
    assert a._adaptive.weighted_sum == b._adaptive.weighted_sum


def test_the_post_sampling_view_is_the_transformed_distribution() -> None:
    logits = np.array([4.0, 3.0, 0.0, -3.0], dtype=F32)
    sampler = Sampler(SamplingParams(samplers=("adaptive_p",), adaptive_target=0.05, seed=1), 4)
    token = sampler.sample(logits)
    dist = sampler.last
    assert dist is not None
    probs = softmax32(logits)
    expected = softmax32(transform(probs, logits, F32(0.05)))
    assert [dist.prob(t) for t in range(4)] == pytest.approx(expected.tolist(), rel=1e-6)
    # a 5% target favours the unlikely candidates over the 72% one
    assert dist.top(1)[0][0] != 0
    assert 0 <= token < 4


def test_the_fields_and_the_names() -> None:
    assert parse_samplers(["adaptive_p", "Adaptive-P", "adaptivep"]) == ("adaptive_p",) * 3
    assert parse_samplers("ma") == ("min_p", "adaptive_p")
    p = SamplingParams(samplers=parse_samplers(["adaptive_p", "min_p"]), adaptive_target=0.4)
    assert p.adaptive_p and p.chain() == ("min_p",)
    assert (SamplingParams().adaptive_target, SamplingParams().adaptive_decay) == (-1.0, 0.9)
    assert not SamplingParams().adaptive_p
    assert not SamplingParams(samplers=("adaptive_p",), mirostat=2).adaptive_p  # mirostat's chain is fixed
    for field in ("adaptive_target", "adaptive_decay"):
        for bad in (math.nan, math.inf):
            with pytest.raises(ValueError, match=field):
                SamplingParams(**{field: bad})


def test_greedy_stays_greedy() -> None:
    logits = np.array([0.5, 2.0, 1.0], dtype=F32)
    params = SamplingParams(samplers=parse_samplers("kta"), temperature=0.0, adaptive_target=0.1)
    sampler = Sampler(params, 3)
    assert all(sampler.sample(logits) == 1 for _ in range(5))
