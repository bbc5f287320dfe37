"""The sampler chain against llama.cpp's semantics, on synthetic logits (no model needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.sampling import Sampler, SamplingParams

GEMMA_VOCAB = 262_144


def _logits_from_probs(probs: list[float], n_vocab: int = 64) -> np.ndarray:
    """Logits whose softmax puts `probs` on the first ids and (almost) nothing elsewhere."""
    logits = np.full(n_vocab, -1e9, dtype=np.float32)
    logits[: len(probs)] = np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)
    return logits


def _draws(params: SamplingParams, logits: np.ndarray, n: int = 2000) -> set[int]:
    sampler = Sampler(params, logits.size)
    return {sampler.sample(logits) for _ in range(n)}


def _open(**overrides: float | int) -> SamplingParams:
    """No truncation, temperature 1: each test turns on only the stage it checks."""
    fields: dict = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 1234}
    fields.update(overrides)
    return SamplingParams(**fields)


def test_defaults_match_llama_server() -> None:
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repeat_penalty, p.repeat_last_n, p.presence_penalty, p.frequency_penalty) == (1.0, 64, 0.0, 0.0)


def test_greedy_picks_argmax_and_lowest_id_on_ties() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(1000).astype(np.float32)
    sampler = Sampler(SamplingParams(temperature=0.0), 1000)
    assert sampler.sample(logits) == int(np.argmax(logits))
    logits[17] = logits[900] = logits.max() + 1
    assert sampler.sample(logits) == 17


def test_top_k_1_equals_greedy() -> None:
    rng = np.random.default_rng(1)
    for seed in range(20):
        logits = rng.standard_normal(5000).astype(np.float32)
        sampler = Sampler(_open(top_k=1, temperature=1.5, seed=seed), 5000)
        assert sampler.sample(logits) == int(np.argmax(logits))


def test_top_k_keeps_exactly_k_best() -> None:
    logits = np.arange(100, dtype=np.float32) / 10  # best ids are the highest
    assert _draws(_open(top_k=3, temperature=5.0), logits) == {97, 98, 99}


def test_min_p_cuts_below_fraction_of_best() -> None:
    # p_i / p_max: 1, 0.5, 0.35, 0.25, 0.1 -> min_p 0.3 keeps the first three
    logits = _logits_from_probs([0.4, 0.2, 0.14, 0.1, 0.04])
    assert _draws(_open(min_p=0.3), logits) == {0, 1, 2}


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    logits = _logits_from_probs([0.5, 0.3, 0.15, 0.05])
    assert _draws(_open(top_p=0.75), logits) == {0, 1}
    assert _draws(_open(top_p=0.9), logits) == {0, 1, 2}
    assert _draws(_open(top_p=0.0), logits) == {0}  # the best token always survives


def test_top_p_on_full_gemma_vocab_without_top_k() -> None:
    # A flat distribution needs half the vocabulary to reach p=0.5, all of it tied: the lowest ids win.
    flat = np.zeros(GEMMA_VOCAB, dtype=np.float32)
    drawn = _draws(_open(top_p=0.5), flat, n=30)
    assert max(drawn) < GEMMA_VOCAB // 2
    assert len(drawn) > 25
    peaked = np.zeros(GEMMA_VOCAB, dtype=np.float32)
    peaked[[5, 70_000, 200_000]] = 20.0
    assert _draws(_open(top_p=0.9), peaked, n=300) == {5, 70_000, 200_000}
    # A smooth one puts the cut inside one value bucket among many.
    smooth = np.random.default_rng(2).standard_normal(GEMMA_VOCAB).astype(np.float32)
    kept = Sampler(_open(top_p=0.7), GEMMA_VOCAB).post_sampling_probs(smooth, GEMMA_VOCAB)
    assert {token for token, _ in kept} == _reference_kept(smooth, _open(top_p=0.7))


def test_stages_compose_top_k_then_top_p_then_min_p() -> None:
    logits = _logits_from_probs([0.3, 0.25, 0.2, 0.15, 0.1])
    # top_k 4 renormalises to 0.33, 0.28, 0.22, 0.17: top_p 0.8 then needs three tokens
    assert _draws(_open(top_k=4, top_p=0.8), logits) == {0, 1, 2}
    # min_p 0.7 after that keeps p >= 0.21 -> ids 0 and 1
    assert _draws(_open(top_k=4, top_p=0.8, min_p=0.7), logits) == {0, 1}


def test_temperature_sharpens_and_flattens() -> None:
    logits = _logits_from_probs([0.6, 0.4], n_vocab=2)
    cold = Sampler(_open(temperature=0.05), 2)
    assert all(cold.sample(logits) == 0 for _ in range(500))
    hot = Sampler(_open(temperature=100.0), 2)
    share = sum(hot.sample(logits) for _ in range(4000)) / 4000
    assert 0.45 < share < 0.55


def test_draw_frequencies_follow_probabilities() -> None:
    logits = _logits_from_probs([0.5, 0.3, 0.2], n_vocab=3)
    sampler = Sampler(_open(), 3)
    counts = np.bincount([sampler.sample(logits) for _ in range(20_000)], minlength=3) / 20_000
    assert np.allclose(counts, [0.5, 0.3, 0.2], atol=0.02)


def test_penalties_follow_llama_cpp_formula() -> None:
    params = _open(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    sampler = Sampler(params, 5)
    for token in (0, 1, 0, 3):
        sampler.accept(token)
    logits = np.array([2.0, -2.0, 1.0, 0.5, 0.0], dtype=np.float32)
    adjusted = sampler.adjust(logits)
    # positive logits are divided, negative (and zero) ones multiplied, then count*freq + presence
    expected = [2.0 / 2 - (2 * 0.5 + 0.25), -2.0 * 2 - 0.75, 1.0, 0.5 / 2 - 0.75, 0.0]
    assert np.allclose(adjusted, expected)
    assert logits[0] == 2.0  # the input is untouched


def test_penalty_window_is_last_n_tokens() -> None:
    sampler = Sampler(_open(repeat_penalty=2.0, repeat_last_n=2), 5)
    for token in (0, 1, 0, 3):
        sampler.accept(token)  # window: [0, 3]
    adjusted = sampler.adjust(np.full(5, 4.0, dtype=np.float32))
    assert adjusted.tolist() == [2.0, 4.0, 4.0, 2.0, 4.0]


def test_penalties_off_when_window_is_zero_or_neutral() -> None:
    logits = np.full(5, 4.0, dtype=np.float32)
    for params in (_open(repeat_penalty=2.0, repeat_last_n=0), _open()):
        sampler = Sampler(params, 5)
        sampler.accept(0)
        assert sampler.adjust(logits).tolist() == logits.tolist()


def test_repeat_penalty_steers_greedy_away() -> None:
    logits = np.array([3.0, 2.0, 0.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0), 3)
    assert sampler.sample(logits) == 0
    sampler.accept(0)
    assert sampler.sample(logits) == 1


def test_logit_bias_bans_and_boosts() -> None:
    logits = _logits_from_probs([0.7, 0.2, 0.1])
    banned = _open(logit_bias={0: -math.inf})
    assert 0 not in _draws(banned, logits)
    greedy_banned = SamplingParams(temperature=0.0, logit_bias={0: -math.inf})
    assert Sampler(greedy_banned, logits.size).sample(logits) == 1
    boosted = SamplingParams(temperature=0.0, logit_bias={2: 10.0, 10_000: 5.0})  # out of range: ignored
    assert Sampler(boosted, logits.size).sample(logits) == 2


def test_everything_banned_does_not_crash() -> None:
    logits = np.zeros(8, dtype=np.float32)
    params = _open(logit_bias={i: -math.inf for i in range(8)})
    assert Sampler(params, 8).sample(logits) == 0


def test_same_seed_same_sequence_different_seed_different() -> None:
    rng = np.random.default_rng(7)
    steps = [rng.standard_normal(4096).astype(np.float32) for _ in range(64)]

    def run(seed: int) -> list[int]:
        sampler = Sampler(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed), 4096)
        return [sampler.sample(logits) for logits in steps]

    assert run(42) == run(42)
    assert run(42) != run(43)


def test_random_seed_is_reported() -> None:
    seeds = {Sampler(SamplingParams(seed=-1), 8).seed for _ in range(4)}
    assert all(0 <= s < 2**32 for s in seeds)
    assert len(seeds) > 1
    assert Sampler(SamplingParams(seed=5), 8).seed == 5


def test_top_logprobs_are_log_softmax_of_raw_logits() -> None:
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(1000).astype(np.float32) * 4
    logits[10] = logits[20] = logits.max() + 1  # tie: lower id first
    before = logits.copy()
    sampler = Sampler(SamplingParams(logit_bias={10: -math.inf}, repeat_penalty=1.5), 1000)
    sampler.accept(20)
    top = sampler.top_logprobs(logits, 5)
    reference = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    assert [t for t, _ in top][:2] == [10, 20]
    assert [t for t, _ in top] == sorted(range(1000), key=lambda i: (-logits[i], i))[:5]
    for token, logprob in top:
        assert logprob == pytest.approx(reference[token], abs=1e-5)
    assert sampler.token_logprob(logits, 20) == pytest.approx(reference[20], abs=1e-5)
    assert sampler.top_logprobs(logits, 0) == []
    assert np.array_equal(logits, before)


def test_sample_leaves_logits_untouched() -> None:
    logits = np.random.default_rng(4).standard_normal(512).astype(np.float32)
    before = logits.copy()
    sampler = Sampler(SamplingParams(repeat_penalty=1.3, logit_bias={3: 2.0}), 512)
    sampler.accept(int(np.argmax(logits)))
    sampler.sample(logits)
    assert np.array_equal(logits, before)


def test_wrong_logits_shape_is_rejected() -> None:
    with pytest.raises(ValueError, match="shape"):
        Sampler(SamplingParams(), 10).sample(np.zeros(11, dtype=np.float32))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(repeat_penalty=1.1, frequency_penalty=0.1, logit_bias={1: -math.inf}, seed=1),
        SamplingParams(top_k=0, seed=2),
        SamplingParams(top_k=0, min_p=0.0, seed=3),
    ],
    ids=["defaults+penalties", "no-top-k", "no-top-k-no-min-p"],
)
def test_draws_on_the_full_gemma_vocab_come_from_the_reference_kept_set(params: SamplingParams) -> None:
    """The fast paths on a 262,144-token vocabulary with a full penalty window (the per-token time is
    measured by scripts/bench_text.py): every draw is a token the plain reference chain keeps."""
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(GEMMA_VOCAB) * 3).astype(np.float32)
    sampler = Sampler(params, GEMMA_VOCAB)
    for token in rng.integers(0, GEMMA_VOCAB, 64):
        sampler.accept(int(token))
    kept = _reference_kept(sampler.adjust(logits), params)
    draws = {sampler.sample(logits) for _ in range(30)}
    assert draws <= kept
    assert len(draws) > 1, "the draws are random, not the argmax every time"


def _reference_kept(logits: np.ndarray, params: SamplingParams) -> set[int]:
    """llama.cpp's chain written out plainly: full sort, top-k, top-p, then min-p."""
    ids = np.lexsort((np.arange(logits.size), -logits))
    if 0 < params.top_k < logits.size:
        ids = ids[: params.top_k]
    if params.top_p < 1:
        values = logits[ids].astype(np.float64)
        cumulative = np.cumsum(np.exp(values - values.max()))
        cumulative /= cumulative[-1]
        ids = ids[: int(np.searchsorted(cumulative, params.top_p, side="left")) + 1]
    if params.min_p > 0:
        threshold = np.float32(float(logits[ids].max()) + math.log(params.min_p))
        ids = ids[logits[ids] >= threshold]
    return set(ids.tolist())


