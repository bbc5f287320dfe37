"""The full sampler chain: its settings, the general path against the fast one, seeds, speculative
verification and the post-sampling view, on synthetic logits (llama.cpp's own outputs are compared in
tests/test_sampler_goldens.py)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import numpy as np
import pytest

from engine.api import GenerationRequest
from engine.engine import Engine, EngineConfig
from engine.llm import LLM
from engine.sampling import Sampler, SamplingParams, parse_samplers, stages
from engine.sampling.default_chain import takes_fast_path
from engine.sampling.dry import Breakers, Dry, suffix_matches
from engine.speculative import SpecParams
from engine.speculative.block import ReplayDrafter
from tests.test_speculative import PROMPTS, FreeDrafts, chat, chi_square_p, generate, tokens

GEMMA_VOCAB = 262_144


def test_sampler_orders_take_llama_servers_names_aliases_and_letters() -> None:
    assert parse_samplers(["Top_K", "top-p", "minp", "nucleus", "temp", "typ", "xtc"]) == (
        "top_k",
        "top_p",
        "min_p",
        "top_p",
        "temperature",
        "typ_p",
        "xtc",
    )
    assert parse_samplers("edskypmxt") == SamplingParams().samplers
    with pytest.raises(ValueError, match="unknown sampler 'bogus'"):
        parse_samplers(["top_k", "bogus"])
    with pytest.raises(ValueError, match="unknown sampler letter 'q'"):
        parse_samplers("kq")
    with pytest.raises(ValueError, match="'infill' sampler is not supported"):
        parse_samplers(["infill"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("typical_p", -0.1),
        ("xtc_probability", 1.5),
        ("xtc_threshold", -1.0),
        ("dynatemp_range", -1.0),
        ("dry_base", 0.5),
        ("dry_penalty_last_n", -2),
        ("dry_allowed_length", -1),
        ("mirostat", 3),
        ("mirostat_tau", -1.0),
        ("min_keep", -1),
        ("top_n_sigma", math.inf),
        ("top_p", math.nan),
    ],
)
def test_out_of_range_settings_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_the_fast_path_is_taken_only_for_the_default_chain() -> None:
    assert takes_fast_path(SamplingParams())
    assert takes_fast_path(SamplingParams(repeat_penalty=1.1, samplers=parse_samplers("kt")))
    assert takes_fast_path(SamplingParams(typical_p=1.0, xtc_threshold=0.9, xtc_probability=0.5))  # both off
    assert not takes_fast_path(SamplingParams(samplers=parse_samplers("tk")))  # temperature first
    assert not takes_fast_path(SamplingParams(min_keep=1))
    assert not takes_fast_path(SamplingParams(dynatemp_range=0.5))
    assert not takes_fast_path(SamplingParams(mirostat=2))
    assert not takes_fast_path(SamplingParams(typical_p=0.9))


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"top_k": 0},
        {"top_k": 0, "min_p": 0.0},
        {"top_k": 0, "top_p": 0.5, "min_p": 0.0},
        {"top_k": 200, "temperature": 1.7, "repeat_penalty": 1.3, "presence_penalty": 0.5},
        {"temperature": 0.0},
    ],
    ids=["defaults", "no-top-k", "top-p-only", "top-p-half", "penalties", "greedy"],
)
def test_the_general_chain_equals_the_fast_path_on_the_gemma_vocab(fields: dict) -> None:
    """min_keep 1 changes nothing (every cut keeps one token) but takes the stage-by-stage path."""
    rng = np.random.default_rng(21)
    logits = (rng.standard_normal(GEMMA_VOCAB) * 3).astype(np.float32)
    history = rng.integers(0, GEMMA_VOCAB, 64)
    fast, general = (
        Sampler(SamplingParams(**fields), GEMMA_VOCAB),
        Sampler(SamplingParams(**fields, min_keep=1), GEMMA_VOCAB),
    )
    assert not takes_fast_path(general.params)
    for token in history:
        fast.accept(int(token))
        general.accept(int(token))
    a, b = fast.distribution(logits), general.distribution(logits)
    top_a, top_b = dict(a.top(GEMMA_VOCAB)), dict(b.top(GEMMA_VOCAB))
    assert top_a.keys() == top_b.keys()
    np.testing.assert_allclose([top_a[t] for t in top_a], [top_b[t] for t in top_a], rtol=1e-5, atol=1e-9)


CHAINS = {
    "xtc+typical+dynatemp": {
        "xtc_probability": 0.5,
        "xtc_threshold": 0.05,
        "typical_p": 0.9,
        "dynatemp_range": 0.5,
    },
    "top-n-sigma, no top-k": {"top_n_sigma": 1.5, "top_k": 0, "min_p": 0.0},
    "reordered": {"samplers": ("temperature", "min_p", "top_k"), "temperature": 1.5, "min_p": 0.2},
    "mirostat 1": {"mirostat": 1, "temperature": 1.0},
    "mirostat 2": {"mirostat": 2, "temperature": 1.0, "mirostat_tau": 3.0},
    "dry": {"dry_multiplier": 1.0, "dry_sequence_breakers": ()},
}


@pytest.mark.parametrize("fields", CHAINS.values(), ids=CHAINS.keys())
def test_seeded_runs_repeat_and_seeds_differ(fields: dict) -> None:
    rng = np.random.default_rng(8)
    steps = [(rng.standard_normal(4096) * 2).astype(np.float32) for _ in range(48)]

    def run(seed: int) -> list[int]:
        sampler = Sampler(SamplingParams(**fields, seed=seed), 4096)
        picks = []
        for logits in steps:
            picks.append(sampler.sample(logits))
            sampler.accept(picks[-1])
        return picks

    assert run(42) == run(42)
    assert run(42) != run(43)


@pytest.mark.parametrize("fields", CHAINS.values(), ids=CHAINS.keys())
def test_drafts_change_no_seeded_pick(fields: dict) -> None:
    """Verification draws as if there were no draft (llama.cpp's sample-and-compare), so a seeded run
    gives the same tokens whatever was drafted."""
    rng = np.random.default_rng(9)
    steps = [(rng.standard_normal(512) * 2).astype(np.float32) for _ in range(40)]
    plain, drafted = (
        Sampler(SamplingParams(**fields, seed=5), 512),
        Sampler(SamplingParams(**fields, seed=5), 512),
    )
    for i, logits in enumerate(steps):
        token = plain.sample(logits)
        assert drafted.sample(logits, draft=(i * 37) % 512) == token
        plain.accept(token)
        drafted.accept(token)


def test_a_draft_keeps_the_distribution_of_a_stochastic_chain() -> None:
    """XTC fires half the time: the picks under a draft follow the mixture of its two distributions."""
    logits = np.log(np.array([0.40, 0.20, 0.15, 0.10, 0.06, 0.04, 0.03, 0.02], np.float32))
    fields = {
        "temperature": 1.2,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "xtc_threshold": 0.12,
        "typical_p": 0.95,
    }
    expected = np.zeros(8)
    for chance, weight in ((1.0, 0.5), (0.0, 0.5)):
        for token, p in Sampler(SamplingParams(**fields, xtc_probability=chance), 8).post_sampling_probs(
            logits, 8
        ):
            expected[token] += weight * p
    sampler = Sampler(SamplingParams(**fields, xtc_probability=0.5, seed=3), 8)
    counts = np.bincount([sampler.sample(logits, draft=0) for _ in range(20_000)], minlength=8)
    assert expected[0] < 0.4  # XTC really removed the best token in part of the draws
    assert chi_square_p(counts, expected * 20_000) > 0.01


def test_a_draft_keeps_mirostats_distribution() -> None:
    """Mirostat's first step, over 8,000 seeds, with a draft in hand: the distribution mu allows."""
    logits = (np.random.default_rng(10).standard_normal(64) * 2).astype(np.float32)
    params = SamplingParams(mirostat=2, mirostat_tau=3.0, temperature=1.0)
    expected = np.zeros(64)
    for token, p in Sampler(params, 64).distribution(logits).top(64):
        expected[token] = p
    picks = [
        Sampler(SamplingParams(mirostat=2, mirostat_tau=3.0, temperature=1.0, seed=s), 64).sample(logits, 3)
        for s in range(8000)
    ]
    counts = np.bincount(picks, minlength=64)
    assert counts[expected == 0].sum() == 0
    assert chi_square_p(counts, expected * 8000) > 0.01


def test_mirostat_at_zero_surprise_is_greedy() -> None:
    rng = np.random.default_rng(12)
    sampler = Sampler(SamplingParams(mirostat=2, mirostat_tau=0.0, temperature=1.0, seed=1), 1000)
    for _ in range(20):
        logits = rng.standard_normal(1000).astype(np.float32)
        assert sampler.sample(logits) == int(np.argmax(logits))
        assert sampler.last is not None and sampler.last.top(5) == [(int(np.argmax(logits)), 1.0)]


def test_post_sampling_view_is_the_distribution_drawn_from() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    sampler = Sampler(
        SamplingParams(
            temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=1.0, xtc_threshold=0.2, seed=4
        ),
        4,
    )
    token = sampler.sample(logits)
    assert sampler.last is not None
    top = sampler.last.top(4)
    # XTC removed 0.5 (more likely than 0.3, the least likely above the threshold): 0.3, 0.15, 0.05 left
    assert [t for t, _ in top] == [1, 2, 3]
    assert [p for _, p in top] == pytest.approx([0.6, 0.3, 0.1], abs=1e-6)
    assert token in (1, 2, 3) and sampler.last.prob(token) > 0 and sampler.last.prob(0) == 0


def test_min_keep_holds_every_cut_open() -> None:
    logits = np.log(np.array([0.9, 0.05, 0.03, 0.01, 0.01], np.float32))
    for fields in ({"top_p": 0.5}, {"min_p": 0.5}, {"typical_p": 0.01}):
        params = SamplingParams(**{"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, **fields})
        assert len(Sampler(params, 5).post_sampling_probs(logits, 5)) == 1
        wide = replace(params, min_keep=3)
        assert len(Sampler(wide, 5).post_sampling_probs(logits, 5)) == 3


def test_dynamic_temperature_with_exponent_zero_is_the_top_of_its_range() -> None:
    logits = (np.random.default_rng(13).standard_normal(100) * 2).astype(np.float32)
    base = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
    dynamic = Sampler(SamplingParams(**base, temperature=1.0, dynatemp_range=0.6, dynatemp_exponent=0.0), 100)
    fixed = Sampler(SamplingParams(**base, temperature=1.6), 100)
    a, b = dict(dynamic.post_sampling_probs(logits, 100)), dict(fixed.post_sampling_probs(logits, 100))
    assert a.keys() == b.keys()
    assert [a[t] for t in a] == pytest.approx([b[t] for t in a], rel=1e-5)


def test_a_stage_left_out_of_samplers_does_nothing() -> None:
    logits = (np.random.default_rng(14).standard_normal(50)).astype(np.float32)
    params = SamplingParams(
        temperature=5.0, top_k=1, samplers=("top_p", "min_p"), top_p=1.0, min_p=0.0, seed=2
    )
    sampler = Sampler(params, 50)
    draws = {sampler.sample(logits) for _ in range(500)}
    assert len(draws) > 5  # neither top-k 1 nor temperature acted
    probs = dict(sampler.post_sampling_probs(logits, 50))
    reference = np.exp(logits.astype(np.float64) - logits.max())
    assert probs[int(np.argmax(logits))] == pytest.approx(reference.max() / reference.sum(), rel=1e-5)


@pytest.mark.parametrize("fields", CHAINS.values(), ids=CHAINS.keys())
def test_every_chain_draws_from_its_distribution_on_the_gemma_vocab(fields: dict) -> None:
    rng = np.random.default_rng(15)
    logits = (rng.standard_normal(GEMMA_VOCAB) * 3).astype(np.float32)
    sampler = Sampler(SamplingParams(**fields, seed=6), GEMMA_VOCAB)
    for token in rng.integers(0, GEMMA_VOCAB, 64):
        sampler.accept(int(token))
    for _ in range(10):
        token = sampler.sample(logits)
        assert sampler.last is not None and sampler.last.prob(token) > 0


# -- DRY ------------------------------------------------------------------------------------------------


def naive_suffix_matches(tokens: np.ndarray) -> np.ndarray:
    z = np.zeros(tokens.size, np.int64)
    for k in range(1, tokens.size):
        while k + z[k] < tokens.size and tokens[z[k]] == tokens[k + z[k]]:
            z[k] += 1
    return z


def test_the_z_function_kernel_matches_its_reference() -> None:
    rng = np.random.default_rng(16)
    for size, alphabet in ((1, 2), (2, 1), (50, 2), (300, 3), (1000, 40), (64, 1)):
        tokens = rng.integers(0, alphabet, size).astype(np.int64)
        assert suffix_matches(tokens).tolist() == naive_suffix_matches(tokens).tolist()


def test_dry_penalises_what_would_extend_a_repeat() -> None:
    """History a b c a b: c would make 'a b c' again (length 2 > allowed 1); a breaker token stops it."""
    params = SamplingParams(dry_multiplier=2.0, dry_base=3.0, dry_allowed_length=1, dry_penalty_last_n=-1)
    dry = Dry(params, Breakers({}))
    for token in (1, 2, 3, 1, 2):
        dry.accept(token)
    found = dry.penalties()
    assert found is not None
    assert found[0].tolist() == [3] and found[1].tolist() == [pytest.approx(2.0 * 3.0)]
    # 1 2 9 3 1 2 9 3: "1 2 9 3" repeats, so 1 would extend a 4-token repeat (2 * 3^3); with 9 a
    # breaker the repeat may only reach back to it ("3", 2 * 3^0).
    history = (1, 2, 9, 3, 1, 2, 9, 3)
    for breakers, amount in ((Breakers({}), 54.0), (Breakers({9: ((),)}), 2.0)):
        dry = Dry(params, breakers)
        for token in history:
            dry.accept(token)
        found = dry.penalties()
        assert found is not None and found[0].tolist() == [1] and found[1].tolist() == [amount]
    long = Dry(SamplingParams(dry_multiplier=1.0, dry_penalty_last_n=-1), Breakers({}))
    window = Dry(SamplingParams(dry_multiplier=1.0, dry_penalty_last_n=100_000), Breakers({}))
    for token in np.random.default_rng(17).integers(0, 5, 3000):
        long.accept(int(token))
        window.accept(int(token))
    a, b = long.penalties(), window.penalties()
    assert a is not None and b is not None
    assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()


def test_dry_needs_the_vocabulary_for_its_breakers() -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        Sampler(SamplingParams(dry_multiplier=0.8), 100)
    Sampler(SamplingParams(dry_multiplier=0.8, dry_sequence_breakers=()), 100)  # none: nothing to look up


LONG_LISTS = {
    "typical 0.9": {"typical_p": 0.9},
    "typical 0.3": {"typical_p": 0.3},
    "xtc 0.01": {"xtc_probability": 1.0, "xtc_threshold": 0.01},
    "dynatemp": {"dynatemp_range": 0.5},
    "top-p 0.9": {"top_p": 0.9},
}


@pytest.mark.parametrize("fields", LONG_LISTS.values(), ids=LONG_LISTS.keys())
def test_long_lists_skip_the_sort_but_keep_the_same_distribution(
    fields: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a whole 262k vocabulary the stages cut by buckets instead of sorting (engine/sampling/
    stages.py). The reference is the same stage with the LONG limit raised, which sorts as llama.cpp
    does. llama.cpp normalises in float32, summing 262k terms in sorted order (the reference) where the
    long path sums them in id order, ~1e-4 apart relative, and the buckets accumulate the mass in
    float64: a cut among ~1,300 tokens of ~1e-5 each can move by a few of them. What differs holds
    under 0.1% of the mass; the probabilities of the rest agree within that float32 rounding."""
    rng = np.random.default_rng(18)
    logits = (rng.standard_normal(GEMMA_VOCAB) * 4).astype(np.float32)
    logits[rng.integers(0, GEMMA_VOCAB, 5)] += 12  # a few likely tokens, as a model's logits have
    params = SamplingParams(**{"top_k": 0, "top_p": 1.0, "min_p": 0.0, "min_keep": 1, **fields, "seed": 1})
    fast = dict(Sampler(params, GEMMA_VOCAB).distribution(logits).top(GEMMA_VOCAB))
    monkeypatch.setattr(stages, "LONG", 10**9)
    sorted_ = dict(Sampler(params, GEMMA_VOCAB).distribution(logits).top(GEMMA_VOCAB))
    assert sum(fast.get(t, 0) + sorted_.get(t, 0) for t in fast.keys() ^ sorted_.keys()) < 1e-3
    assert len(fast.keys() & sorted_.keys()) > 0.98 * len(sorted_)
    common = sorted(fast.keys() & sorted_.keys())
    np.testing.assert_allclose([fast[t] for t in common], [sorted_[t] for t in common], rtol=1e-3, atol=1e-9)


def test_a_seeded_sampled_reply_is_the_same_with_drafts(smollm2_llm: LLM) -> None:
    """The engine verifying drafts inside its batches (a replaying drafter that knows the plain reply,
    spoiled every third token) for a seeded non-default chain at temperature 1: the same tokens as the
    run without drafts, some drafts accepted and some refused."""
    prompt = chat(smollm2_llm, PROMPTS[1])
    params = SamplingParams(temperature=1.0, seed=77, xtc_probability=0.3, dynatemp_range=0.3, typical_p=0.95)
    runs = []
    for spec in (None, SpecParams(("replay",), n_max=6)):
        engine = Engine(smollm2_llm, EngineConfig(n_slots=2, n_ctx=1024))
        if spec is not None:
            engine.scheduler.speculation.speculators["replay"] = ReplayDrafter(prompt, runs[0], 3)
            engine.scheduler.drafts.policy.costs = FreeDrafts()  # every draft verified, whatever the CPU
        engine.start()
        try:
            request = GenerationRequest(prompt, params, 48, speculative=spec, cache_prompt=False)
            (events,) = asyncio.run(generate(engine, [request]))
        finally:
            engine.stop()
        runs.append(tokens(events))
    assert runs[1] == runs[0]
    timings = events[-1].timings
    assert timings is not None and 0 < timings.draft_n_accepted < timings.draft_n