def test_kept_set_matches_plain_reference_chain() -> None:
    rng = np.random.default_rng(11)
    for _ in range(120):
        n = int(rng.choice([50, 3000, 70_000]))
        logits = (rng.standard_normal(n) * float(rng.choice([0.1, 1.0, 3.0, 10.0]))).astype(np.float32)
        if rng.random() < 0.3:
            logits = np.round(logits)  # many ties, also at the cuts
        params = SamplingParams(
            top_k=int(rng.choice([0, 1, 5, 40, 2000])),
            top_p=float(rng.choice([1.0, 0.0, 0.5, 0.9, 0.95])),
            min_p=float(rng.choice([0.0, 0.05, 0.3])),
        )
        kept = Sampler(params, n).post_sampling_probs(logits, n)
        assert {token for token, _ in kept} == _reference_kept(logits, params), params


def test_post_sampling_probs_apply_temperature_over_kept_set() -> None:
    logits = _logits_from_probs([0.5, 0.3, 0.15, 0.05], n_vocab=8)
    probs = Sampler(_open(top_k=2, temperature=1.0), 8).post_sampling_probs(logits, 5)
    assert [t for t, _ in probs] == [0, 1]
    assert [p for _, p in probs] == pytest.approx([0.625, 0.375])
    hot = Sampler(_open(top_k=2, temperature=2.0), 8).post_sampling_probs(logits, 1)
    assert hot[0][1] == pytest.approx(math.sqrt(0.5) / (math.sqrt(0.5) + math.sqrt(0.3)))
    greedy = Sampler(SamplingParams(temperature=0.0), 8).post_sampling_probs(logits, 3)
    assert greedy == [(0, 1.0)]  # llama-server leaves out zero probabilities
